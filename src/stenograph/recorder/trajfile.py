"""Trajectory files (``.steno``): one trajectory, self-contained.

Same framing as a store segment, magic ``STENOTRJ``. Frame 0 is the file
header (a msgpack map pinning the versions that wrote it); then the
trajectory's events, envelopes exactly as in the store (original LSNs kept, so
a report can point back into the source store); then, optionally, one frame per
embedded blob, a map ``{"blob": sha256_hex, "data": bytes}`` (a blob larger than
``BLOB_PART`` in consecutive parts, ``{"blob", "part": i, "parts": n, "data"}``).

A trajectory file is written to a temporary name, synced and renamed, so it is
never torn: any bad frame in one is corruption (exit 3), unlike a store's tail.

A file is self-describing: every blob its events reference is either embedded
or listed in the header's ``external_blobs`` (a ``--no-blobs`` export), and the
header's ``blobs`` counts the embedded ones. ``read_trajectory`` refuses a file
that breaks this as corrupt, naming the missing blob, so a replay never finds a
hole halfway through.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder import segment
from stenograph.recorder.blobs import BlobRef, BlobStore, blob_refs
from stenograph.recorder.codec import (
    Event,
    decode_payload,
    encode_event,
    frame,
    pack_body,
    unpack,
)
from stenograph.recorder.errors import BadInput, CorruptLog, StenographError
from stenograph.recorder.kinds import WRITTEN_VERSION
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import (
    HEADER_SIZE,
    TRAJ_MAGIC,
    FrameScanner,
    SegmentHeader,
    fsync_dir,
    map_file,
    read_header,
)
from stenograph.recorder.snapshots import MapBlobs, closure
from stenograph.version import __version__

SUFFIX = ".steno"


class BlobMap(dict[str, bytes]):
    """The embedded blobs by hash; a missing one is ``CorruptLog``, not ``KeyError``.

    Replay code indexes it by the hashes events reference; a file that lists a
    blob as external (or a hand-made ``TrajectoryFile``) must still fail with one
    line and the corrupt exit code rather than a traceback.
    """

    where: str = "trajectory file"

    def __missing__(self, sha: str) -> bytes:
        raise CorruptLog(f"blob {sha} is referenced but not embedded in the file",
                         self.where, 0)


@dataclass(slots=True)
class TrajectoryFile:
    header: dict[str, Any]
    events: list[Event]
    blobs: dict[str, bytes] = field(default_factory=BlobMap)

    @property
    def traj(self) -> str:
        return str(self.header["traj"])


BLOB_PART = 32 << 20
"""An embedded blob larger than this travels in parts of this size (a frame carries at
most ``codec.MAX_FRAME``): ``{"blob", "part", "parts", "data"}``, in order."""


def blob_frames(sha: str, data: bytes) -> list[bytes]:
    """The frames of one embedded blob: one for most, parts for a large one."""
    if len(data) <= BLOB_PART:
        return [frame(msgpack.packb({"blob": sha, "data": data}, use_bin_type=True))]
    n = -(-len(data) // BLOB_PART)
    return [frame(msgpack.packb({"blob": sha, "part": i, "parts": n,
                                 "data": data[i * BLOB_PART:(i + 1) * BLOB_PART]},
                                use_bin_type=True)) for i in range(n)]


@dataclass(frozen=True)
class Written:
    """What ``write_trajectory`` wrote: the file's header (its counts)."""

    header: dict[str, Any]

    @property
    def events(self) -> int:
        return int(self.header["events"])

    @property
    def blobs(self) -> int:
        return int(self.header["blobs"])


