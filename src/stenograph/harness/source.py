"""A recording opened for reading: a ``.steno`` file or one trajectory of a store.

The trajectory view, the diff, the fork and the viewer all start from the same three
things: the header (a file's; a store's trajectory has none but its ``RunStarted``), the
events as their resumes left them (``recorder.resumes.view``), and a ``Bodies``
callable that reads a recorded body whether it is inline or in the blob store.
Nothing is written; a store is read without its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stenograph.harness.trajectory import Trajectory, build
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput
from stenograph.recorder.inputs import input_file
from stenograph.recorder.reader import StoreReader, is_store
from stenograph.recorder.resumes import view


@dataclass
class Recording:
    path: str
    traj: str
    header: dict[str, Any]
    events: list[Event]
    blobs: Any
    """A ``.steno`` file's embedded blobs (sha -> bytes) or a store's ``BlobStore``."""

    def body(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, dict) and "$blob" in value:
            ref = BlobRef.from_body(value)
            if isinstance(self.blobs, BlobStore):
                return self.blobs.get(ref)
            return bytes(self.blobs[ref.sha256])
        return b""

    def trajectory(self) -> Trajectory:
        return build(self.traj, self.header, self.events, self.body)

    @property
    def parent(self) -> dict[str, Any] | None:
        """The recording this one was forked from (``stenograph fork``), if any."""
        p = self.header.get("parent")
        if isinstance(p, dict):
            return p
        started = next((e.body for e in self.events if e.kind == "RunStarted"), {})
        p = started.get("parent") if isinstance(started, dict) else None
        return p if isinstance(p, dict) else None


def open_recording(path: str | Path, traj: str | None = None) -> Recording:
    """Read a ``.steno`` file (checked whole) or a store's trajectory ``traj`` (the only
    one when the store holds one). The caller has checked ``path`` is no FIFO
    (``recorder/inputs.input_file``)."""
    p = Path(path)
    if is_store(p):
        reader = StoreReader(p)
        names = sorted(reader.summary())
        if traj is None:
            if len(names) != 1:
                raise BadInput(f"the store holds {len(names)} trajectories; name one with "
                               f"--traj ({', '.join(names[:5])}{'...' if len(names) > 5 else ''})",
                               str(p))
            traj = names[0]
        elif traj not in names:
            raise BadInput(f"no trajectory {traj!r} in the store", str(p))
        events = view(reader.events(traj=traj))
        return Recording(str(p), traj, {"traj": traj}, events, BlobStore(p / "blobs"))
    from stenograph.recorder.trajfile import read_trajectory

    tf = read_trajectory(p, lazy_tape=True)  # the view needs the turns, not the tape
    if traj is not None and traj != tf.traj:
        raise BadInput(f"the file holds trajectory {tf.traj!r}, not {traj!r}", str(p))
    return Recording(str(p), tf.traj, tf.header, view(tf.events), tf.blobs)


def open_input(path: str, traj: str | None) -> Recording:
    """A recording named on a command line: a store, or a file checked as an input."""
    if not is_store(Path(path)):
        input_file(path)
    return open_recording(path, traj)
