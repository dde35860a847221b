"""Garbage collection of a store's blob directory.

A blob is *live* if a durable event references it: directly, by a ``{"$blob": sha,
"size": n}`` map anywhere in its body, or through a ``Checkpoint`` event's snapshot
(the manifest, the delta manifests back to its full base, and every file blob they
name: ``snapshots.closure``). Every other blob in ``STORE/blobs/`` is garbage: a
snapshot killed before its ``Checkpoint`` was appended, a body whose event never
became durable, what a torn tail referenced.

The rules that keep gc from ever removing something a reader needs:

* It runs only with the store's ``LOCK`` held (a live writer: ``StoreLocked``), and
  keeps holding it while it reads and removes, so no recorder can start and write a
  blob it has not yet referenced in between.
* It reads the log first and removes afterwards; a log it cannot read whole (corrupt,
  an unknown kind) or a snapshot whose manifest cannot be read (missing, damaged)
  stops it before it has removed anything: it cannot know what those reference.
* A torn tail is what a crash leaves: the events before it are read and kept, the
  torn bytes are no event (the next writer cuts them).
* References are read generously: any 64-hex ``"$blob"`` string in a body counts,
  even in a map that is not a well-formed reference.
* Only names a blob can have (``ab/<62 hex>``) are ever removed, plus temporary
  files (``.*.tmp``) older than ``TEMP_AGE`` seconds; anything else in ``blobs/`` is
  left alone and counted.

Delta chains need no compaction here: the snapshotter cuts a chain at
``snapshots.MAX_DEPTH`` by writing a full manifest.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import (
    WRITE_ERRNOS,
    BadInput,
    CorruptLog,
    StenographError,
    StoreLocked,
    WriteFailed,
)
from stenograph.recorder.hostwire import host_serves
from stenograph.recorder.leases import LocalLeases
from stenograph.recorder.reader import StoreReader, TornTail, check_store
from stenograph.recorder.snapshots import unpack_manifest
from stenograph.recorder.store import take_lock

TEMP_AGE = 3600.0
"""A temporary file in ``blobs/`` older than this (seconds) was left by a dead writer."""

_HEX = frozenset("0123456789abcdef")


def _is_sha(s: Any) -> bool:
    return isinstance(s, str) and len(s) == 64 and set(s) <= _HEX


def referenced(body: Any) -> Iterator[str]:
    """Every blob hash ``body`` names: each 64-hex string under a ``"$blob"`` key at any
    depth (a superset of ``blobs.blob_refs``, which refuses malformed references)."""
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            sha = v.get("$blob")
            if _is_sha(sha):
                yield sha
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


@dataclass
class GcReport:
    store: str
    dry_run: bool
    events: int = 0
    snapshots: int = 0
    """Checkpoint events with a snapshot."""
    kept: int = 0
    kept_bytes: int = 0
    removed: int = 0
    """Blobs removed (with ``dry_run``: that would be)."""
    removed_bytes: int = 0
    temp_removed: int = 0
    temp_removed_bytes: int = 0
    temp_kept: int = 0
    """Temporary files younger than ``TEMP_AGE``: a writer may still be using them."""
    missing: int = 0
    """Blobs referenced directly by an event that are not in the store."""
    other_files: int = 0
    """Files in ``blobs/`` that are neither blobs nor temporary files: left alone."""
    torn_tail: TornTail | None = None
    seconds: float = 0.0
    snapshots_dropped: int = 0
    """Checkpoint snapshots a retention policy let go (their events stay)."""
    offload: list[str] = field(default_factory=list, repr=False)
    offloaded: int = 0
    """Blobs of old tool output moved to the policy's offload store."""
    removed_shas: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store, "dry_run": self.dry_run, "events": self.events,
            "snapshots": self.snapshots,
            "kept": {"blobs": self.kept, "bytes": self.kept_bytes},
            "removed": {"blobs": self.removed, "bytes": self.removed_bytes},
            "temp_removed": {"files": self.temp_removed, "bytes": self.temp_removed_bytes},
            "temp_kept": self.temp_kept, "missing": self.missing,
            "other_files": self.other_files,
            "snapshots_dropped": self.snapshots_dropped, "offloaded": self.offloaded,
            "torn_tail": None if self.torn_tail is None else {
                "segment": self.torn_tail.segment, "offset": self.torn_tail.offset,
                "dropped": self.torn_tail.dropped, "reason": self.torn_tail.reason},
            "seconds": round(self.seconds, 6),
        }


