"""A replay stopped at a model request, to see the files as they were there.

``stenograph checkpoint restore --at N`` for a turn no checkpoint was taken at replays
the recording, sealed, up to the program's N-th model request (``STENO_STOP_AT`` =
``proc:pos`` of that request on the model channel). There, before the request is
served, the process snapshots the workspace as it sees it -- the recorded start state
plus everything the replayed program wrote since, through the overlays -- into
``STENO_TAPE/stop`` with the recorded roots and rules, and ends. The caller restores
that snapshot; the replayed run itself is not compared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STOP_EXIT = 87
"""How a process ends at its stop point (the replay's verdict is not wanted)."""


def parse(spec: str | None) -> tuple[str, int] | None:
    if not spec or ":" not in spec:
        return None
    proc, _, pos = spec.rpartition(":")
    return (proc, int(pos)) if pos.isdigit() else None


def stop_here(tape_dir: str, shim: Any) -> None:
    """Snapshot the workspace into ``tape_dir/stop`` and end the process."""
    from stenograph.recorder.blobs import BlobStore
    from stenograph.recorder.snapshots import Snapshotter, recorded_rules

    stop = Path(tape_dir) / "stop"
    with shim.paused():
        rules = recorded_rules({"workspace": json.loads((stop / "spec.json").read_text())})
        taken = Snapshotter(BlobStore(stop / "blobs"), list(rules), rules).take()
        (stop / "manifest.json").write_text(json.dumps(taken.ref.to_body()))
    os._exit(STOP_EXIT)