def write_trajectory(
    out: str | Path,
    traj: str,
    events: Iterable[Event] | Callable[[], Iterable[Event]],
    *,
    blobs: BlobStore | None = None,
    extra: dict[str, Any] | None = None,
) -> Written:
    """Write ``events`` (all of one trajectory) to ``out`` atomically.

    ``events`` may be a function that gives them afresh each time it is called (a
    store's reader): then memory does not grow with their number -- a first pass counts
    them and gathers the blobs they reference (the header, the file's first frame, says
    both), a second writes them as they come; the blobs follow one at a time. The file
    is a temporary one, synced and renamed.

    With ``blobs``, every blob the events reference is embedded; a referenced
    blob missing from the store is an error, not a silently thinner file.
    """
    out = Path(out)
    if not callable(events):
        evs = events if isinstance(events, (list, tuple)) else list(events)
        events = lambda: evs  # noqa: E731
    refs: dict[str, BlobRef] = {}
    external: set[str] = set()
    count, first, last = 0, 0, 0
    for ev in events():
        first, last, count = first if count else ev.lsn, ev.lsn, count + 1
        found = blob_refs(ev.body)
        if ev.kind == "Checkpoint" and blobs is not None and found:
            found = closure(blobs, found[0])  # the snapshot's manifests and files
        for ref in found:
            if blobs is None:
                external.add(ref.sha256)
            else:
                refs.setdefault(ref.sha256, ref)
    header: dict[str, Any] = {
        "format": WRITTEN_VERSION,
        "stenograph": __version__,
        "traj": traj,
        "events": count,
        "first_lsn": first,
        "last_lsn": last,
        "blobs": len(refs),
        **({"external_blobs": sorted(external)} if external else {}),
        **(extra or {}),
    }
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(SegmentHeader(TRAJ_MAGIC, WRITTEN_VERSION, 0, 0).pack())
            f.write(frame(msgpack.packb(header, use_bin_type=True)))
            written = 0
            for ev in events():
                if written == count:  # appended since the first pass: not in this file
                    break
                f.write(encode_event(ev))
                written += 1
            if written != count:
                raise StenographError(f"the trajectory changed while it was written "
                                      f"({count} events, then {written})", str(out))
            for sha in sorted(refs):
                assert blobs is not None
                f.writelines(blob_frames(sha, blobs.get(refs[sha])))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException as exc:  # a full disk: no half file, and ``out`` as it was
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(out)) from None
        raise
    try:
        fsync_dir(out.parent if str(out.parent) else Path("."))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(out)) from None
    return Written(header)


def export_trajectory(
    store_path: str | Path, traj: str, out: str | Path, *, embed_blobs: bool = True
) -> Written:
    """Export one trajectory of a store (read-only; a live writer may hold it), its
    events streamed from the store to the file."""
    if next(StoreReader(store_path).events(traj=traj), None) is None:
        raise BadInput(f"no trajectory {traj!r} in the store", str(store_path))
    blobs = BlobStore(Path(store_path) / "blobs") if embed_blobs else None
    return write_trajectory(out, traj, lambda: StoreReader(store_path).events(traj=traj),
                            blobs=blobs)


def _decode(payload: bytes, version: int) -> Any:
    obj = unpack(payload)
    if isinstance(obj, dict):
        return obj
    return decode_payload(payload, version)


def read_trajectory(path: str | Path, *, lazy_tape: bool = False) -> TrajectoryFile:
    """Read and fully check a trajectory file. ``lazy_tape``: every large ``TapeChunk``
    body is a ``{"proc", "thread", "$frame": FrameRef}`` read again when its records are
    asked for, so the events of a run of any length fit in memory (a replay)."""
    path = Path(path)
    name = str(path)
    if not path.exists():
        raise BadInput("no such file", name)
    if path.is_dir():
        raise BadInput("is a directory, not a trajectory file", name)
    buf = map_file(path)
    hdr = read_header(buf, name, TRAJ_MAGIC)
    header: dict[str, Any] | None = None
    events: list[Event] = []
    blobs = BlobMap()
    blobs.where = name
    first_use: dict[str, tuple[int, Event]] = {}
    scanner = FrameScanner(buf, name, torn_ok=False, version=hdr.version, decode=_decode)
    prev_lsn: int | None = None
    partial: dict[str, list[bytes]] = {}
    pending: str | None = None  # a blob whose parts are still coming
    for off, _size, item in scanner:
        if header is None:
            if not isinstance(item, dict) or not isinstance(item.get("traj"), str):
                raise CorruptLog("first frame is not a trajectory header", name, off)
            header = item
        elif isinstance(item, Event):
            if blobs:
                raise CorruptLog("event after the blob section", name, off)
            if item.traj != header["traj"]:
                raise CorruptLog(f"event of trajectory {item.traj!r} in a file of "
                                 f"{header['traj']!r}", name, off)
            if item.seq != len(events) or item.prev != prev_lsn:
                raise CorruptLog(f"event seq {item.seq} out of order", name, off)
            prev_lsn = item.lsn
            if lazy_tape:
                item = segment.lazy_chunk(item, name, off, _size, hdr.version)
            events.append(item)
            try:
                refs = blob_refs(item.body)
            except BadInput as exc:
                raise CorruptLog(f"event seq {item.seq}: {exc.what}", name, off) from None
            for ref in refs:
                first_use.setdefault(ref.sha256, (off, item))
        elif isinstance(item, dict) and isinstance(item.get("blob"), str):
            data = item.get("data")
            if not isinstance(data, bytes):
                raise CorruptLog("embedded blob has no bytes", name, off)
            part, nparts = item.get("part", 0), item.get("parts", 1)
            if not isinstance(part, int) or not isinstance(nparts, int) or \
                    not 0 <= part < nparts:
                raise CorruptLog("embedded blob part out of range", name, off)
            pieces = partial.setdefault(item["blob"], [])
            if part != len(pieces) or (pending not in (None, item["blob"])):
                raise CorruptLog("embedded blob parts out of order", name, off)
            pieces.append(data)
            pending = item["blob"] if part + 1 < nparts else None
            if pending is None:
                whole = b"".join(partial.pop(item["blob"]))
                if hashlib.sha256(whole).hexdigest() != item["blob"]:
                    raise CorruptLog("embedded blob does not match its hash", name, off)
                blobs[item["blob"]] = whole
        else:
            raise CorruptLog("frame is neither an event nor a blob", name, off)
    if pending is not None:
        raise CorruptLog(f"embedded blob {pending} ends before its last part", name,
                         scanner.tail.end if scanner.tail else 0)
    if header is None:
        raise CorruptLog("trajectory file has no header frame", name, 32)
    if header.get("events") != len(events):
        raise CorruptLog(
            f"header promises {header.get('events')} events, file holds {len(events)}",
            name, scanner.tail.end if scanner.tail else 0,
        )
    _check_blobs(header, blobs, first_use, name, scanner.tail.end if scanner.tail else 0)
    _check_snapshots(events, blobs, header, name)
    return TrajectoryFile(header, events, blobs)