def _lock(path: Path, dry_run: bool) -> int | None:
    """Hold the store's writer lock (``StoreLocked`` if a writer has it). A dry run takes
    it without writing its pid (it changes nothing); a store never opened by a writer has
    no ``LOCK`` yet, and a dry run does not make one."""
    if dry_run and not (path / "LOCK").exists():
        return None
    if host_serves(path):
        raise StoreLocked("a host recorder serves this store (stenograph serve): gc runs "
                          "once no recording uses it", str(path))
    fd = take_lock(path, record_pid=not dry_run,
                   refusal="store is locked by a writer (pid {pid}); gc does not run "
                   "beside a live recording: run it once the writer has ended")
    other = LocalLeases(path).held_by_other()  # a worker between two of its writes
    if other is not None:
        os.close(fd)
        raise StoreLocked(f"{other.traj} is running (pid {other.pid}); gc does not run "
                          "beside a live recording: run it once the writer has ended",
                          str(path))
    return fd


def _live(path: Path, blobs: BlobStore, report: GcReport,
          policy: Retention | None = None, now: float = 0.0) -> set[str]:
    """Every blob hash a durable event needs, snapshot closures included; under a
    retention ``policy``, less what it lets go (``report.offload``: tool output to move to
    the offload store before it is removed here)."""
    reader = StoreReader(path)
    live: set[str] = set()
    direct: set[str] = set()
    walked: set[str] = set()  # manifests whose closure is already in ``live``
    cps: dict[str, list[tuple[Event, str, int, float]]] = {}
    when: dict[str, float] = {}
    old_output: set[str] = set()
    for seg, off, _size, ev in reader.frames():
        if not isinstance(ev, Event):
            continue
        report.events += 1
        stamp = ev.body.get("at") if ev.kind != "RunStarted" else ev.body.get("started")
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
            when[ev.traj] = float(stamp)
        age = now - when.get(ev.traj, now)
        refs = set(referenced(ev.body))
        if (policy is not None and policy.tool_output_days is not None
                and ev.kind == "Exchange" and ev.body.get("channel") in TOOL_CHANNELS
                and age > policy.tool_output_days * 86400):
            old_output |= refs
        else:
            direct |= refs
        snap = ev.body.get("snapshot") if ev.kind == "Checkpoint" else None
        if isinstance(snap, dict) and _is_sha(snap.get("$blob")):
            report.snapshots += 1
            cps.setdefault(ev.traj, []).append((ev, str(seg), off, age))
    for found in cps.values():
        for i, (ev, seg, off, age) in enumerate(found):
            keep = (policy is None or policy.snapshots_days is None
                    or i == len(found) - 1 or ev.body.get("at") in ("start", "pre-resume")
                    or age <= policy.snapshots_days * 86400)
            if keep:
                _closure(blobs, ev.body["snapshot"], live, walked, ev, seg, off)
            else:
                report.snapshots_dropped += 1
    live |= direct
    report.offload = sorted(old_output - live)
    report.missing = sum(1 for sha in direct if not blobs.has(sha))
    report.torn_tail = reader.torn
    return live


TOOL_CHANNELS = frozenset({"http", "tool", "mcp", "exec", "net"})
"""The exchanges whose bodies are tool output (the model's own are kept for ever)."""


