"""The recorder's end of the Python-level tape (``interpose.pytape``).

Record: ``ExchangeServer`` listens on a unix ``SOCK_SEQPACKET`` socket; every
message is one finished call (HTTP exchange, model or tool call) as a msgpack
map. It is appended as an ``Exchange`` event and made durable before the one-byte
acknowledgement goes back, so the program never acts on a result the log could
lose.

Replay: ``prepare_py_tape`` turns a trajectory's ``Exchange`` events into the
per-process files the hooks serve from, and copies the blobs they reference.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.blobs import BlobStore, blob_refs
from stenograph.recorder.codec import Event
from stenograph.recorder.seqpacket import SeqpacketServer

MAX_MESSAGE = 1 << 20


class ExchangeServer:
    """Accepts exchange messages from every process of a recorded tree."""

    def __init__(self, store: Any, traj: str, sock_path: str | Path) -> None:
        self.store = store
        self.traj = traj
        self.count = 0
        self._lock = threading.Lock()
        self._server = SeqpacketServer(sock_path, self._handle, name="steno-exchanges",
                                       max_message=MAX_MESSAGE, stop_on_error=True)
        self.path = self._server.path
        self.errors = self._server.errors

    def _handle(self, conn: socket.socket, msg: bytes) -> None:
        body = msgpack.unpackb(msg, raw=False, strict_map_key=False)
        if not isinstance(body, dict):
            raise ValueError("exchange message is not a map")
        self.store.append(self.traj, "Exchange", body, durable=True)
        with self._lock:  # one thread per connected process
            self.count += 1
        conn.sendall(b"\x01")

    def close(self) -> None:
        self._server.close()


def prepare_py_tape(events: Iterable[Event], tape_dir: str | Path,
                    blobs: dict[str, bytes] | BlobStore | None = None) -> dict[str, int]:
    """Write ``tape_dir/py/<proc>.msgpack`` and ``tape_dir/blobs``; return counts per proc."""
    tape_dir = Path(tape_dir)
    by_proc: dict[str, dict[str, list[dict[str, Any]]]] = {}
    out_blobs = BlobStore(tape_dir / "blobs")
    for ev in events:
        if ev.kind != "Exchange":
            continue
        body = ev.body
        by_proc.setdefault(str(body["proc"]), {}).setdefault(str(body["channel"]), []).append(body)
        for ref in blob_refs(body):
            if out_blobs.has(ref.sha256):
                continue
            if isinstance(blobs, dict):
                data = blobs[ref.sha256]
            elif blobs is not None:
                data = blobs.get(ref)
            else:
                raise KeyError(f"blob {ref.sha256} referenced but no blobs were given")
            out_blobs.put(data)
    (tape_dir / "py").mkdir(parents=True, exist_ok=True)
    counts = {}
    for proc, channels in by_proc.items():
        for entries in channels.values():
            entries.sort(key=lambda e: e["pos"])
        (tape_dir / "py" / f"{proc}.msgpack").write_bytes(
            msgpack.packb(channels, use_bin_type=True))
        counts[proc] = sum(len(v) for v in channels.values())
    return counts
