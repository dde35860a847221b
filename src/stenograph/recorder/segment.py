"""Segment files: a 32-byte header, then frames, then zero fill.

Segments are zero-filled to their full size when created (in the background,
ahead of need): overwriting allocated blocks lets ``fdatasync`` flush data only,
where appending to a growing file also has to commit the new size and extents.
A frame header of all zeros therefore marks the end of the data.

This module also owns the scan that finds where a segment's valid data ends and
decides whether damage is a torn tail (cut it) or corruption (refuse). That
decision searches the bytes after the damage for a batch marker; in a store with
a salt only a marker whose keyed tag matches its own segment and offset counts,
so no event body (nor a copy of a real marker inside one) can pass for a later
batch (see ``codec``).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stenograph.recorder.codec import (
    FRAME_HEADER,
    MAX_FRAME,
    Event,
    SaltedMarker,
    decode_payload,
    marker_tag,
)
from stenograph.recorder.errors import BadInput, CorruptLog, FormatVersionError, StenographError
from stenograph.recorder.kinds import FORMAT_VERSION

HEADER = struct.Struct("<8sHHIQQ")
HEADER_SIZE = HEADER.size
WAL_MAGIC = b"STENOWAL"
TRAJ_MAGIC = b"STENOTRJ"
_ZERO_CHUNK = bytes(1 << 16)
# A legacy batch marker frame: length 1..16, any crc, payload a one-element msgpack array.
_MARKER_RE = re.compile(rb"[\x01-\x10]\x00\x00\x00.{4}\x91", re.DOTALL)
# A salted one: length 12..20 ([uint, bin8 of 8 bytes]), any crc, a two-element array.
_SALTED_RE = re.compile(rb"[\x0c-\x14]\x00\x00\x00.{4}\x92", re.DOTALL)


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """The fixed header of a segment or trajectory file."""

    magic: bytes
    version: int
    number: int
    first_lsn: int

    def pack(self) -> bytes:
        return HEADER.pack(self.magic, self.version, 0, 0, self.number, self.first_lsn)


def read_header(buf: bytes | mmap.mmap, name: str, magic: bytes) -> SegmentHeader:
    """Parse and check a header; bad input is reported with the file's name."""
    if len(buf) == 0:
        raise BadInput("empty file, not a stenograph log", name)
    if len(buf) < HEADER_SIZE:
        raise BadInput("file too short for a stenograph header", name)
    got_magic, version, _flags, _res, number, first_lsn = HEADER.unpack_from(buf, 0)
    if got_magic != magic:
        other = {WAL_MAGIC: "a store segment", TRAJ_MAGIC: "a trajectory file"}.get(got_magic)
        what = f"this is {other}, not the expected kind of file" if other else "wrong magic"
        raise BadInput(f"{what}: not a stenograph {_what(magic)}", name)
    if version > FORMAT_VERSION or version == 0:
        raise FormatVersionError(
            f"written in log format version {version}; this build reads up to "
            f"version {FORMAT_VERSION} (upgrade stenograph)",
            name,
        )
    return SegmentHeader(got_magic, version, number, first_lsn)


def _what(magic: bytes) -> str:
    return "store segment" if magic == WAL_MAGIC else "trajectory file"


@dataclass(slots=True)
class Tail:
    """Where the valid data of a scanned region ends, and what was after it."""

    end: int
    dropped: int = 0
    reason: str | None = None