@dataclass(frozen=True)
class Retention:
    """A retention policy (``gc --policy FILE``, TOML)::

        snapshots_days = 14      # a checkpoint's snapshot older than this goes, except
                                 # each run's start (a replay's workspace), pre-resume
                                 # and last (a resume's) snapshots
        tool_output_days = 30    # tool output older than this moves to offload_to
        offload_to = "/srv/steno-archive"   # a directory: its blobs/ takes it

    Model requests and replies, intents, results and every event stay: only blobs go.
    """

    snapshots_days: float | None = None
    tool_output_days: float | None = None
    offload_to: Path | None = None

    @classmethod
    def load(cls, path: Path) -> Retention:
        import tomllib

        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise BadInput("no such policy file", str(path)) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"not a TOML policy: {exc}", str(path)) from None
        unknown = set(doc) - {"snapshots_days", "tool_output_days", "offload_to"}
        if unknown:
            raise BadInput(f"unknown policy key(s): {', '.join(sorted(unknown))}", str(path))
        for key in ("snapshots_days", "tool_output_days"):
            v = doc.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or v < 0):
                raise BadInput(f"{key} wants a number of days (0 or more)", str(path))
        off = doc.get("offload_to")
        if doc.get("tool_output_days") is not None and not isinstance(off, str):
            raise BadInput("tool_output_days needs offload_to (a directory): tool output is "
                           "moved, never dropped, so a replay can still read it", str(path))
        off_path = Path(off).expanduser() if isinstance(off, str) else None
        if off_path is not None and not off_path.is_dir():
            raise BadInput("offload_to is not a directory", str(off_path))
        return cls(doc.get("snapshots_days"), doc.get("tool_output_days"), off_path)


def needed(blobs: BlobStore, ev: Event, walked: set[str]) -> set[str]:
    """Every blob hash event ``ev`` needs: those its body names and, for a checkpoint, its
    snapshot's manifests and files (``walked``: manifests already followed, not again).
    What a shipper copies to object storage so another host can restore it."""
    out = set(referenced(ev.body))
    snap = ev.body.get("snapshot") if ev.kind == "Checkpoint" else None
    if isinstance(snap, dict) and _is_sha(snap.get("$blob")):
        _closure(blobs, snap, out, walked, ev, "(shipping)", 0)
    return out


def _closure(blobs: BlobStore, snap: dict[str, Any], live: set[str], walked: set[str],
             ev: Event, seg: str, off: int) -> None:
    """Add a snapshot's manifests and file blobs to ``live`` (``snapshots.closure``, with
    the manifests already walked for an earlier checkpoint not read again)."""
    sha: str | None = snap["$blob"]
    while sha is not None and sha not in walked:
        walked.add(sha)
        live.add(sha)
        try:
            obj = unpack_manifest(blobs.get(sha))
        except StenographError as exc:
            what = exc.what if isinstance(exc, CorruptLog) else str(exc)
            raise CorruptLog(
                f"the snapshot of Checkpoint lsn {ev.lsn} (trajectory {ev.traj!r}) cannot "
                f"be read: manifest {sha[:16]}...: {what}; gc removed nothing, since what "
                "that snapshot needs is unknown", seg, off) from None
        live.update(referenced(obj))
        base = obj.get("base") if obj["kind"] == "delta" else None
        sha = base.get("$blob") if isinstance(base, dict) else None
        if obj["kind"] == "delta" and not _is_sha(sha):
            raise CorruptLog(f"the snapshot of Checkpoint lsn {ev.lsn} has a delta manifest "
                             "without a base; gc removed nothing", seg, off)


