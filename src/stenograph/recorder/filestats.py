"""The meta channel's records read back as files: which file a stat looked at and what
the kernel answered (docs/shim-protocol.md, channel 8).

This is the evidence a recording holds of the files a program read: Python's ``open``,
``cat`` and ``grep`` all ``fstat`` what they open. A stat names its file by its path
when that is absolute; an ``fstat`` (no path) or a relative path only by the location
the shim appends at record (``meta_where``: the fd's link in ``/proc/self/fd``, or the
directory joined with the path). A tape made before that, or where ``/proc`` said
nothing, leaves such a stat without a name: ``path`` is ``None`` and the caller must
say it does not know which file it was.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from stenograph.recorder.tape import CHANNEL_IDS, iter_records

META = CHANNEL_IDS["meta"]
OP_FSTATAT, OP_STATX = 1, 2
S_IFMT, S_IFREG = 0o170000, 0o100000
STATX_TYPE, STATX_MTIME, STATX_SIZE = 0x1, 0x40, 0x200
_STAT_SIZE = {OP_FSTATAT: 144, OP_STATX: 256}


@dataclass(frozen=True)
class Stat:
    """One stat call as taped."""

    path: str | None
    """The absolute, normalised path looked at; ``None`` when the tape does not say."""
    asked: str
    """The path argument as the program gave it (``""`` for an ``fstat``)."""
    errno: int
    """0 when the kernel answered with the file's metadata."""
    mode: int = 0
    size: int | None = None
    mtime_ns: int | None = None
    """``None`` when the call did not ask for it (a ``statx`` mask without it)."""

    @property
    def regular(self) -> bool:
        return not self.errno and self.mode & S_IFMT == S_IFREG


def stats(data: bytes) -> Iterator[Stat]:
    """The stat calls among a chunk's records, in order."""
    for ch, op, payload in iter_records(data):
        if ch == META and op in _STAT_SIZE:
            st = decode(op, payload)
            if st is not None:
                yield st


def decode(op: int, payload: bytes) -> Stat | None:
    """One meta record: ``args | i32 fd | i32 rc | [struct] | [u32 n | location]``;
    ``None`` if it is cut short."""
    hdr = 16 if op == OP_STATX else 12
    try:
        (pl,) = struct.unpack_from("<I", payload, hdr - 4)
        asked = payload[hdr:hdr + pl].decode(errors="surrogateescape")
        _fd, rc = struct.unpack_from("<ii", payload, hdr + pl)
    except struct.error:
        return None
    at = hdr + pl + 8
    mode, size, mtime = 0, None, None
    if rc == 0:
        body = payload[at:at + _STAT_SIZE[op]]
        if len(body) < _STAT_SIZE[op]:
            return None
        if op == OP_FSTATAT:  # st_mode @24, st_size @48, st_mtim @88
            (mode,), (size,) = struct.unpack_from("<I", body, 24), struct.unpack_from(
                "<q", body, 48)
            sec, nsec = struct.unpack_from("<qq", body, 88)
            mtime = sec * 1_000_000_000 + nsec
        else:  # stx_mask @0, stx_mode @28, stx_size @40, stx_mtime @112
            (got,) = struct.unpack_from("<I", body, 0)
            (mode,) = struct.unpack_from("<H", body, 28) if got & STATX_TYPE else (0,)
            if got & STATX_SIZE:
                (size,) = struct.unpack_from("<Q", body, 40)
            if got & STATX_MTIME:
                sec, nsec = struct.unpack_from("<qI", body, 112)
                mtime = sec * 1_000_000_000 + nsec
        at += _STAT_SIZE[op]
    where = _location(payload, at)
    if asked.startswith("/"):
        path: str | None = os.path.normpath(asked)
    elif where is not None:
        path = os.path.normpath(where)
    else:
        path = None
    return Stat(path, asked, -rc if rc < 0 else 0, mode, size, mtime)


def _location(payload: bytes, at: int) -> str | None:
    if len(payload) < at + 4:
        return None
    (n,) = struct.unpack_from("<I", payload, at)
    raw = payload[at + 4:at + 4 + n]
    if not n or len(raw) != n or not raw.startswith(b"/"):
        return None
    return raw.decode(errors="surrogateescape")
