"""Event envelope and frame codec.

A frame is ``u32 length | u32 crc32(payload) | payload``; the payload of an
event is a msgpack array ``[lsn, traj, seq, prev, kind, body]``. An array, not a
map, because it is smaller and faster to pack and unpack, and the envelope is
fixed by the format version anyway.

The other payload is the *batch marker*: the group-commit writer puts one in
front of every batch. Batches are written strictly one after another, each after
the previous one's ``fdatasync`` returned, so a valid marker found after a
damaged frame proves that frame was acknowledged. Recovery uses this to tell a
torn final batch (cut it) from damage to acknowledged data (refuse).

That proof only holds if no event body can contain a valid marker. A marker is
therefore ``[first_lsn, tag]``, where ``tag`` is a keyed hash (BLAKE2b, 8 bytes)
of the segment number, the marker's own offset and ``first_lsn``, keyed with the
store's random salt (``STENOGRAPH-STORE``). A program that writes events never
sees the salt, and a copy of a real marker inside a body sits at another offset,
so neither verifies. Stores made before the salt existed wrote ``[first_lsn]``;
those markers are still read, but only trusted by the recovery scan of a store
that has no salt (see ``segment.FrameScanner``).

Decoding is total: whatever the bytes, ``decode_payload`` returns or raises
``BadPayload`` (a ``ValueError``) or ``UnknownKind``, and a decoded body is
nested at most ``MAX_DEPTH`` containers deep, so code that walks it recursively
cannot overflow the stack. ``pack_body`` refuses what the reader refuses, so the
writer never acknowledges an event it cannot read back.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from stenograph.recorder.errors import BadInput, BadPayload
from stenograph.recorder.kinds import HOLE_VERSION, check_kind

FRAME_HEADER = struct.Struct("<II")
MAX_FRAME = 64 << 20
"""Largest payload a frame may carry; bigger bodies belong in the blob store."""
MAX_DEPTH = 256
"""Deepest nesting of lists and maps an event body may have."""
TAG_SIZE = 8
SALT_SIZE = 16


@dataclass(frozen=True, slots=True)
class Event:
    """One decoded log event."""

    lsn: int
    traj: str
    seq: int
    prev: int | None
    kind: str
    body: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "lsn": self.lsn,
            "traj": self.traj,
            "seq": self.seq,
            "prev": self.prev,
            "kind": self.kind,
            "body": jsonable(self.body),
        }


def jsonable(value: Any) -> Any:
    """Make a msgpack value printable as JSON (bytes become tagged hex)."""
    if isinstance(value, bytes):
        try:
            return {"$text": value.decode("utf-8")} if value.isascii() else {"$hex": value.hex()}
        except UnicodeDecodeError:  # pragma: no cover - isascii() guards it
            return {"$hex": value.hex()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def pack_body(body: dict[str, Any]) -> bytes:
    """Pack an event body; refuse values msgpack cannot represent exactly.

    Also refuse what the reader would refuse (too deep, extension types, tuple
    keys), checked on the packed bytes exactly as the reader checks them: an
    acknowledged event the reader refuses would cost the whole store.
    """
    if not isinstance(body, dict):
        raise BadInput(f"event body must be a map, not {type(body).__name__}")
    try:
        packed = msgpack.packb(body, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadInput(f"event body cannot be encoded: {exc}") from None
    if not _flat(body):
        try:
            _checked(packed, MAX_DEPTH)
        except BadPayload as exc:
            raise BadInput(f"event body cannot be encoded: {exc.what}") from None
    return packed


_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})
_STR = frozenset({str})


def _flat(body: dict[Any, Any]) -> bool:
    """A map of str keys to plain scalars (a tape chunk): nothing the reader could refuse."""
    return _STR.issuperset(map(type, body)) and _SCALARS.issuperset(map(type, body.values()))


_ARRAY6 = b"\x96"


def envelope(lsn: int, traj: str, seq: int, prev: int | None, kind: str, body: bytes) -> bytes:
    """Pack the envelope around an already packed body (no re-encoding)."""
    head = msgpack.packb((lsn, traj, seq, prev, kind), use_bin_type=True)
    # head is a 5-array: swap its header byte (0x95) for a 6-array and append the body.
    return b"".join((_ARRAY6, head[1:], body))


def envelope_frame(
    pack: Callable[[Any], bytes],
    lsn: int,
    traj: str,
    seq: int,
    prev: int | None,
    kind: str,
    body: bytes,
) -> bytes:
    """``frame(envelope(...))`` in one step: the store's hot path.

    Same bytes, less work: the CRC is computed over the small head and the
    body in turn (zlib continues a CRC), so the payload is never assembled
    on its own and the ~KiB body is copied once, not three times. ``pack``
    is the ``pack`` method of a caller-owned ``msgpack.Packer(use_bin_type=True)``;
    reusing one instead of ``packb`` saves building a packer per event. A
    packer is not thread-safe: the caller serializes its use (the store calls
    this under its commit lock).
    """
    head = _ARRAY6 + pack((lsn, traj, seq, prev, kind))[1:]
    return (
        FRAME_HEADER.pack(len(head) + len(body), zlib.crc32(body, zlib.crc32(head)))
        + head
        + body
    )


class SaltedMarker(NamedTuple):
    """A decoded ``[first_lsn, tag]`` marker, before its tag is checked against its place."""

    first_lsn: int
    tag: bytes


class Hole(NamedTuple):
    """``[first_lsn, count, "hole"]``: events ``first_lsn .. first_lsn + count - 1`` were
    here, and were removed once archived (``recorder/compact.py``). The LSNs stay
    accounted for: a reader still checks that none is missing, and none is reused."""

    first_lsn: int
    count: int


HOLE_TAG = "hole"


def hole(first_lsn: int, count: int) -> bytes:
    """A framed hole (format version 2)."""
    return frame(msgpack.packb((first_lsn, count, HOLE_TAG)))


def marker(first_lsn: int) -> bytes:
    """A framed legacy batch marker ``[first_lsn]`` (stores without a salt)."""
    return frame(msgpack.packb((first_lsn,)))


def marker_tag(salt: bytes, number: int, offset: int, first_lsn: int) -> bytes:
    """The tag that binds a marker to its store, segment and offset."""
    return hashlib.blake2b(f"{number}:{offset}:{first_lsn}".encode(), key=salt,
                           digest_size=TAG_SIZE).digest()


def salted_marker(first_lsn: int, salt: bytes, number: int, offset: int) -> bytes:
    """A framed batch marker, valid only at ``offset`` of segment ``number``."""
    tag = marker_tag(salt, number, offset, first_lsn)
    return frame(msgpack.packb((first_lsn, tag), use_bin_type=True))


def frame(payload: bytes) -> bytes:
    """Wrap a payload in the frame header. A payload past ``MAX_FRAME`` is refused here:
    every reader would take its frame for damage."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a frame of {len(payload)} bytes is past MAX_FRAME ({MAX_FRAME})")
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def encode_event(event: Event) -> bytes:
    """Frame an Event exactly as the store writes it."""
    return frame(
        envelope(
            event.lsn, event.traj, event.seq, event.prev, event.kind, pack_body(event.body)
        )
    )