def _check_snapshots(events: list[Event], blobs: dict[str, bytes], header: dict[str, Any],
                     name: str) -> None:
    """Refuse a file holding a checkpoint whose snapshot it does not wholly hold."""
    if header.get("external_blobs"):
        return  # exported without blobs (--no-blobs): the store has them
    for ev in events:
        if ev.kind != "Checkpoint":
            continue
        refs = blob_refs(ev.body)
        try:
            if refs:
                for ref in closure(MapBlobs(blobs), refs[0]):
                    if ref.sha256 not in blobs:
                        raise CorruptLog(f"snapshot blob {ref.sha256[:16]}... is missing",
                                         name, 0)
        except CorruptLog as exc:
            raise CorruptLog(f"checkpoint (event seq {ev.seq}): {exc.args[0]}", name,
                             0) from None
        except BadInput as exc:
            raise CorruptLog(f"checkpoint (event seq {ev.seq}): {exc}", name, 0) from None


def _check_blobs(header: dict[str, Any], blobs: dict[str, bytes],
                 first_use: dict[str, tuple[int, Event]], name: str, end: int) -> None:
    """Refuse a file whose header or events reference a blob it neither holds nor lists."""
    external = header.get("external_blobs", [])
    if not isinstance(external, list) or not all(isinstance(x, str) for x in external):
        raise CorruptLog("header's external_blobs is not a list of hashes", name, HEADER_SIZE)
    promised = header.get("blobs", len(blobs))
    if type(promised) is not int or promised != len(blobs):
        raise CorruptLog(f"header promises {promised!r} embedded blobs, file holds "
                         f"{len(blobs)}", name, end)
    listed = set(external)
    for sha, (off, ev) in first_use.items():
        if sha not in blobs and sha not in listed:
            raise CorruptLog(f"missing blob {sha}: referenced by event seq {ev.seq} "
                             f"(lsn {ev.lsn}) but not embedded", name, off)


def import_trajectory(store: Any, path: str | Path, *, traj: str | None = None) -> str:
    """Append a trajectory file's events to ``store`` (a ``Store``) as trajectory ``traj``.

    Events get the store's next LSNs; ``seq`` and kinds and bodies are kept.
    Refuses to merge into a trajectory the store already has.

    All or nothing on a full disk: the blobs go first, then the tail segment is made
    to hold every event (``Store.reserve``) before the first is appended; a write
    refused before that point removes the blobs this import added, so the store
    holds exactly what it held.
    """
    tf = read_trajectory(path)
    name = traj or tf.traj
    if name in store.trajectories():
        raise BadInput(f"the store already has a trajectory {name!r}", str(store.path))
    bodies = [pack_body(ev.body) for ev in tf.events]
    added: list[str] = []
    try:
        for sha, data in tf.blobs.items():
            if not store.blobs.has(sha):
                added.append(sha)
            store.blobs.put(data)
        # the frames' size, and a batch marker for each as if each were its own batch
        store.reserve(sum(len(b) + len(name) + len(ev.kind) + _FRAME_SLACK
                          for b, ev in zip(bodies, tf.events, strict=True)))
    except OSError:
        for sha in added:
            with contextlib.suppress(OSError):
                store.blobs.path_of(sha).unlink()
        raise
    for ev, body in zip(tf.events, bodies, strict=True):
        store.append_packed(name, ev.kind, body, durable=False)
    store.flush()
    return name


_FRAME_SLACK = 160
"""Bytes beyond body, trajectory id and kind one event can take in a segment: its frame
header and envelope (LSN, seq, prev) and a salted batch marker, rounded up."""
