"""The recorder's side of the shim's shared rings (shim_c/ring.c; layout in
shim_c/steno_shim.h, mirrored here and checked by tests/test_shim_constants.py).

Each recorded process writes its records into per-thread rings in a memfd it hands
to the recorder over its connection. The recorder maps the same memory, so a record
is in the recorder's reach as soon as the thread has published it, and survives the
process however it ends. ``Arena.drain`` takes what every ring holds past its tail
and moves the tail on; the thread alone moves the head.

Head and tail are read and stored as aligned 8-byte words through ctypes (one
``mov`` each on x86-64, the only architecture the shim builds for), and x86-64 keeps
loads in order with loads and stores with earlier loads, so bytes read after a head
are the bytes the thread wrote before publishing it, and a tail is stored only after
the bytes it frees were copied.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from dataclasses import dataclass

RING_MAGIC = b"STR1"
RING_VERSION = 1
ARENA_HDR = 4096
ARENA_OFF_NSLOTS = 8
ARENA_OFF_PID = 12
ARENA_OFF_ID = 16
RING_SLOTS = 1024
RING_HDR = 4096
RING_CAP = 1 << 20
RING_SLOT = RING_HDR + RING_CAP
RING_OFF_TINDEX = 4
RING_OFF_HEAD = 64
RING_OFF_TAIL = 128
ARENA_SIZE = ARENA_HDR + RING_SLOTS * RING_SLOT


class BadArena(ValueError):
    """The memory a process handed over is not an arena of this protocol."""


@dataclass(frozen=True)
class Drained:
    """Records of one thread, in the order it wrote them."""

    thread: int
    data: bytes


class Arena:
    """One process's rings, mapped from the memfd it sent (the fd is closed here)."""

    def __init__(self, fd: int) -> None:
        try:
            size = os.fstat(fd).st_size
            if size < ARENA_SIZE:
                raise BadArena(f"arena of {size} bytes, {ARENA_SIZE} expected")
            self._mm = mmap.mmap(fd, ARENA_SIZE, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic = self._mm[:4]
        if magic != RING_MAGIC:
            self._mm.close()
            raise BadArena(f"arena magic {magic!r}")
        self.pid = ctypes.c_int32.from_buffer(self._mm, ARENA_OFF_PID).value
        self.id = ctypes.c_uint64.from_buffer(self._mm, ARENA_OFF_ID).value
        self._nslots = ctypes.c_uint32.from_buffer(self._mm, ARENA_OFF_NSLOTS)
        self._heads: list[ctypes.c_uint64] = []
        self._tails: list[ctypes.c_uint64] = []
        self._tindex: list[ctypes.c_uint32] = []
        self.lock = threading.Lock()
        """Held across a drain and the appends it feeds: one thread's chunks stay in order."""
        self.corrupt = 0

    def _slot(self, i: int) -> None:
        base = ARENA_HDR + i * RING_SLOT
        self._tindex.append(ctypes.c_uint32.from_buffer(self._mm, base + RING_OFF_TINDEX))
        self._heads.append(ctypes.c_uint64.from_buffer(self._mm, base + RING_OFF_HEAD))
        self._tails.append(ctypes.c_uint64.from_buffer(self._mm, base + RING_OFF_TAIL))

    def drain(self) -> list[Drained]:
        """Everything published since the last drain, per slot. Call with ``lock`` held."""
        if self._mm.closed:
            return []
        n = min(self._nslots.value, RING_SLOTS)
        while len(self._heads) < n:
            self._slot(len(self._heads))
        out: list[Drained] = []
        for i in range(n):
            head = self._heads[i].value  # first: the bytes below it are complete
            tail = self._tails[i].value
            if head == tail:
                continue
            if head < tail or head - tail > RING_CAP:  # the program wrote over the shim
                self.corrupt += 1
                self._tails[i].value = head
                continue
            thread = self._tindex[i].value
            base = ARENA_HDR + i * RING_SLOT + RING_HDR
            a, b = tail % RING_CAP, head % RING_CAP
            if a < b or b == 0:
                data = self._mm[base + a:base + (b or RING_CAP)]
            else:
                data = self._mm[base + a:base + RING_CAP] + self._mm[base:base + b]
            self._tails[i].value = head
            out.append(Drained(thread, data))
        return out

    def close(self) -> None:
        """Unmap (after a last ``drain``)."""
        if self._mm.closed:
            return
        del self._heads[:], self._tails[:], self._tindex[:]
        self._nslots = None  # type: ignore[assignment]
        self._mm.close()


def process_gone(pid: int) -> bool:
    """Whether ``pid`` can no longer write: no such process, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")
