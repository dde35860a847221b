"""When a file was created: statx's birth time, which ext4, xfs, btrfs and tmpfs keep.
A sealed replay hides what was made after its recording started (``seal.born_since``,
``workspace._whiteouts``): a name a program computes from what it finds (a test runner's
next numbered directory, a cache it builds if missing) is then what it was."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _StatxTime(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_int64), ("nsec", ctypes.c_uint32), ("pad", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("attributes", ctypes.c_uint64), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("mode", ctypes.c_uint16),
                ("pad0", ctypes.c_uint16), ("ino", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
                ("atime", _StatxTime), ("btime", _StatxTime), ("ctime", _StatxTime),
                ("mtime", _StatxTime), ("spare", ctypes.c_uint64 * 16)]


_STATX_BTIME = 0x800
_AT_SYMLINK_NOFOLLOW = 0x100


def birth_time(path: str) -> float | None:
    """When ``path`` was created (statx's birth time), or None where the file system
    does not keep it."""
    buf = _Statx()
    fn = getattr(_libc(), "statx", None)
    if fn is None or fn(-100, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME,
                        ctypes.byref(buf)) != 0 or not buf.mask & _STATX_BTIME:
        return None
    return buf.btime.sec + buf.btime.nsec / 1e9
