"""Ship a store's committed events to the warm tier (PostgreSQL), restart-safe.

A ``Shipper`` reads the store from its cursor -- the last LSN shipped, kept in
PostgreSQL (``steno_cursors``) -- up to what is committed (the host recorder's synced
LSN; with no host recorder at work, what the store holds), and copies it in batches:
``COPY`` into a staging table, ``INSERT ... ON CONFLICT DO NOTHING`` into
``steno_events``, the trajectories' rows, the approvals, and the cursor, in one
transaction. A shipper killed anywhere ships its last batch again; the conflict rule
drops what was already there: no duplicate and no gap.

Only committed events leave: an event a crash could still take from the store must not
be in PostgreSQL, or the store would write another event under its ``(trajectory, seq)``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event, jsonable, pack_body
from stenograph.recorder.errors import BadInput, StenographError
from stenograph.recorder.gc import needed
from stenograph.recorder.hostclient import synced_lsn
from stenograph.recorder.reader import StoreReader, check_store, read_salt
from stenograph.warm import schema
from stenograph.warm.db import connect
from stenograph.warm.errors import WarmTierError, first_line, safe_url
from stenograph.warm.objects import ObjectStore

BATCH = 2000
"""Events per transaction."""


def store_id(store: Path) -> str:
    """A store's name in the warm tier: derived from its salt (random at creation), so
    the same store keeps its name wherever it is mounted, and the salt itself stays
    local."""
    salt = read_salt(store)
    if salt is None:  # (a store made before salts: its path on this host)
        salt = f"{socket.gethostname()}:{store.resolve()}".encode()
    return hashlib.sha256(b"stenograph store id\0" + salt).hexdigest()[:32]


@dataclass
class Shipped:
    """What one pass shipped, and how far behind the store the warm tier is."""

    events: int = 0
    batches: int = 0
    cursor: int = 0
    """The last LSN shipped."""
    committed: int = 0
    """The last LSN committed in the store when the pass ended."""
    seconds: float = 0.0
    trajectories: set[str] = field(default_factory=set)
    blobs: int = 0
    """Objects this pass wrote to the object store (one already there is not counted)."""
    missing_blobs: int = 0
    """Blobs an event names that the store no longer has."""
    fenced: int = 0
    """Events not shipped: their trajectory's lease is another store's (it moved)."""

    @property
    def lag(self) -> int:
        """Committed events not shipped yet."""
        return max(0, self.committed - self.cursor)

    def to_json(self) -> dict[str, Any]:
        return {"events": self.events, "batches": self.batches, "cursor": self.cursor,
                "committed": self.committed, "lag": self.lag,
                "seconds": round(self.seconds, 3),
                "trajectories": sorted(self.trajectories), "blobs": self.blobs,
                "missing_blobs": self.missing_blobs, "fenced": self.fenced}


@dataclass
class _Traj:
    started_at: dt.datetime
    run_sha256: str


class Shipper:
    """Ship ``store`` into the database at ``url`` (a ``postgresql://`` URL)."""

    def __init__(self, store: Path, url: str, *, batch: int = BATCH,
                 host: str | None = None,
                 committed: Callable[[], int | None] | None = None,
                 objects: ObjectStore | None = None) -> None:
        check_store(store)
        self.store = store
        self.url = url
        self.batch = batch
        self.host = host or socket.gethostname()
        self.id = store_id(store)
        self._conn: Any = None
        self._trajs: dict[str, _Traj] = {}
        self._committed = committed
        self.objects = objects
        """Where blobs, snapshots and bodies over ``BODY_INLINE_MAX`` go (``--blobs``)."""
        self._blobs = BlobStore(store / "blobs")
        self._walked: set[str] = set()  # snapshot manifests already shipped

    # -- the database

    def connect(self) -> None:
        """Connect (the schema made if missing) and make this store's cursor."""
        self._conn = connect(self.url)
        with self._tx() as cur:
            cur.execute("INSERT INTO steno_cursors (store_id, host, path, lsn) "
                        "VALUES (%s, %s, %s, 0) ON CONFLICT (store_id) DO NOTHING",
                        (self.id, self.host, str(self.store.resolve())))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Shipper:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cursor(self) -> int:
        with self._tx() as cur:
            cur.execute("SELECT lsn FROM steno_cursors WHERE store_id = %s", (self.id,))
            row = cur.fetchone()
        return int(row[0]) if row else 0

    # -- shipping

    def committed(self) -> int | None:
        """The store's last committed LSN (None: no host recorder, all that is there).
        Asked of the host recorder over its socket, or, inside it (``serve --ship``), of
        its store."""
        return self._committed() if self._committed is not None else synced_lsn(self.store)

    def ship(self, *, progress: Callable[[Shipped], None] | None = None,
             limit: int | None = None) -> Shipped:
        """One pass: everything committed from the cursor on, in batches."""
        t0 = time.monotonic()
        out = Shipped(cursor=self.cursor())
        upto = self.committed()
        batch: list[Event] = []
        last_lsn = out.cursor
        for ev in self._events(out.cursor + 1, upto):
            batch.append(ev)
            last_lsn = ev.lsn
            if len(batch) >= self.batch:
                self._ship_batch(batch, out)
                batch = []
                if progress is not None:
                    progress(out)
                if limit is not None and out.events >= limit:
                    break
        if batch:
            self._ship_batch(batch, out)
            if progress is not None:
                progress(out)
        out.committed = upto if upto is not None else max(last_lsn, out.cursor)
        out.seconds = time.monotonic() - t0
        return out

    def follow(self, *, every: float = 0.5, stop: Callable[[], bool] = lambda: False,
               progress: Callable[[Shipped], None] | None = None) -> Shipped:
        """Ship, then ship what has been committed since, every ``every`` seconds, until
        ``stop()`` says so."""
        total = Shipped()
        while True:
            got = self.ship(progress=progress)
            total.events += got.events
            total.batches += got.batches
            total.trajectories |= got.trajectories
            total.blobs += got.blobs
            total.missing_blobs += got.missing_blobs
            total.fenced += got.fenced
            total.cursor, total.committed = got.cursor, got.committed
            total.seconds += got.seconds
            if stop():
                return total
            if not got.events:
                time.sleep(every)

    def _events(self, from_lsn: int, upto: int | None) -> Iterator[Event]:
        for ev in StoreReader(self.store).events(from_lsn=from_lsn):
            if upto is not None and ev.lsn > upto:
                return
            yield ev

    def _ship_batch(self, events: list[Event], out: Shipped) -> None:
        import psycopg

        trajs = self._learn(events)
        rows = [row(ev, trajs[ev.traj].started_at, self.id) for ev in events]
        if self.objects is not None:  # before the rows that name them
            self._upload(events, rows, out)
        try:
            with self._tx() as cur:
                cur.execute("SELECT lsn FROM steno_cursors WHERE store_id = %s FOR UPDATE",
                            (self.id,))
                # fencing: a trajectory whose lease another store holds (it moved there)
                # is that store's to ship; what this one still has of it is dropped
                cur.execute("SELECT trajectory_id FROM steno_leases WHERE trajectory_id = "
                            "ANY(%s) AND store_id <> %s FOR SHARE",
                            (sorted({ev.traj for ev in events}), self.id))
                moved = {r[0] for r in cur.fetchall()}
                if moved:
                    keep = [i for i, ev in enumerate(events) if ev.traj not in moved]
                    out.fenced += len(events) - len(keep)
                    rows = [rows[i] for i in keep]
                    events_kept = [events[i] for i in keep]
                else:
                    events_kept = events
                for month in {r[2].date().replace(day=1) for r in rows}:
                    cur.execute(schema.partition_ddl(month))
                cur.execute(schema.STAGE)
                with cur.copy(schema.COPY_STAGE) as copy:
                    copy.set_types(["text", "int8", "timestamptz", "int8", "text", "text",
                                    "text", "bytea", "text", "int4"])
                    for r in rows:
                        copy.write_row(r)
                cur.execute(schema.MOVE_STAGE)
                if events_kept:
                    self._trajectories(cur, events_kept, trajs)
                    self._approvals(cur, events_kept)
                cur.execute("UPDATE steno_cursors SET lsn = GREATEST(lsn, %s), "
                            "shipped = shipped + %s, updated_at = now(), host = %s "
                            "WHERE store_id = %s",
                            (events[-1].lsn, len(events), self.host, self.id))
        except psycopg.Error as exc:
            raise WarmTierError(f"the warm tier refused a batch: {first_line(exc)}",
                                safe_url(self.url)) from None
        out.events += len(events)
        out.batches += 1
        out.cursor = events[-1].lsn
        out.trajectories |= {ev.traj for ev in events}

    def _upload(self, events: list[Event], rows: list[tuple[Any, ...]], out: Shipped) -> None:
        """Every blob the batch's events need (a checkpoint's snapshot whole), and each
        body too large for its row, into the object store, content-addressed."""
        assert self.objects is not None
        for ev, r in zip(events, rows, strict=True):
            shas = needed(self._blobs, ev, self._walked)
            for sha in sorted(shas):
                if not self._blobs.has(sha):
                    out.missing_blobs += 1  # (gone from the store: nothing to copy)
                    continue
                _, wrote = self.objects.put(self._blobs.get(sha))
                out.blobs += wrote
            if r[7] is None:  # (raw: over BODY_INLINE_MAX)
                _, wrote = self.objects.put(pack_body(ev.body))
                out.blobs += wrote

    def _learn(self, events: list[Event]) -> dict[str, _Traj]:
        """Each trajectory's start (its partition) and the hash of its ``RunStarted``:
        from the batch, else from the warm tier (shipped before), else now (a log that
        does not begin with a run)."""
        for ev in events:
            if ev.seq == 0 and ev.traj not in self._trajs:
                started = ev.body.get("started") if ev.kind == "RunStarted" else None
                at = (dt.datetime.fromtimestamp(float(started), dt.UTC)
                      if isinstance(started, int | float) else _now())
                self._trajs[ev.traj] = _Traj(at, hashlib.sha256(pack_body(ev.body)).hexdigest())
        unknown = sorted({ev.traj for ev in events} - set(self._trajs))
        if unknown:
            with self._tx() as cur:
                cur.execute("SELECT trajectory_id, started_at, run_sha256 FROM "
                            "steno_trajectories WHERE trajectory_id = ANY(%s)", (unknown,))
                for tid, at, sha in cur.fetchall():
                    self._trajs[tid] = _Traj(at, sha)
            for tid in unknown:
                self._trajs.setdefault(tid, _Traj(_now(), ""))
        return self._trajs

    def _trajectories(self, cur: Any, events: list[Event], trajs: dict[str, _Traj]) -> None:
        """Each trajectory's row: made at its first batch, moved on at every batch. A
        trajectory of the same name that another run started is refused, not mixed in."""
        last: dict[str, Event] = {}
        labels: dict[str, dict[str, Any]] = {}
        ended: set[str] = set()
        for ev in events:
            last[ev.traj] = ev
            if ev.seq == 0 and isinstance(ev.body.get("labels"), dict):
                labels[ev.traj] = ev.body["labels"]
            if ev.kind == "RunEnded":
                ended.add(ev.traj)
        for tid, ev in last.items():
            t = trajs[tid]
            cur.execute(  # (a refusal below rolls this back with the batch)
                "INSERT INTO steno_trajectories AS t (trajectory_id, store_id, host, "
                "started_at, run_sha256, labels, last_seq, last_kind, state) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (trajectory_id) DO UPDATE SET "
                "last_seq = GREATEST(t.last_seq, excluded.last_seq), "
                "last_kind = excluded.last_kind, store_id = excluded.store_id, "
                "host = excluded.host, updated_at = now(), "
                "state = CASE WHEN excluded.state = 'ended' THEN 'ended' ELSE t.state END "
                "RETURNING t.run_sha256",
                (tid, self.id, self.host, t.started_at, t.run_sha256,
                 json.dumps(labels.get(tid, {})), ev.seq, ev.kind,
                 "ended" if tid in ended else "running"))
            row = cur.fetchone()
            if row and t.run_sha256 and row[0] and row[0] != t.run_sha256:
                raise BadInput(f"trajectory {tid} in the warm tier is another run (started "
                               "elsewhere under the same name): ship refuses to mix them; "
                               "record it under another --traj", str(self.store))

    @staticmethod
    def _approvals(cur: Any, events: list[Event]) -> None:
        for ev in events:
            b = ev.body
            if ev.kind == "ApprovalRequested":
                cur.execute(
                    "INSERT INTO steno_approvals (trajectory_id, call_id, requested_at, call, "
                    "summary) VALUES (%s, %s, to_timestamp(%s), %s, %s) "
                    "ON CONFLICT (trajectory_id, call_id) DO NOTHING",
                    (ev.traj, str(b.get("call_id")), _epoch(b.get("requested_at")),
                     _text(b.get("call")), _text(b.get("summary"))))
            elif ev.kind == "ApprovalResolved":
                cur.execute(
                    "INSERT INTO steno_approvals (trajectory_id, call_id, decision, "
                    "decided_by, decided_at) VALUES (%s, %s, %s, %s, to_timestamp(%s)) "
                    "ON CONFLICT (trajectory_id, call_id) DO UPDATE SET "
                    "decision = excluded.decision, decided_by = excluded.decided_by, "
                    "decided_at = excluded.decided_at",
                    (ev.traj, str(b.get("call_id")), _text(b.get("decision")),
                     _text(b.get("by")), _epoch(b.get("at"))))

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        """A cursor inside one transaction: committed on leaving, rolled back on an
        error."""
        assert self._conn is not None, "connect() first"
        with self._conn.transaction(), self._conn.cursor() as cur:
            yield cur


def row(ev: Event, started_at: dt.datetime, store: str) -> tuple[Any, ...]:
    """An event as a row of ``steno_events`` (``schema.STAGE_COLUMNS``): its body as JSON
    text the server parses into jsonb (not a tape chunk's, nor one holding NUL, which
    jsonb cannot), its msgpack bytes up to ``BODY_INLINE_MAX``, their hash and size."""
    raw = pack_body(ev.body)
    body: str | None = None
    if ev.kind != "TapeChunk":
        body = json.dumps(jsonable(ev.body), separators=(",", ":"))
        if "\\u0000" in body:
            body = None
    return (ev.traj, ev.seq, started_at, ev.lsn, store, ev.kind, body,
            raw if len(raw) <= schema.BODY_INLINE_MAX else None,
            hashlib.sha256(raw).hexdigest(), len(raw))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _epoch(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(jsonable(v))


def default_url() -> str | None:
    """``STENO_DB`` (or ``DATABASE_URL``) when no URL is given."""
    return os.environ.get("STENO_DB") or os.environ.get("DATABASE_URL")



class Following:
    """A worker's own shipper (``record``/``resume --db``): ships its store's committed
    events every ``every`` seconds while the run goes on, at once after each effect's
    intent (``ship_now``: the warm tier's commit is the effect's barrier, so a host lost
    for good, its disk with it, loses no intent), and once more at the end. A warm tier
    that cannot be reached between intents does not stop the run: ``error`` says why,
    and ``ship`` run later catches up from the cursor."""

    def __init__(self, store: Path, url: str, objects: ObjectStore | None = None,
                 every: float = 0.5) -> None:
        self.shipper = Shipper(store, url, objects=objects)
        self.shipper.connect()
        self.every = every
        self.error: str | None = None
        self._lock = threading.Lock()  # one pass at a time on the one connection
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steno-ship", daemon=True)
        self._thread.start()

    def _pass(self) -> Shipped:
        with self._lock:
            return self.shipper.ship()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got = self._pass()
            except StenographError as exc:
                self.error = str(exc.args[0]) if exc.args else type(exc).__name__
                return
            if not got.events:
                self._stop.wait(self.every)

    def ship_now(self) -> None:
        """Everything committed so far, in the warm tier before this returns (an intent
        just made durable among it); ``WarmTierError`` if it cannot be."""
        self._pass()

    def close(self) -> None:
        """The last pass, then the connection closed."""
        self._stop.set()
        self._thread.join()
        if self.error is None:
            try:
                self._pass()
            except StenographError as exc:
                self.error = str(exc.args[0]) if exc.args else type(exc).__name__
        self.shipper.close()
