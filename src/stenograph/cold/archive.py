"""``stenograph archive``: finished trajectories to Parquet, then out of the live tier.

A run of ``archive`` works in batches (``BATCH`` trajectories at most). For each batch:

1. the blobs its events need are put (content-addressed: a blob already there is not
   written again);
2. its events go to one Parquet file per partition (``events/tenant=T/date=D/model=M/
   <batch>.parquet``, zstd) and its runs to ``trajectories/<batch>.parquet``;
3. every file is read back and each trajectory's digest compared with the source's;
4. ``batches/<batch>.json`` is written: the commit. Only files a committed batch names
   exist for ``query`` and ``replay``; a killed run's files are orphans, removed by the
   next run;
5. once every batch of the run is committed, the live copies are removed: a store's
   segments compacted (``recorder/compact.py``: one pass for the whole run, since it
   reads every segment), or the warm tier's rows deleted.

Killed anywhere, a rerun loses nothing and writes nothing twice: a trajectory a
committed batch holds is skipped (its live copy, if still there, is removed once its
digest matches the archived one); one that was only in an uncommitted batch is archived
again. The archive is the truth from step 4 on, the live tier until then.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.cold.batches import archived_trajectories, committed
from stenograph.cold.location import Location
from stenograph.cold.rows import (
    EVENT_COLUMNS,
    Finished,
    Rows,
    digest,
    events_of_table,
    finished,
    rows_of,
)
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.codec import Event, unpack
from stenograph.recorder.errors import BadInput, StenographError
from stenograph.recorder.gc import needed

BATCH = 500
"""Trajectories per batch: one commit, one file per partition."""
ORPHAN_AGE = 3600.0
"""An uncommitted file older than this (seconds) was left by a killed archive run."""


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise BadInput("archive needs pyarrow: pip install 'stenograph[archive]'") from None
    return pa, pq


def event_schema() -> Any:
    pa, _ = _pa()
    return pa.schema([
        ("traj", pa.string()), ("seq", pa.int64()), ("lsn", pa.int64()),
        ("kind", pa.string()), ("time", pa.timestamp("us", tz="UTC")),
        ("turn", pa.int32()), ("served_model", pa.string()),
        ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
        ("tool_names", pa.list_(pa.string())), ("target", pa.string()),
        ("ok", pa.bool_()), ("effect", pa.string()), ("body", pa.binary()),
    ])


def run_schema() -> Any:
    pa, _ = _pa()
    return pa.schema([
        ("traj", pa.string()), ("tenant", pa.string()),
        ("labels", pa.map_(pa.string(), pa.string())),
        ("started", pa.timestamp("us", tz="UTC")), ("ended", pa.timestamp("us", tz="UTC")),
        ("date", pa.string()), ("model", pa.string()), ("exit_status", pa.int32()),
        ("turns", pa.int32()), ("events", pa.int64()), ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()), ("tools", pa.list_(pa.string())),
        ("tool_failures", pa.int32()), ("effects", pa.int32()), ("digest", pa.string()),
        ("file", pa.string()), ("batch", pa.string()), ("source", pa.string()),
        ("archived_at", pa.timestamp("us", tz="UTC")),
    ])


def parquet_bytes(table: Any) -> bytes:
    _, pq = _pa()
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=64 << 10)
    return buf.getvalue()


# -- sources -----------------------------------------------------------------------------

@dataclass
class Candidate:
    """A trajectory of the source with its events (``bodies`` reads its blobs)."""

    traj: str
    events: list[Event]
    done: Finished


class Source:
    """Where trajectories are archived from: a store or the warm tier."""

    name: str

    def candidates(self) -> Iterator[Candidate]: ...
    def blob(self, sha: str) -> bytes: ...
    def needs(self, ev: Event, walked: set[str]) -> set[str]: ...
    def remove(self, trajs: set[str]) -> int: ...
    def close(self) -> None: ...


class StoreSource(Source):
    """A store on this host, held with its lock for the whole run (nothing appends while
    its segments are compacted)."""

    def __init__(self, path: Path) -> None:
        from stenograph.recorder.gc import _lock

        self.path = path
        self.name = str(path)
        self.blobs = BlobStore(path / "blobs")
        self.fd = _lock(path, dry_run=False)

    def candidates(self) -> Iterator[Candidate]:
        from stenograph.recorder.reader import StoreReader

        by: dict[str, list[Event]] = {}
        for ev in StoreReader(self.path).events(lazy_tape=True):
            by.setdefault(ev.traj, []).append(ev)
        for traj in sorted(by):
            evs = by[traj]
            yield Candidate(traj, evs, finished(traj, evs))

    def blob(self, sha: str) -> bytes:
        return self.blobs.get(sha)

    def needs(self, ev: Event, walked: set[str]) -> set[str]:
        return needed(self.blobs, ev, walked)

    def remove(self, trajs: set[str]) -> int:
        from stenograph.recorder.compact import drop_trajectories

        return drop_trajectories(self.path, trajs).events

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class WarmSource(Source):
    """The fleet's warm tier (PostgreSQL), its blobs in ``blobs`` (s3://)."""

    def __init__(self, url: str, blobs_url: str | None) -> None:
        from stenograph.warm.db import connect
        from stenograph.warm.errors import safe_url
        from stenograph.warm.objects import ObjectStore

        self.url = url
        self.name = safe_url(url)
        self.objects = ObjectStore(blobs_url) if blobs_url else None
        self.conn = connect(url)
        with self.conn.cursor() as cur:  # one archiver of this warm tier at a time
            cur.execute("SELECT pg_try_advisory_lock(hashtext('steno_archive'))")
            if not cur.fetchone()[0]:
                self.conn.close()
                raise BadInput("another `stenograph archive` is archiving this warm tier",
                               self.name)
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="steno-archive-")
        self.local = BlobStore(Path(self._tmp.name) / "blobs")
        self.got: dict[str, bytes] = {}

    def candidates(self) -> Iterator[Candidate]:
        from stenograph.warm.fetch import fetch_trajectory

        with self.conn.cursor() as cur:
            cur.execute("SELECT t.trajectory_id FROM steno_trajectories t WHERE NOT EXISTS "
                        "(SELECT 1 FROM steno_leases l WHERE l.trajectory_id = "
                        "t.trajectory_id AND l.expires_at > now()) ORDER BY 1")
            names = [r[0] for r in cur.fetchall()]
        for traj in names:
            f = fetch_trajectory(self.url, traj, self.local, self.objects)
            self.got.update(f.blobs)
            evs = [Event(seq + 1, traj, seq, seq if seq else None, kind, unpack(data))
                   for seq, (kind, data) in enumerate(f.events)]
            yield Candidate(traj, evs, finished(traj, evs))

    def blob(self, sha: str) -> bytes:
        if sha in self.got:
            return self.got[sha]
        if self.objects is None:
            raise BadInput(f"blob {sha[:16]}... is in object storage: give --blobs "
                           "s3://BUCKET/PREFIX", self.name)
        return self.objects.get(sha)

    def needs(self, ev: Event, walked: set[str]) -> set[str]:
        return needed(_Getter(self), ev, walked)  # type: ignore[arg-type]

    def remove(self, trajs: set[str]) -> int:
        names = sorted(trajs)
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.execute("DELETE FROM steno_events WHERE trajectory_id = ANY(%s)", (names,))
            n = cur.rowcount
            for table in ("steno_trajectories", "steno_approvals", "steno_settlements",
                          "steno_leases"):
                cur.execute(f"DELETE FROM {table} WHERE trajectory_id = ANY(%s)", (names,))
        return int(n)

    def close(self) -> None:
        self.conn.close()
        self._tmp.cleanup()