class FrameScanner:
    """Iterate the frames of one segment or trajectory file.

    Yields ``(offset, frame_size, Event | marker_lsn)``. When iteration ends, ``tail`` says
    where valid data ended. Damage raises ``CorruptLog`` unless ``torn_ok`` (the
    last segment of a store) and no batch marker follows it: with no later batch
    on disk, the damaged frame belongs to a batch whose sync never returned.

    With ``salt`` (the store's), a salted marker must carry the tag of segment
    ``number`` at its offset, and the search after damage trusts only such
    markers; legacy ``[lsn]`` markers are still read in sequence (they sit where
    the writer put them) but prove nothing after damage, since any body can hold
    their bytes. Without a salt (a store made before salts), the legacy search.
    """

    def __init__(
        self,
        buf: bytes | mmap.mmap,
        name: str,
        *,
        start: int = HEADER_SIZE,
        torn_ok: bool,
        version: int = FORMAT_VERSION,
        decode: Callable[[bytes, int], object] = decode_payload,
        salt: bytes | None = None,
        number: int = 0,
    ) -> None:
        self.decode = decode
        self.salt = salt
        self.number = number
        self.buf = buf
        self.name = name
        self.start = start
        self.torn_ok = torn_ok
        self.version = version
        self.tail: Tail | None = None

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        buf, limit, off = self.buf, len(self.buf), self.start
        released = 0
        unpack_header = FRAME_HEADER.unpack_from
        while True:
            if off + 8 > limit:
                if _all_zero(buf, off, limit):
                    self.tail = Tail(off)
                else:
                    self._damage(off, "short frame at end of file")
                return
            length, crc = unpack_header(buf, off)
            if length == 0 and crc == 0:
                if _all_zero(buf, off, limit):
                    self.tail = Tail(off)
                elif self._being_written(off):
                    continue
                else:
                    self._damage(off, "zeroed frame header before more data")
                return
            body_at = off + 8
            if length > MAX_FRAME or body_at + length > limit:
                if self._being_written(off):
                    continue
                self._damage(off, "frame length runs past the end of the file")
                return
            payload = buf[body_at : body_at + length]
            if zlib.crc32(payload) != crc:
                if self._being_written(off):
                    continue
                self._damage(off, "checksum mismatch")
                return
            try:
                item = self.decode(payload, self.version)
            except ValueError as exc:
                self._damage(off, f"frame payload is not an event ({exc})")
                return
            if isinstance(item, SaltedMarker):
                if self.salt is None or item.tag != marker_tag(
                        self.salt, self.number, off, item.first_lsn):
                    if off == self.start:  # placed by the header alone: no tear puts it there
                        raise CorruptLog("batch marker was made for another store or segment "
                                         "(salt in STENOGRAPH-STORE replaced?)", self.name, off)
                    self._damage(off, "batch marker does not belong at this offset")
                    return
                item = item.first_lsn
            yield off, 8 + length, item
            off = body_at + length
            if off - released > RELEASE_EVERY:
                released = _release(buf, released, off)

    def _being_written(self, off: int) -> bool:
        """The live tail of a store another process writes (a host recorder serving other
        recordings while this one reads): a batch may be half copied into the file as it
        is looked at -- a zeroed header with the writer's later pages already there. Wait
        (``LIVE_WAIT`` at most) for the frame at ``off`` to be whole: True if it became so,
        and is read again; damage that stays is damage."""
        if not self.torn_ok or not isinstance(self.buf, mmap.mmap):
            return False
        deadline = time.monotonic() + LIVE_WAIT
        while time.monotonic() < deadline:
            time.sleep(0.001)
            length, crc = FRAME_HEADER.unpack_from(self.buf, off)
            end = off + 8 + length
            if (length or crc) and length <= MAX_FRAME and end <= len(self.buf) and \
                    zlib.crc32(self.buf[off + 8:end]) == crc:
                return True
        return False

    def _damage(self, off: int, reason: str) -> None:
        if not self.torn_ok:
            raise CorruptLog(reason, self.name, off)
        if _marker_after(self.buf, off + 1, len(self.buf), self.salt, self.number):
            raise CorruptLog(f"{reason}; later batches were acknowledged", self.name, off)
        self.tail = Tail(off, _last_nonzero(self.buf, off, len(self.buf)) - off, reason)


LIVE_WAIT = 0.5
"""Seconds a reader of a live store waits for a half-written frame to be whole."""

LAZY_OVER = 4096
"""With ``lazy_tape``, a ``TapeChunk`` frame larger than this is read again when used."""


@dataclass(frozen=True)
class FrameRef:
    """Where a ``TapeChunk``'s records are in a segment or trajectory file, for a reader
    that keeps the events of a long run but not their tape (``lazy_chunk``;
    ``chunks.chunk_data`` follows it)."""

    path: str
    offset: int
    size: int
    version: int

    def body(self) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            raw = os.pread(f.fileno(), self.size, self.offset)
        item = next(iter(FrameScanner(raw, self.path, start=0, torn_ok=False,
                                      version=self.version)), None)
        if item is None or not isinstance(item[2], Event):
            raise CorruptLog("a tape chunk's frame changed since the file was read",
                             self.path, self.offset)
        return item[2].body