def _no_ext(code: int, data: bytes) -> Any:
    raise BadPayload(f"msgpack extension type {code} (stenograph never writes one)")


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and maps more than ``limit`` deep (iterative)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return False


def unpack(payload: bytes) -> Any:
    """Unpack one msgpack value; ``BadPayload`` for anything the writer cannot have made.

    Covers bad bytes, trailing bytes, unhashable map keys (a ``TypeError`` in
    msgpack), extension types, invalid UTF-8 and nesting deeper than an envelope
    around a ``MAX_DEPTH`` body (a recursive walk of the value is then safe).
    """
    return _checked(payload, MAX_DEPTH + 1)


_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_NOT_CONTAINER = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)


def _checked(data: bytes, limit: int) -> Any:
    """Unpack ``data`` and refuse what no writer makes (see ``unpack``).

    Extension types other than msgpack's timestamp are refused by ``ext_hook``;
    a timestamp reads as integer nanoseconds (stenograph writes none, and an
    int is safe everywhere). Depth is walked only when the bytes hold more
    possible container headers than ``limit``: one C-speed scan for the
    common event instead of a walk over every value.
    """
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False,
                              ext_hook=_no_ext, timestamp=2)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadPayload(f"not a msgpack value: {exc}") from None
    if (len(data) > limit and len(data.translate(None, _NOT_CONTAINER)) > limit
            and isinstance(obj, (dict, list)) and _too_deep(obj, limit)):
        raise BadPayload(f"nested more than {limit} levels deep")
    return obj


def decode_payload(payload: bytes, format_version: int) -> Event | int | SaltedMarker | Hole:
    """Decode a payload: an Event, a legacy marker's first LSN, a salted marker, or (from
    format version 2) a hole.

    Raise BadPayload if it is none of them; UnknownKind if the kind is not known.
    """
    obj = unpack(payload)
    if type(obj) is not list:
        raise BadPayload("payload is not an event envelope")
    if len(obj) == 1 and type(obj[0]) is int:
        return obj[0]
    if len(obj) == 2 and type(obj[0]) is int and type(obj[1]) is bytes:
        if len(obj[1]) != TAG_SIZE:
            raise BadPayload("batch marker tag has the wrong size")
        return SaltedMarker(obj[0], obj[1])
    if len(obj) == 3 and obj[2] == HOLE_TAG and format_version >= HOLE_VERSION:
        first, count = obj[0], obj[1]
        if type(first) is not int or type(count) is not int or first < 1 or count < 1:
            raise BadPayload("a hole with a bad range")
        return Hole(first, count)
    if len(obj) != 6:
        raise BadPayload("payload is not an event envelope")
    lsn, traj, seq, prev, kind, body = obj
    if not (
        type(lsn) is int and isinstance(traj, str) and type(seq) is int
        and (prev is None or type(prev) is int) and isinstance(kind, str)
        and isinstance(body, dict)
    ):
        raise BadPayload("event envelope has fields of the wrong type")
    check_kind(kind, format_version)
    return Event(lsn, traj, seq, prev, kind, body)