class _Getter:
    def __init__(self, src: WarmSource) -> None:
        self.src = src

    def get(self, ref: Any) -> bytes:
        return self.src.blob(getattr(ref, "sha256", ref))

    def has(self, sha: str) -> bool:
        return True


# -- the archive run ---------------------------------------------------------------------

@dataclass
class Archived:
    """What one ``archive`` run did."""

    archived: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Not archived, and why (running, in doubt, too young...)."""
    already: int = 0
    """In a committed batch already (a rerun)."""
    removed_events: int = 0
    batches: list[str] = field(default_factory=list)
    events: int = 0
    parquet_bytes: int = 0
    source_bytes: int = 0
    blobs_written: int = 0
    orphans_removed: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"archived": self.archived, "skipped": self.skipped, "already": self.already,
                "removed_events": self.removed_events, "batches": self.batches,
                "events": self.events, "parquet_bytes": self.parquet_bytes,
                "source_bytes": self.source_bytes, "blobs_written": self.blobs_written,
                "orphans_removed": self.orphans_removed, "seconds": round(self.seconds, 3)}


def archive(source: Source, loc: Location, *, older_than: float, now: float | None = None,
            batch_size: int = BATCH,
            progress: Callable[[int, int], None] | None = None) -> Archived:
    """Archive ``source``'s finished trajectories that ended ``older_than`` seconds ago or
    more into ``loc``; remove their live copies once committed and verified."""
    t0 = time.monotonic()
    now = time.time() if now is None else now
    out = Archived()
    out.orphans_removed = _sweep_orphans(loc, now)
    have = archived_trajectories(loc)
    batch: list[Candidate] = []
    done_here: set[str] = set()

    def flush() -> None:
        if batch:
            _write_batch(source, loc, batch, out)
            done_here.update(c.traj for c in batch)
            batch.clear()
            if progress is not None:
                progress(len(out.archived), out.already)

    stale: set[str] = set()
    for cand in source.candidates():
        if not cand.done.done:
            out.skipped[cand.traj] = cand.done.why
            continue
        if cand.done.ended is not None and now - cand.done.ended < older_than:
            out.skipped[cand.traj] = "ended too recently"
            continue
        prior = have.get(cand.traj)
        if prior is not None and prior.get("digest") == digest(cand.events):
            out.already += 1
            stale.add(cand.traj)  # archived by a run killed before it removed it
            continue
        batch.append(cand)
        if len(batch) >= batch_size:
            flush()
    flush()
    if stale or done_here:  # once, at the end: a store's compaction reads every segment
        out.removed_events += source.remove(stale | done_here)
    out.seconds = time.monotonic() - t0
    return out


def _write_batch(source: Source, loc: Location, batch: list[Candidate], out: Archived) -> str:
    pa, _ = _pa()
    bid = f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
    walked: set[str] = set()
    groups: dict[str, list[Rows]] = {}
    for cand in batch:
        events = [_whole(ev) for ev in cand.events]
        cand.events = events
        for ev in events:
            for sha in sorted(source.needs(ev, walked)):
                if not loc.has_blob(sha):
                    out.blobs_written += loc.put_blob(source.blob(sha))
        rows = rows_of(cand.traj, events, _bodies(source), cand.done)
        groups.setdefault(rows.partition, []).append(rows)
        out.source_bytes += sum(len(b) for b in rows.events["body"])
    files: list[dict[str, Any]] = []
    trajs: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    schema = event_schema()
    archived_at = dt.datetime.now(dt.UTC)
    for part, rowsets in sorted(groups.items()):
        key = f"events/{part}/{bid}.parquet"
        cols = {c: [v for r in rowsets for v in r.events[c]] for c in EVENT_COLUMNS}
        data = parquet_bytes(pa.Table.from_pydict(cols, schema=schema))
        loc.put(key, data)
        files.append({"key": key, "bytes": len(data), "rows": len(cols["seq"])})
        out.parquet_bytes += len(data)
        for r in rowsets:
            trajs[r.traj] = {"file": key, "events": len(r.events["seq"]),
                             "digest": r.run["digest"]}
            runs.append({**r.run, "file": key, "batch": bid, "source": source.name,
                         "archived_at": archived_at})
    runs_key = f"trajectories/{bid}.parquet"
    rcols = {f.name: [r.get(f.name) for r in runs] for f in run_schema()}
    rcols["labels"] = [list(r["labels"].items()) for r in runs]
    data = parquet_bytes(pa.Table.from_pydict(rcols, schema=run_schema()))
    loc.put(runs_key, data)
    files.append({"key": runs_key, "bytes": len(data), "rows": len(runs)})
    out.parquet_bytes += len(data)
    _verify(loc, files, trajs)
    loc.put(f"batches/{bid}.json", json.dumps({
        "batch": bid, "created": archived_at.isoformat(), "source": source.name,
        "files": files, "trajectories": trajs}, sort_keys=True).encode())
    out.batches.append(bid)
    out.archived.extend(sorted(trajs))
    out.events += sum(t["events"] for t in trajs.values())
    return bid


def _whole(ev: Event) -> Event:
    """A lazily read tape chunk's body, read."""
    frame = ev.body.get("$frame") if isinstance(ev.body, dict) else None
    if frame is None:
        return ev
    return Event(ev.lsn, ev.traj, ev.seq, ev.prev, ev.kind, frame.body())


