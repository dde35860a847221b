"""Checkpoints: workspace snapshots at the moments a recording may need to resume from.

A ``Checkpoint`` event names a snapshot (``recorder/snapshots.py``) and the point of the
run it belongs to: ``at`` = ``start`` (before the program ran), ``turn`` (the program
sent its ``turn``-th model request -- taken while the recorder holds the reply back, so
nothing the program does next is in it), ``effect`` (an effect is about to be
dispatched: taken before its intent is written) or ``end`` (the tree exited); ``times``
is not a snapshot but a turn's changed mtimes, by metadata only. It is appended,
durable, only after the snapshot's blobs and manifest are: a checkpoint the log names
is always whole, and one killed halfway leaves only unnamed blobs (``stenograph gc``).

Which turns get one: every ``Cadence`` interval (Daly's optimum over the measured cost
of an incremental snapshot and the mean turn, for ``--mtbf``), or every
``--checkpoint-every`` turns. A turn without one is still reachable: a replay stopped
at that model request sees the files as they were (``checkpoint restore --at N``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.blobs import BlobRef
from stenograph.recorder.snapshots import Cadence, Snapshotter, Taken

TIMES_MAX_S = 0.25
"""A turn's metadata walk (``Checkpointer._times``) that took longer stops them."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A ``Checkpoint`` event's body, as read back."""

    index: int
    at: str
    turn: int
    lsn: int
    covers_lsn: int
    snapshot: BlobRef
    files: int
    bytes_added: int
    proc: str | None = None
    pos: int | None = None

    @classmethod
    def from_event(cls, index: int, lsn: int, body: dict[str, Any]) -> CheckpointInfo:
        return cls(index, str(body.get("at", "?")), int(body.get("turn", 0)), lsn,
                   int(body.get("covers_lsn", lsn)), BlobRef.from_body(body["snapshot"]),
                   int(body.get("files", 0)), int(body.get("bytes_added", 0)),
                   body.get("proc"), body.get("pos"))


class Checkpointer:
    """Takes the run's snapshots and appends their ``Checkpoint`` events."""

    def __init__(self, store: Any, traj: str, snapshotter: Snapshotter,
                 cadence: Cadence) -> None:
        self.store = store
        self.traj = traj
        self.snap = snapshotter
        self.cadence = cadence
        self.turns = 0
        self.taken: list[Taken] = []
        self.errors: list[str] = []
        self.times_seconds = 0.0
        self._lock = threading.Lock()

    def _take(self, at: str, covers_lsn: int, proc: str | None = None,
              pos: int | None = None) -> Taken:
        t = self.snap.take()
        self.store.append(self.traj, "Checkpoint", {
            "at": at, "turn": self.turns, "covers_lsn": covers_lsn,
            "snapshot": t.ref.to_body(), "proc": proc, "pos": pos, "files": t.files,
            "bytes_added": t.bytes_added, "full": t.full, "seconds": round(t.seconds, 6),
        }, durable=True)
        self.taken.append(t)
        return t

    def start(self, covers_lsn: int) -> Taken:
        """Before the program starts (errors reach the caller: the run must not begin)."""
        with self._lock:
            t = self._take("start", covers_lsn)
            self.cadence.took(t.seconds)
            return t

    def model_turn(self, proc: str, pos: int, lsn: int) -> None:
        """A model exchange is durable and its reply not yet handed over: a turn ended."""
        with self._lock:
            self.turns += 1
            if not self.cadence.turn():
                self._times(proc, pos)
                return
            try:
                t = self._take("turn", lsn, proc, pos)
            except Exception as exc:  # the run goes on without this checkpoint
                self.errors.append(f"checkpoint at turn {self.turns}: "
                                   f"{type(exc).__name__}: {exc}")
                return
            if not t.full:
                self.cadence.took(t.seconds)

    def _times(self, proc: str, pos: int) -> None:
        """A turn without a checkpoint: its files' mtimes, by a stat walk (``at`` =
        ``times``; ``checkpoint restore`` gives them back). Skipped once a walk costs
        more than ``TIMES_MAX_S``: the restore then says which mtimes it cannot give."""
        if self.times_seconds > TIMES_MAX_S:
            return
        t0 = time.perf_counter()
        try:
            delta = self.snap.times()
        except Exception as exc:  # the run goes on; restore says what it lacks
            self.errors.append(f"file times at turn {self.turns}: {type(exc).__name__}: {exc}")
            return
        self.times_seconds = time.perf_counter() - t0
        # queued: durable with the next sync (it cost an fdatasync per model turn); a crash
        # before it leaves a gap the restore names
        self.store.queue(self.traj, "Checkpoint", {
            "at": "times", "turn": self.turns, "proc": proc, "pos": pos, "times": delta,
            "seconds": round(self.times_seconds, 6)})

    def before_effect(self) -> None:
        """An effect is about to be dispatched: the files it may change, as they are
        (a forced checkpoint: resume restores it, whatever the cadence)."""
        self._forced("effect", "before an effect")

    def at_approval(self) -> None:
        """The run pauses for an approval: the files as the person will judge them."""
        self._forced("approval", "at an approval")

    def _forced(self, at: str, what: str) -> None:
        with self._lock:
            try:
                self._take(at, self.store.synced_lsn)
            except Exception as exc:  # the caller's own event decides what happens
                self.errors.append(f"checkpoint {what} at turn {self.turns}: "
                                   f"{type(exc).__name__}: {exc}")

    def end(self, covers_lsn: int) -> None:
        """The program's tree exited."""
        with self._lock:
            try:
                self._take("end", covers_lsn)
            except Exception as exc:
                self.errors.append(f"checkpoint at the end: {type(exc).__name__}: {exc}")


def times_at(events: Any, turn: int, manifest_of: Any) -> dict[str, dict[str, int]] | None:
    """Every entry's mtime when the program sent its ``turn``-th model request, from the
    last snapshot before it and the ``times`` records after that (``manifest_of``: a
    snapshot reference -> its ``Manifest``); None when a turn on the way has no times
    record (skipped as too costly, or recorded before they existed)."""
    mtimes: dict[str, dict[str, int]] | None = None
    want = 0  # the next turn whose times record the chain needs
    for ev in events:
        if ev.kind != "Checkpoint" or not isinstance(ev.body, dict):
            continue
        b = ev.body
        t = int(b.get("turn", 0) or 0)
        if "snapshot" in b:
            if b.get("at") in ("end", "pre-resume") or (t >= turn and b.get("at") != "start"):
                continue
            m = manifest_of(BlobRef.from_body(b["snapshot"]))
            mtimes = {root: {e.path: e.mtime_ns for e in tree.values()}
                      for root, tree in m.trees.items()}
            want = t + 1
        elif b.get("at") == "times" and mtimes is not None and t <= turn:
            if t != want:
                mtimes = None  # a gap: what changed in it is not known
                continue
            for root, delta in (b.get("times") or {}).items():
                tree = mtimes.setdefault(str(root), {})
                for rel, mt in delta.items():
                    if isinstance(mt, int):
                        tree[str(rel)] = mt
                    else:
                        tree.pop(str(rel), None)
            want = t + 1
            if t == turn:
                return mtimes
    return None


def checkpoints_of(events: Any) -> list[CheckpointInfo]:
    """The ``Checkpoint`` events of a trajectory, in order."""
    out: list[CheckpointInfo] = []
    for ev in events:
        if ev.kind == "Checkpoint" and isinstance(ev.body, dict) and "snapshot" in ev.body:
            out.append(CheckpointInfo.from_event(len(out), ev.lsn, ev.body))
    return out
