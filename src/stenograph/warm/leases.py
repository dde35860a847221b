"""Leases in PostgreSQL: one row per trajectory, so a fleet agrees on who runs it.

``PgLeases`` has the interface of ``recorder.leases.LocalLeases`` (``acquire``, ``renew``,
``release``, ``current``, ``all``, ``holds``, ``held_by_other``), over the row
``steno_leases(trajectory_id)``. Expiry is the database's clock (``now()``), never a
host's: two hosts whose clocks disagree still agree on whether a lease ran out. A
takeover is ``epoch = epoch + 1`` under ``SELECT ... FOR UPDATE``, as Temporal moves a
shard's ``range_id``; the shipper reads the same row ``FOR SHARE`` in every batch and
ships a trajectory only from the store that holds it (``ship.py``).

``FleetLeases`` holds both: the row (who runs the trajectory anywhere) and the store's
own lease file at the same epoch and token (what the host recorder checks on every
write), so a worker fenced in PostgreSQL is fenced in its store too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any

from stenograph.recorder.errors import StoreLocked
from stenograph.recorder.leases import DEFAULT_TTL, Lease, LocalLeases, gone
from stenograph.warm.db import connect
from stenograph.warm.errors import first_line, safe_url

_COLS = "trajectory_id, epoch, pid, host, token, extract(epoch from expires_at)"


def _lease(row: Any) -> Lease:
    return Lease(row[0], int(row[1]), int(row[2]), row[3], row[4], float(row[5]))


class PgLeases:
    """The leases of every trajectory of the fleet, in ``steno_leases``."""

    def __init__(self, url: str, store_id: str) -> None:
        self.url = url
        self.store_id = store_id
        """The store this worker writes: the one whose shipper may ship the trajectory."""
        self._conn = connect(url)
        self._lock = threading.Lock()  # the heartbeat's thread and the worker's share it

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        import psycopg

        with self._lock:
            try:
                with self._conn.transaction(), self._conn.cursor() as cur:
                    yield cur
            except psycopg.OperationalError as exc:
                raise OSError(f"the warm tier: {first_line(exc)}") from None

    def current(self, traj: str) -> Lease | None:
        with self._tx() as cur:
            cur.execute(f"SELECT {_COLS} FROM steno_leases WHERE trajectory_id = %s", (traj,))
            row = cur.fetchone()
        return _lease(row) if row else None

    def all(self) -> list[Lease]:
        with self._tx() as cur:
            cur.execute(f"SELECT {_COLS} FROM steno_leases ORDER BY trajectory_id")
            return [_lease(r) for r in cur.fetchall()]

    def acquire(self, traj: str, epoch: int, ttl: float = DEFAULT_TTL,
                token: str | None = None) -> Lease:
        """Take ``traj`` at ``epoch`` or the row's epoch + 1, whichever is higher.
        ``StoreLocked`` while another worker's lease on it is live."""
        with self._tx() as cur:
            cur.execute(f"SELECT {_COLS}, expires_at > now() FROM steno_leases "
                        "WHERE trajectory_id = %s FOR UPDATE", (traj,))
            row = cur.fetchone()
            if row is not None:
                cur_lease = _lease(row)
                if row[6] and not gone(cur_lease):
                    cur.execute("SELECT extract(epoch from expires_at - now()) FROM "
                                "steno_leases WHERE trajectory_id = %s", (traj,))
                    left = float(cur.fetchone()[0])
                    raise StoreLocked(f"{traj} is held by pid {cur_lease.pid} on "
                                      f"{cur_lease.host} at epoch {cur_lease.epoch} (its "
                                      f"lease runs {left:.0f}s more)", safe_url(self.url))
                epoch = max(epoch, cur_lease.epoch + 1)
            cur.execute(
                "INSERT INTO steno_leases (trajectory_id, epoch, pid, host, token, store_id, "
                "expires_at) VALUES (%s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (trajectory_id) DO UPDATE SET epoch = excluded.epoch, "
                "pid = excluded.pid, host = excluded.host, token = excluded.token, "
                "store_id = excluded.store_id, expires_at = excluded.expires_at, "
                "draining = false "
                f"RETURNING {_COLS}",
                (traj, epoch, os.getpid(), os.uname().nodename,
                 token or secrets.token_hex(8), self.store_id, ttl))
            return _lease(cur.fetchone())

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease | None:
        """The lease pushed ``ttl`` on, or None if it is no longer this worker's."""
        with self._tx() as cur:
            cur.execute("UPDATE steno_leases SET expires_at = now() + make_interval(secs => %s) "
                        f"WHERE trajectory_id = %s AND token = %s RETURNING {_COLS}",
                        (ttl, lease.traj, lease.token))
            row = cur.fetchone()
        return _lease(row) if row else None

    def release(self, lease: Lease) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE steno_leases SET expires_at = to_timestamp(0) "
                        "WHERE trajectory_id = %s AND token = %s", (lease.traj, lease.token))

    def holds(self, lease: Lease) -> bool:
        cur = self.current(lease.traj)
        return cur is not None and cur.token == lease.token

    def draining(self, lease: Lease) -> bool:
        """Has ``stenograph drain`` asked this worker to let its trajectory go?"""
        with self._tx() as cur:
            cur.execute("SELECT draining FROM steno_leases WHERE trajectory_id = %s AND "
                        "token = %s", (lease.traj, lease.token))
            row = cur.fetchone()
        return bool(row and row[0])

    def held_by_other(self, traj: str | None = None) -> Lease | None:
        with self._tx() as cur:
            cur.execute(f"SELECT {_COLS} FROM steno_leases WHERE expires_at > now()"
                        + (" AND trajectory_id = %s" if traj is not None else ""),
                        (traj,) if traj is not None else ())
            rows = [_lease(r) for r in cur.fetchall()]
        me = (os.getpid(), os.uname().nodename)
        return next((x for x in rows if (x.pid, x.host) != me and not gone(x)), None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


class FleetLeases:
    """A trajectory's row in PostgreSQL and its store's lease file, taken and kept as
    one: the row decides (its epoch, its token), the file follows it."""

    def __init__(self, local: LocalLeases, pg: PgLeases) -> None:
        self.local, self.pg = local, pg

    def acquire(self, traj: str, epoch: int, ttl: float = DEFAULT_TTL) -> Lease:
        lease = self.pg.acquire(traj, epoch, ttl)
        try:
            mine = self.local.acquire(traj, lease.epoch, ttl, token=lease.token)
        except BaseException:
            self.pg.release(lease)
            raise
        if mine.epoch != lease.epoch:  # (the store had seen a later epoch: the row follows)
            self.pg.release(lease)
            lease = self.pg.acquire(traj, mine.epoch, ttl, token=lease.token)
        return lease

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease | None:
        new = self.pg.renew(lease, ttl)
        if new is None:
            return None
        return new if self.local.renew(lease, ttl) is not None else None

    def release(self, lease: Lease) -> None:
        with contextlib.suppress(OSError):
            self.local.release(lease)
        self.pg.release(lease)

    def current(self, traj: str) -> Lease | None:
        return self.pg.current(traj)

    def all(self) -> list[Lease]:
        return self.pg.all()

    def holds(self, lease: Lease) -> bool:
        return self.pg.holds(lease) and self.local.holds(lease)

    def held_by_other(self, traj: str | None = None) -> Lease | None:
        return self.pg.held_by_other(traj)

    def draining(self, lease: Lease) -> bool:
        return self.pg.draining(lease)

    def close(self) -> None:
        self.pg.close()


def drain(url: str, host: str) -> list[str]:
    """Ask every worker on ``host`` holding a live lease to stop at its next model turn
    and let its trajectory go (``draining``); the trajectories asked."""
    conn = connect(url)
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("UPDATE steno_leases SET draining = true WHERE host = %s AND "
                        "expires_at > now() RETURNING trajectory_id", (host,))
            return sorted(r[0] for r in cur.fetchall())
    finally:
        conn.close()


def still_held(url: str, trajs: list[str]) -> list[str]:
    """Of ``trajs``, those whose lease is still live (their workers have not let go)."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT trajectory_id FROM steno_leases WHERE trajectory_id = ANY(%s) "
                        "AND expires_at > now()", (trajs,))
            return sorted(r[0] for r in cur.fetchall())
    finally:
        conn.close()


def released(url: str) -> list[str]:
    """The trajectories that have not ended and whose lease no worker holds: those a drain
    let go, and those whose worker died (its host gone, the process killed) and let its
    lease run out. What ``resume --any`` picks up. A lease runs out only after its time
    to live unrenewed, and a worker that was only paused is fenced off by the epoch the
    next one takes."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT l.trajectory_id FROM steno_leases l LEFT JOIN "
                        "steno_trajectories t USING (trajectory_id) WHERE "
                        "l.expires_at <= now() AND coalesce(t.state, '') <> 'ended' "
                        "ORDER BY l.trajectory_id")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
