"""Leases: which worker may write a store now, for how long, and under which epoch.

A worker (``record``, ``resume``) holds the store's lease while it runs: the trajectory,
the fencing epoch its effects carry, its pid and host, and an expiry it pushes forward
every ``ttl / 3`` (``Heartbeat``). A worker that stops renewing -- killed, or paused
past its lease (SIGSTOP, a frozen VM) -- loses it once it expires, and another may
take the trajectory over with the next epoch. The one that lost it finds out at its
next renewal, or at its next write to the store (``Store`` in shared mode refuses a
writer that is no longer the last one: ``StoreFenced``), and a service that checks
fencing tokens (``stenograph.fencing.Gate``) refuses anything it still sends.

Leases are per trajectory: any number of trajectories of a store run at once. The
interface is small on purpose (``acquire``, ``renew``, ``release``, ``current``), so a
fleet puts it on PostgreSQL (``warm/leases.py``: a row per trajectory) beside these
files: ``STORE/leases/<traj>.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import StoreLocked

DEFAULT_TTL = 30.0
"""Seconds a lease lasts without renewal (``--lease-ttl``)."""


@dataclass(frozen=True)
class Lease:
    traj: str
    epoch: int
    pid: int
    host: str
    token: str
    expires_at: float

    def live(self, now: float | None = None) -> bool:
        return self.expires_at > (time.time() if now is None else now)


class LocalLeases:
    """The leases of a store's trajectories: ``STORE/leases/<traj>.json`` each, changed
    under an ``flock`` of ``STORE/leases/.lock``, written to a temporary name and renamed.
    Any number of trajectories of one store may be live at once, each held by its own
    worker (a store made by an older build may hold one lease, ``STORE/LEASE``: it is read
    as the lease of its trajectory)."""

    def __init__(self, store: str | Path) -> None:
        self.store = Path(store)
        self.dir = self.store / "leases"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _path(self, traj: str) -> Path:
        return self.dir / f"{traj}.json"

    @staticmethod
    def _read(path: Path) -> Lease | None:
        try:
            doc = json.loads(path.read_text())
            return Lease(**{k: doc[k] for k in Lease.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def current(self, traj: str) -> Lease | None:
        """``traj``'s lease as written (live or not); None if there never was one."""
        lease = self._read(self._path(traj))
        if lease is None:
            legacy = self._read(self.store / "LEASE")
            if legacy is not None and legacy.traj == traj:
                return legacy
        return lease

    def all(self) -> list[Lease]:
        """Every trajectory's lease as written."""
        out = []
        with contextlib.suppress(OSError):
            for p in sorted(self.dir.glob("*.json")):
                lease = self._read(p)
                if lease is not None:
                    out.append(lease)
        legacy = self._read(self.store / "LEASE")
        if legacy is not None and not any(x.traj == legacy.traj for x in out):
            out.append(legacy)
        return out

    def _write(self, lease: Lease) -> None:
        tmp = self.dir / f".{lease.traj}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(lease)))
        os.replace(tmp, self._path(lease.traj))

    def acquire(self, traj: str, epoch: int, ttl: float = DEFAULT_TTL,
                token: str | None = None) -> Lease:
        """Take ``traj`` at ``epoch`` (at least one above its lease's own), under
        ``token`` (new if None: ``FleetLeases`` passes its row's).
        ``StoreLocked`` while another worker's lease on it is live."""
        with self._locked():
            cur = self.current(traj)
            if cur is not None and cur.live() and not gone(cur):
                left = cur.expires_at - time.time()
                raise StoreLocked(f"{cur.traj} is held by pid {cur.pid} on {cur.host} at "
                                  f"epoch {cur.epoch} (its lease runs {left:.0f}s more)",
                                  str(self.store))
            if cur is not None:
                epoch = max(epoch, cur.epoch + 1)
            lease = Lease(traj, epoch, os.getpid(), os.uname().nodename,
                          token or secrets.token_hex(8), time.time() + ttl)
            self._write(lease)
            return lease

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease | None:
        """The lease pushed ``ttl`` on, or None if it is no longer this worker's."""
        with self._locked():
            cur = self.current(lease.traj)
            if cur is None or cur.token != lease.token:
                return None
            new = Lease(**{**asdict(cur), "expires_at": time.time() + ttl})
            self._write(new)
            return new

    def release(self, lease: Lease) -> None:
        with self._locked():
            cur = self.current(lease.traj)
            if cur is not None and cur.token == lease.token:
                self._write(Lease(**{**asdict(cur), "expires_at": 0.0}))

    def holds(self, lease: Lease) -> bool:
        """Is ``lease`` still its trajectory's (another worker has not taken it over)?"""
        cur = self.current(lease.traj)
        return cur is not None and cur.token == lease.token

    def held_by_other(self, traj: str | None = None) -> Lease | None:
        """A live lease of another process, on ``traj`` (or on any trajectory)."""
        for cur in [self.current(traj)] if traj is not None else self.all():
            if cur is not None and cur.live() and cur.pid != os.getpid() and not gone(cur):
                return cur
        return None


def gone(lease: Lease) -> bool:
    """A holder on this host that no longer exists cannot renew: its lease is over."""
    if lease.host != os.uname().nodename:
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Heartbeat:
    """Renews a lease every ``ttl / 3`` seconds; calls ``lost(current)`` once if it finds
    the lease taken (another worker's epoch), and stops."""

    def __init__(self, leases: Any, lease: Lease, ttl: float,
                 lost: Callable[[Lease | None], Any]) -> None:
        self.leases, self.lease, self.ttl, self.lost = leases, lease, ttl, lost
        self.is_lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steno-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                new = self.leases.renew(self.lease, self.ttl)
            except OSError:
                continue
            if new is None:
                self.is_lost = True
                self.lost(self.leases.current(self.lease.traj))
                return
            self.lease = new

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.is_lost:
            with contextlib.suppress(OSError):
                self.leases.release(self.lease)
