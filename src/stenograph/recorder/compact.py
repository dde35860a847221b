"""Remove whole trajectories from a store's log, once they are archived elsewhere.

The log is append-only while it is written; removing a trajectory rewrites each
segment that holds one of its events. Kept events keep their bytes, LSNs and ``prev``
pointers; each run of removed events becomes one *hole* frame ``[first_lsn, count]``
(``codec.Hole``), so a reader still checks that no LSN is missing and a writer never
reuses one. A segment that holds a hole is written as format version 2; every other
segment is left as it is.

Why it is safe to be killed anywhere: a segment's new content is written beside it
(``NNN.seg.compact.tmp``), synced, and renamed over it, and the directory synced. A
kill leaves each segment wholly old or wholly new, and the removed events were
archived (durably, and verified) before this runs; a temporary file left behind is
removed by the next writer's open. The caller holds the store's lock, as ``gc`` does:
nothing appends while a segment is rewritten.

Batch markers are dropped from rewritten segments: they prove which batches were
acknowledged, and every batch of a segment being compacted is (the lock's holder
read it whole). The last segment keeps its size, zeros after the data, so the next
writer appends in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stenograph.recorder.codec import Event, Hole, hole
from stenograph.recorder.kinds import HOLE_VERSION
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import (
    HEADER_SIZE,
    WAL_MAGIC,
    SegmentHeader,
    fsync_dir,
    map_file,
    read_header,
)


@dataclass
class Compacted:
    """What ``drop_trajectories`` did."""

    segments: int = 0
    events: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def drop_trajectories(store: Path, trajs: set[str]) -> Compacted:
    """Remove every event of ``trajs`` from ``store``'s segments (the caller holds the
    store's lock). Returns what was rewritten."""
    out = Compacted()
    if not trajs:
        return out
    reader = StoreReader(store)
    touched: dict[Path, list[tuple[int, int, Event | int | Hole]]] = {}
    current: list[tuple[int, int, Event | int | Hole]] = []
    seg_of: Path | None = None
    hit = False
    for seg, off, size, item in reader.frames():
        if seg != seg_of:
            if seg_of is not None and hit:
                touched[seg_of] = current
            seg_of, current, hit = seg, [], False
        current.append((off, size, item))
        if isinstance(item, Event) and item.traj in trajs:
            hit = True
    if seg_of is not None and hit:
        touched[seg_of] = current
    last = reader.segments[-1] if reader.segments else None
    for seg, frames in touched.items():
        _rewrite(seg, frames, trajs, keep_size=seg == last, out=out)
    if touched:
        fsync_dir(store / "wal")
    return out


def _rewrite(seg: Path, frames: list[tuple[int, int, Event | int | Hole]], trajs: set[str],
             *, keep_size: bool, out: Compacted) -> None:
    buf = map_file(seg)
    old = read_header(buf, str(seg), WAL_MAGIC)
    parts: list[bytes] = []
    run: list[int] = []  # [first_lsn, count] of the removed run being gathered

    def close_run() -> None:
        if run:
            parts.append(hole(run[0], run[1]))
            run.clear()

    end = HEADER_SIZE
    for off, size, item in frames:
        end = off + size
        gone: tuple[int, int] | None = None
        if isinstance(item, Event) and item.traj in trajs:
            gone = (item.lsn, 1)
            out.events += 1
        elif isinstance(item, Hole):
            gone = (item.first_lsn, item.count)
        if gone is not None:
            if run and run[0] + run[1] == gone[0]:
                run[1] += gone[1]
            else:
                close_run()
                run.extend(gone)
            continue
        if isinstance(item, Event):
            close_run()
            parts.append(bytes(buf[off:off + size]))
    close_run()
    data = SegmentHeader(old.magic, max(old.version, HOLE_VERSION), old.number,
                         old.first_lsn).pack() + b"".join(parts)
    size = max(len(buf), len(data)) if keep_size else len(data)
    out.segments += 1
    out.bytes_before += end
    out.bytes_after += len(data)
    tmp = seg.with_name(seg.name + ".compact.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        zeros = bytes(1 << 20)
        left = size - len(data)
        while left > 0:  # written, not a sparse tail: the next writer overwrites blocks
            left -= os.write(fd, zeros[:min(left, len(zeros))])
        os.fsync(fd)
    finally:
        os.close(fd)
    del buf
    os.replace(tmp, seg)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
