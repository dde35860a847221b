"""A ``TapeChunk``'s records on disk: compressed with zstd, read back the same way by
every reader (``chunk_data``).

A drained ring is a run of records of one thread (``tape.RECORD`` headers and their
payloads). Most are clock reads: 32 bytes each, a header and ``{clock id, seconds,
nanoseconds}``, consecutive ones differing in a few bytes of the nanoseconds. Measured
on 2,000,000 ``time.monotonic_ns()`` reads (489 chunks of ~130 KiB):

=====================================  ==============  =====================
encoding                               bytes / record  compress time, 64 MB
=====================================  ==============  =====================
raw (the format before this one)       32.0            --
zlib level 1                           2.91            0.15 s
zstd level 1 (this one)                1.86            0.04 s
zstd level 3                           1.86            0.04 s
per-stream deltas, then zstd level 3   0.77            3.6 s (deltas in Python)
=====================================  ==============  =====================

zstd at level 1 alone meets the goal of a clock record in under 4 bytes at ~1.6 GB/s,
which the recorder affords on the drain path; deltas would halve it again but cost the
recorder 40 times more CPU in Python (a C encoder could take them later, as a new
``enc`` value). The demo agent's ``.steno`` goes from 1.40 MB to 0.15 MB.

A body is ``{"proc", "thread", "zdata": <one zstd frame>, "size": <raw bytes>}``; an
older one ``{"proc", "thread", "data": <raw records>}`` reads as it always did, and so
does the empty ``data`` of a cut marker; a reader that keeps a long run's events without
their tape leaves ``{"$frame": <where>}`` instead (``trajfile.FrameRef``). Decoding is
total: a frame that is not zstd,
or that inflates to anything but ``size`` bytes (at most ``MAX_CHUNK``), is a
``ValueError`` the caller turns into ``CorruptLog``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

LEVEL = 1
MAX_CHUNK = 64 << 20
"""The largest chunk a reader inflates (a ring is 1 MiB; a big record travels whole)."""
SMALL = 64
"""Below this many bytes a chunk is kept raw (a frame's own overhead would not pay)."""

@functools.cache
def _zstd() -> Any:
    """zstandard, imported when a chunk is first encoded or read (``recorder/tape.py`` is
    also read by code that runs inside a recorded program, which must not pay for it)."""
    import zstandard

    return zstandard


_local = threading.local()


def _compressor() -> Any:
    """This thread's compressor: a ``ZstdCompressor`` is not safe to share between
    threads (the recorder drains each process's rings on a thread of its own, and two
    frames compressed at once by one compressor come out as each other's parts)."""
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = _zstd().ZstdCompressor(level=LEVEL)
    return c


def _decompressor() -> Any:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = _zstd().ZstdDecompressor()
    return d


def encode(proc: str, thread: int, data: bytes) -> dict[str, Any]:
    """The ``TapeChunk`` body for ``data`` drained from ``thread`` of ``proc``."""
    if len(data) < SMALL:
        return {"proc": proc, "thread": thread, "data": data}
    return {"proc": proc, "thread": thread, "zdata": _compressor().compress(data),
            "size": len(data)}


def chunk_data(body: Mapping[str, Any]) -> bytes:
    """The raw records of a ``TapeChunk`` body, in either encoding (or where a lazy
    reader left it: ``{"$frame": trajfile.FrameRef}``)."""
    ref = body.get("$frame")
    if ref is not None:
        body = ref.body()
    data = body.get("data")
    if isinstance(data, bytes):
        return data
    z, size = body.get("zdata"), body.get("size")
    if not isinstance(z, bytes) or type(size) is not int or not 0 <= size <= MAX_CHUNK:
        raise ValueError("a tape chunk without records (neither data nor zdata and size)")
    zstd = _zstd()
    try:
        out = _decompressor().decompress(z, max_output_size=size)
    except zstd.ZstdError as exc:
        raise ValueError(f"a tape chunk that does not inflate: {exc}") from None
    if len(out) != size:
        raise ValueError(f"a tape chunk inflates to {len(out)} bytes, not {size}")
    return out