def lazy_chunk(ev: Any, path: str, offset: int, size: int, version: int) -> Any:
    """``ev``, or for a large ``TapeChunk`` (not a cut marker) the same event whose body
    is ``{"proc", "thread", "$frame": FrameRef}``: the events of a run of any length fit
    in memory, its tape read again, one chunk at a time, when it is prepared."""
    if not isinstance(ev, Event) or ev.kind != "TapeChunk" or size <= LAZY_OVER or \
            "cut" in ev.body:
        return ev
    return Event(ev.lsn, ev.traj, ev.seq, ev.prev, ev.kind, {
        "proc": ev.body.get("proc"), "thread": ev.body.get("thread"),
        "$frame": FrameRef(path, offset, size, version)})


RELEASE_EVERY = 8 << 20
"""A scan of a mapped file gives back the pages it has read every this many bytes: a
reader's memory does not grow with the file (every frame it yields is a copy)."""


def _release(buf: bytes | mmap.mmap, lo: int, hi: int) -> int:
    """``madvise(DONTNEED)`` the whole pages of ``buf[lo:hi]``; the new low mark."""
    if not isinstance(buf, mmap.mmap):
        return hi
    hi -= hi % mmap.PAGESIZE
    if hi > lo:
        buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return max(lo, hi)


def _all_zero(buf: bytes | mmap.mmap, lo: int, hi: int) -> bool:
    return _last_nonzero(buf, lo, hi) == lo


def _last_nonzero(buf: bytes | mmap.mmap, lo: int, hi: int) -> int:
    """One past the last non-zero byte in ``buf[lo:hi]``, or ``lo`` if none."""
    pos = hi
    while pos > lo:
        chunk_lo = max(lo, pos - len(_ZERO_CHUNK))
        chunk = buf[chunk_lo:pos]
        if chunk != _ZERO_CHUNK[: len(chunk)]:
            return chunk_lo + len(chunk.rstrip(b"\0"))
        pos = chunk_lo
    return lo


def _marker_after(buf: bytes | mmap.mmap, lo: int, hi: int, salt: bytes | None,
                  number: int) -> bool:
    """Whether a batch marker the writer wrote lies in ``buf[lo:hi]``."""
    for m in (_MARKER_RE if salt is None else _SALTED_RE).finditer(buf, lo, hi):
        at = m.start()
        length, crc = FRAME_HEADER.unpack_from(buf, at)
        payload = bytes(buf[at + 8 : at + 8 + length])
        if len(payload) != length or zlib.crc32(payload) != crc:
            continue
        try:
            item = decode_payload(payload, FORMAT_VERSION)
        except (ValueError, StenographError):
            continue
        if salt is None:
            if isinstance(item, int):
                return True
        elif isinstance(item, SaltedMarker) and item.tag == marker_tag(
                salt, number, at, item.first_lsn):
            return True
    return False


def map_file(path: Path) -> mmap.mmap | bytes:
    """Map a file read-only (empty files cannot be mapped: return b'')."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def segment_name(number: int) -> str:
    return f"{number:010d}.seg"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def zero_fill(path: Path, size: int) -> None:
    """Create ``path`` as ``size`` zero bytes, synced (a spare segment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = bytes(1 << 20)
        left = size
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """The open tail segment: positional vectored writes, then ``fdatasync``."""

    IOV_MAX = 1024

    def __init__(self, path: Path, header: SegmentHeader, end: int) -> None:
        self.path = path
        self.header = header
        self.fd = os.open(path, os.O_WRONLY)
        self.size = max(os.fstat(self.fd).st_size, end)
        self.end = end

    def room(self) -> int:
        return self.size - self.end

    def write(self, parts: list[bytes], nbytes: int) -> None:
        """Write ``parts`` (``nbytes`` in all) at the end with one ``pwritev``."""
        if len(parts) > self.IOV_MAX:
            parts = [b"".join(parts)]
        done = os.pwritev(self.fd, parts, self.end)
        if done != nbytes:  # short writes only happen on a full disk; finish them
            data = b"".join(parts)
            while done < nbytes:
                done += os.pwrite(self.fd, data[done:], self.end + done)
        self.end += nbytes
        self.size = max(self.size, self.end)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def zero_from(self, offset: int, length: int) -> None:
        """Overwrite a torn tail with zeros so the file ends cleanly again."""
        left, at = length, offset
        while left > 0:
            n = os.pwrite(self.fd, _ZERO_CHUNK[: min(left, len(_ZERO_CHUNK))], at)
            left -= n
            at += n
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
