"""Leases: which worker may write a store now, for how long, and under which epoch.

A worker (``record``, ``resume``) holds the store's lease while it runs: the trajectory,
the fencing epoch its effects carry, its pid and host, and an expiry it pushes forward
every ``ttl / 3`` (``Heartbeat``). A worker that stops renewing -- killed, or paused
past its lease (SIGSTOP, a frozen VM) -- loses it once it expires, and another may
take the trajectory over with the next epoch. The one that lost it finds out at its
next renewal, or at its next write to the store (``Store`` in shared mode refuses a
writer that is no longer the last one: ``StoreFenced``), and a service that checks
fencing tokens (``stenograph.fencing.Gate``) refuses anything it still sends.

The interface is small on purpose (``acquire``, ``renew``, ``release``, ``current``),
so a fleet can put it on PostgreSQL (a row per store, ``UPDATE ... WHERE token = $1``)
in place of this file: ``STORE/LEASE``, changed under an ``flock`` of
``STORE/LEASE.lock``, written to a temporary name and renamed.
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
    """The store's lease in ``STORE/LEASE``."""

    def __init__(self, store: str | Path) -> None:
        self.store = Path(store)
        self.path = self.store / "LEASE"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.store / "LEASE.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def current(self) -> Lease | None:
        """The lease as written (live or not); None if there never was one."""
        try:
            doc = json.loads(self.path.read_text())
            return Lease(**{k: doc[k] for k in Lease.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write(self, lease: Lease) -> None:
        tmp = self.path.with_name(f"LEASE.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(lease)))
        os.replace(tmp, self.path)

    def acquire(self, traj: str, epoch: int, ttl: float = DEFAULT_TTL) -> Lease:
        """Take the store for ``traj`` at ``epoch`` (at least one above the lease's own
        for that trajectory). ``StoreLocked`` while another worker's lease is live."""
        with self._locked():
            cur = self.current()
            if cur is not None and cur.live() and not _gone(cur):
                left = cur.expires_at - time.time()
                raise StoreLocked(f"{cur.traj} is held by pid {cur.pid} on {cur.host} at "
                                  f"epoch {cur.epoch} (its lease runs {left:.0f}s more)",
                                  str(self.store))
            if cur is not None and cur.traj == traj:
                epoch = max(epoch, cur.epoch + 1)
            lease = Lease(traj, epoch, os.getpid(), os.uname().nodename,
                          secrets.token_hex(8), time.time() + ttl)
            self._write(lease)
            return lease

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease | None:
        """The lease pushed ``ttl`` on, or None if it is no longer this worker's."""
        with self._locked():
            cur = self.current()
            if cur is None or cur.token != lease.token:
                return None
            new = Lease(**{**asdict(cur), "expires_at": time.time() + ttl})
            self._write(new)
            return new

    def release(self, lease: Lease) -> None:
        with self._locked():
            cur = self.current()
            if cur is not None and cur.token == lease.token:
                self._write(Lease(**{**asdict(cur), "expires_at": 0.0}))

    def held_by_other(self) -> Lease | None:
        """A live lease of another process (writers that hold none must not write)."""
        cur = self.current()
        if cur is None or not cur.live() or cur.pid == os.getpid() or _gone(cur):
            return None
        return cur


def _gone(lease: Lease) -> bool:
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

    def __init__(self, leases: LocalLeases, lease: Lease, ttl: float,
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
                self.lost(self.leases.current())
                return
            self.lease = new

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.is_lost:
            with contextlib.suppress(OSError):
                self.leases.release(self.lease)