def _entries(root: Path) -> Iterator[tuple[Path, str, os.stat_result]]:
    """``(path, what, lstat)`` for each file under ``blobs/``; ``what`` is a blob hash,
    ``".tmp"`` or ``""`` (something else)."""
    try:
        top = list(os.scandir(root))
    except FileNotFoundError:
        return
    for de in top:
        st = de.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and len(de.name) == 2 and set(de.name) <= _HEX:
            for sub in os.scandir(de.path):
                sst = sub.stat(follow_symlinks=False)
                if not stat.S_ISREG(sst.st_mode):  # a directory, a link: not ours
                    yield Path(sub.path), "", sst
                elif _is_sha(de.name + sub.name):
                    yield Path(sub.path), de.name + sub.name, sst
                else:
                    yield Path(sub.path), _temp(sub.name), sst
        elif stat.S_ISREG(st.st_mode):
            yield Path(de.path), _temp(de.name), st
        else:
            yield Path(de.path), "", st


def _temp(name: str) -> str:
    return ".tmp" if name.startswith(".") and name.endswith(".tmp") else ""


def collect(store: str | Path, *, dry_run: bool = False, now: float | None = None,
            policy: Retention | None = None) -> GcReport:
    """Remove (``dry_run``: count) the blobs no durable event needs and stale temporary
    files, holding the store's lock throughout. With a retention ``policy``: old
    snapshots too, and old tool output once copied (synced) to its offload store."""
    t0 = time.perf_counter()
    path = Path(store)
    check_store(path)
    if not (path / "blobs").is_dir() and (path / "blobs").exists():
        raise BadInput("blobs is not a directory", str(path / "blobs"))
    report = GcReport(str(path), dry_run)
    fd = _lock(path, dry_run)
    try:
        blobs = BlobStore(path / "blobs")
        now = time.time() if now is None else now
        live = _live(path, blobs, report, policy, now)
        if report.offload and policy is not None and policy.offload_to is not None \
                and not dry_run:
            report.offloaded = offload(blobs, report.offload, path, policy.offload_to)
        doomed: list[tuple[Path, str, int]] = []
        for p, what, st in _entries(path / "blobs"):
            if what == ".tmp":
                if now - st.st_mtime > TEMP_AGE:
                    doomed.append((p, what, st.st_size))
                else:
                    report.temp_kept += 1
            elif not what:
                report.other_files += 1
            elif what in live:
                report.kept += 1
                report.kept_bytes += st.st_size
            else:
                doomed.append((p, what, st.st_size))
        for p, what, size in doomed:
            if not dry_run:
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    msg = (f"{exc.strerror}: removed {report.removed} blobs and "
                           f"{report.temp_removed} temporary files before this one; every "
                           "referenced blob is intact")
                    if exc.errno in WRITE_ERRNOS:
                        raise WriteFailed(msg, str(p)) from None
                    raise BadInput(msg, str(p)) from None
            if what == ".tmp":
                report.temp_removed += 1
                report.temp_removed_bytes += size
            else:
                report.removed += 1
                report.removed_bytes += size
                report.removed_shas.append(what)
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    report.seconds = time.perf_counter() - t0
    return report


OFFLOAD_FILE = "OFFLOAD"
"""``STORE/OFFLOAD``: the blob directory old tool output was moved to (``BlobStore``
reads a blob there when the store's own copy is gone)."""


def offload(blobs: BlobStore, shas: list[str], store: Path, to: Path) -> int:
    """Copy ``shas`` into ``to``'s blob directory (an archive's ``blobs/``, or ``to``
    itself), synced, and name it in ``STORE/OFFLOAD`` before any is removed here."""
    dest = BlobStore(to / "blobs" if (to / "STENOGRAPH-ARCHIVE").exists() else to)
    moved = 0
    for sha in shas:
        if not blobs.has(sha):
            continue
        data = blobs.get(sha)
        dest.put_new(data)
        moved += 1
    if moved:
        dest.root.mkdir(parents=True, exist_ok=True)
        dest.sync()
        mark = store / OFFLOAD_FILE
        tmp = store / (OFFLOAD_FILE + ".tmp")
        tmp.write_text(str(dest.root.resolve()) + "\n")
        os.replace(tmp, mark)
    return moved
