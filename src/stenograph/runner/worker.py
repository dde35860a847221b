"""The lease a worker (record, resume) holds on its store while its program runs.

Renewed by a heartbeat (``recorder/leases.py``); when another worker takes the trajectory
over (this one was paused past its lease), the program is killed at once and the run ends
fenced (exit 8). With ``--db`` the lease is the trajectory's row in PostgreSQL too
(``warm/leases.py``), and the worker ships its store to the warm tier as it commits, so
another host can take the trajectory over (``resume --db``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import StoreFenced
from stenograph.recorder.leases import Heartbeat, LocalLeases
from stenograph.recorder.reader import is_store
from stenograph.recorder.store import init_store
from stenograph.runner.lines import fenced_line


class Worker:
    """This worker's lease on ``traj`` at ``epoch``, renewed until ``close``."""

    def __init__(self, store: Path, traj: str, epoch: int, ttl: float,
                 db: str | None = None, blobs: str | None = None) -> None:
        if not is_store(store):  # the lease lives in the store: make it first
            init_store(store)
        self.store = store
        self.leases: Any = LocalLeases(store)
        if db is not None:  # the fleet's row decides, the store's file follows
            from stenograph.warm.leases import FleetLeases, PgLeases
            from stenograph.warm.ship import store_id

            self.leases = FleetLeases(self.leases, PgLeases(db, store_id(store)))
        try:
            self.lease = self.leases.acquire(traj, epoch, ttl)
        except BaseException:
            if db is not None:
                self.leases.close()
            raise
        self.proc: Any = None
        self.lost_to: Any = None
        self.heartbeat = Heartbeat(self.leases, self.lease, ttl, self._lost)
        self.following: Any = None
        if db is not None:  # the store's events go to the warm tier as they commit
            from stenograph.warm.objects import ObjectStore
            from stenograph.warm.ship import Following

            try:
                self.following = Following(store, db, ObjectStore(blobs) if blobs else None)
            except BaseException:
                self.close()
                raise

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def started(self, proc: Any) -> None:
        """The program's process: killed if the lease is lost."""
        self.proc = proc

    def _lost(self, now: Any) -> None:
        self.lost_to = now
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()

    def fenced(self, *, look: bool = False) -> StoreFenced | None:
        """The error to end with if the lease was lost, else None (``look``: read the
        lease now rather than wait for the heartbeat to find out: the host recorder
        refused a write of this worker's)."""
        who = self.lost_to
        if not self.heartbeat.is_lost:
            if not look or self.leases.holds(self.lease):
                return None
            who = self.leases.current(self.lease.traj)
        by = f" by pid {who.pid} on {who.host} at epoch {who.epoch}" if who else ""
        return StoreFenced(fenced_line(
            str(self.store), self.lease.traj, f"lost the lease on {self.lease.traj}: taken "
            f"over{by} while this worker was not renewing it; this worker stopped"), None)

    def drain_asked(self) -> bool:
        """``--db``: has ``stenograph drain`` asked for this trajectory (asked at each model
        turn, the point a drained worker stops at)?"""
        if self.following is None:
            return False
        try:
            return bool(self.leases.draining(self.lease))
        except OSError:  # (the warm tier out of reach: go on)
            return False

    def intent_barrier(self) -> None:
        """``--db``: an effect's intent, durable in the store, is in the warm tier before
        the effect leaves (``Following.ship_now``)."""
        if self.following is not None:
            self.following.ship_now()

    @property
    def ship_error(self) -> str | None:
        """Why the warm tier did not get everything (``--db``), if it did not."""
        return self.following.error if self.following is not None else None

    def close(self) -> None:
        if self.following is not None:
            self.following.close()  # the last pass, under the lease still
        self.heartbeat.close()
        if hasattr(self.leases, "close"):
            self.leases.close()
