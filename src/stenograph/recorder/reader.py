"""Read a store (a directory of segments) or a trajectory file.

Readers never modify anything. On a store's last segment a torn tail is
*reported* (``torn``), not cut; only the writer (``Store.open``) cuts it.
Every reader is total: bytes it cannot read raise a ``StenographError``
(``CorruptLog``, ``BadInput``), never anything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.codec import SALT_SIZE, Event, Hole
from stenograph.recorder.errors import BadInput, CorruptLog, NotAStore
from stenograph.recorder.segment import (
    HEADER_SIZE,
    WAL_MAGIC,
    FrameScanner,
    SegmentHeader,
    Tail,
    lazy_chunk,
    map_file,
    read_header,
)

STORE_MARKER = "STENOGRAPH-STORE"


def read_salt(path: Path) -> bytes | None:
    """The store's marker salt from ``STENOGRAPH-STORE`` (None: a store made before salts).

    A malformed salt line is refused rather than ignored: reading without the
    salt would trust forgeable legacy markers in a store that never wrote any.
    """
    where = str(path / STORE_MARKER)
    try:
        text = (path / STORE_MARKER).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("store metadata is not text", where) from None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "salt":
            try:
                salt = bytes.fromhex(value.strip())
            except ValueError:
                salt = b""
            if len(salt) != SALT_SIZE:
                raise BadInput(f"store metadata has a malformed salt line {line[:80]!r}", where)
            return salt
    return None


@dataclass(slots=True)
class TrajSummary:
    traj: str
    events: int = 0
    bytes: int = 0
    first_lsn: int = 0
    last_lsn: int = 0
    last_seq: int = -1
    kinds: dict[str, int] = field(default_factory=dict)
    parent: dict[str, Any] | None = None
    """The recording a fork was made from (its ``RunStarted``'s ``parent``)."""


@dataclass(slots=True)
class TornTail:
    segment: str
    offset: int
    dropped: int
    reason: str


def is_store(path: Path) -> bool:
    return (path / STORE_MARKER).is_file() and (path / "wal").is_dir()


def check_store(path: Path) -> None:
    if not path.exists():
        raise BadInput("no such store", str(path))
    if not path.is_dir():
        raise NotAStore("not a store directory", str(path))
    if not is_store(path):
        raise NotAStore(
            f"directory is not a stenograph store (no {STORE_MARKER} file and wal/)", str(path)
        )


def _first_lsn(seg: Path) -> int:
    """The first LSN of segment ``seg`` (its header), or 0 if it cannot be read."""
    try:
        return read_header(map_file(seg), str(seg), WAL_MAGIC).first_lsn
    except (OSError, CorruptLog, ValueError):
        return 0


class StoreReader:
    """Iterate a store's events in LSN order, checking frames and continuity."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        check_store(self.path)
        self.segments = sorted(p for p in (self.path / "wal").glob("*.seg"))
        self.torn: TornTail | None = None
        self.end_offset = HEADER_SIZE
        self.last_header: SegmentHeader | None = None
        self.next_lsn = 1
        self.salt = read_salt(self.path)
        self._versions: dict[Path, int] = {}

    def events(self, *, traj: str | None = None, from_lsn: int = 0,
               lazy_tape: bool = False) -> Iterator[Event]:
        """Every event (of ``traj``, from ``from_lsn``), in LSN order. ``lazy_tape``: a
        large ``TapeChunk``'s records are read again from the segment when used
        (``segment.lazy_chunk``)."""
        for seg, off, size, ev in self.frames(skip_before=from_lsn):
            if isinstance(ev, Event) and ev.lsn >= from_lsn and (traj is None or ev.traj == traj):
                yield lazy_chunk(ev, str(seg), off, size, self._versions[seg]) \
                    if lazy_tape else ev

    def frames(self, *, skip_before: int = 0
               ) -> Iterator[tuple[Path, int, int, Event | int | Hole]]:
        """Every frame with its segment, offset and size; markers are ints, the events an
        archive removed are ``Hole``s.
        ``skip_before``: segments whose events all come before that LSN are not read (a
        shipper's cursor); a trajectory first met after them starts where it is met."""
        expect_lsn: int | None = None
        expect_number: int | None = None
        seq_of: dict[str, tuple[int, int]] = {}
        partial = False
        for i, seg in enumerate(self.segments):
            last = i == len(self.segments) - 1
            if skip_before and not last and _first_lsn(self.segments[i + 1]) <= skip_before:
                partial = True
                continue
            buf = map_file(seg)
            name = str(seg)
            header = read_header(buf, name, WAL_MAGIC)
            self._versions[seg] = header.version
            if partial and expect_number is None:  # (the first segment read)
                expect_number, expect_lsn = header.number, header.first_lsn
            if expect_number is not None and header.number != expect_number:
                raise CorruptLog(f"segment number {header.number}, expected {expect_number}",
                                 name, 0)
            if expect_lsn is not None and header.first_lsn != expect_lsn:
                raise CorruptLog(f"segment starts at lsn {header.first_lsn}, expected {expect_lsn}",
                                 name, 0)
            if seg.stem.isdigit() and int(seg.stem) != header.number:
                raise CorruptLog(f"segment number {header.number} in a file named {seg.name}",
                                 name, 0)
            expect_number = header.number + 1
            expect_lsn = header.first_lsn
            if self.salt is None:  # a writer may have salted the store since we opened it
                self.salt = read_salt(self.path)
            scanner = FrameScanner(buf, name, torn_ok=last, version=header.version,
                                   salt=self.salt, number=header.number)
            for off, size, item in scanner:
                if isinstance(item, Event):
                    if item.lsn != expect_lsn:
                        raise CorruptLog(f"lsn {item.lsn} where {expect_lsn} was expected",
                                         name, off)
                    prev_seq, prev_lsn = seq_of.get(item.traj, (-1, None))
                    if partial and item.traj not in seq_of:
                        prev_seq, prev_lsn = item.seq - 1, item.prev
                    if item.seq != prev_seq + 1 or item.prev != prev_lsn:
                        raise CorruptLog(
                            f"trajectory {item.traj!r}: seq {item.seq}/prev {item.prev} does not "
                            f"follow seq {prev_seq}/lsn {prev_lsn}", name, off)
                    seq_of[item.traj] = (item.seq, item.lsn)
                    expect_lsn += 1
                elif isinstance(item, Hole):
                    if item.first_lsn != expect_lsn:
                        raise CorruptLog(f"a hole from lsn {item.first_lsn} where {expect_lsn} "
                                         "was expected", name, off)
                    expect_lsn += item.count
                yield seg, off, size, item
            tail: Tail = scanner.tail  # type: ignore[assignment]
            if last:
                self.end_offset = tail.end
                self.last_header = header
                if tail.reason is not None:
                    self.torn = TornTail(name, tail.end, tail.dropped, tail.reason)
        self.next_lsn = expect_lsn if expect_lsn is not None else 1

    def summary(self) -> dict[str, TrajSummary]:
        """Per-trajectory counts, sizes and kinds (one full scan)."""
        out: dict[str, TrajSummary] = {}
        for _seg, _off, size, item in self.frames():
            if isinstance(item, Event):
                s = out.get(item.traj)
                if s is None:
                    s = out[item.traj] = TrajSummary(item.traj, first_lsn=item.lsn)
                s.events += 1
                s.last_lsn = item.lsn
                s.last_seq = item.seq
                s.kinds[item.kind] = s.kinds.get(item.kind, 0) + 1
                s.bytes += size
                if item.kind == "RunStarted" and s.parent is None and isinstance(
                        item.body.get("parent"), dict):
                    s.parent = item.body["parent"]
        return out