def _bodies(source: Source) -> Callable[[Any], bytes]:
    def get(value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, dict) and "$blob" in value:
            return source.blob(BlobRef.from_body(value).sha256)
        return b""
    return get


def _verify(loc: Location, files: list[dict[str, Any]], trajs: dict[str, dict[str, Any]]) -> None:
    """Read every file back, as ``query`` and ``replay`` will, and check each trajectory
    against the digest of its source."""
    _, pq = _pa()
    for f in files:
        if not f["key"].startswith("events/"):
            continue
        table = pq.read_table(io.BytesIO(loc.get(f["key"])))
        if table.num_rows != f["rows"]:
            raise StenographError(f"{f['key']} reads back {table.num_rows} rows, not "
                                  f"{f['rows']}: nothing was removed", loc.url)
        for traj, evs in events_of_table(table).items():
            if digest(evs) != trajs[traj]["digest"]:
                raise StenographError(f"{traj} reads back from {f['key']} unlike its "
                                      "source: nothing was removed", loc.url)


def _sweep_orphans(loc: Location, now: float) -> int:
    """Files no committed batch names, left by a killed run (older than ``ORPHAN_AGE``, so
    a run going on beside this one keeps its own)."""
    named = {f["key"] for doc in committed(loc).values() for f in doc["files"]}
    gone = 0
    for key in loc.keys("events/") + loc.keys("trajectories/"):
        if key in named or not key.endswith(".parquet"):
            continue
        stamp = Path(key).stem.split("-")[0]
        try:
            made = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%S").replace(
                tzinfo=dt.UTC).timestamp()
        except ValueError:
            continue
        if now - made > ORPHAN_AGE:
            loc.remove(key)
            gone += 1
    return gone
