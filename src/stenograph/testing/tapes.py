"""What a recording's C tape holds, read back for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

from stenograph.recorder.chunks import chunk_data
from stenograph.recorder.tape import CHANNEL_IDS, iter_records, net_address
from stenograph.recorder.trajfile import read_trajectory

OP_NET_CONNECT = 1


def tape_connects(steno: Path) -> list[str]:
    """The peers of a ``.steno``'s taped connections (net channel connect records), in
    log order: ``127.0.0.1:8080``, ``unix /run/x.sock``."""
    net = CHANNEL_IDS["net"]
    peers: list[str] = []
    for ev in read_trajectory(steno).events:
        if ev.kind != "TapeChunk":
            continue
        peers += [net_address(p) for ch, op, p in iter_records(chunk_data(ev.body))
                  if ch == net and op == OP_NET_CONNECT]
    return peers
