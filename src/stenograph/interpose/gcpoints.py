"""Cyclic garbage collection at points the tape fixes, not when allocations say.

CPython collects cycles when allocations minus frees pass a threshold. The hooks
allocate differently in record (a live connection, its parser, its timers) and in
replay (a recorded entry), so automatic collections -- and the finalizers and weakref
callbacks they run -- land at different points of the program in the two modes. A
finalizer that reads a clock, takes a lock with a timeout or wakes the event loop then
shifts every stream after it (pydantic-ai's agent diverged this way: a collection set
off by an allocation inside ``Task.cancel`` at replay ran a finalizer there).

Under the tape the automatic collector is off from the start, in both modes (the
bootstrap turns it off), and a collection runs at
every exchange a Python hook puts on the tape: the same points of the program in record
and replay. It runs with the tape paused, because the garbage differs (a live
connection's objects exist only in record) and what their finalizers do must not land
on the tape. The young generation is collected at every exchange, the middle one every
10th, all of them every 1000th: CPython itself collects the oldest only once it has
grown by a quarter, and a whole collection of an SDK's heap (60 ms here, under the
openai package) every 100th exchange was most of what recording one cost. A program
that calls ``gc.enable()`` itself gets automatic collections back, and with them this
nondeterminism (docs/determinism.md).
"""

from __future__ import annotations

import gc
import threading
from typing import Any

FULL_EVERY = 1000
"""Exchanges between two collections of every generation."""

_lock = threading.Lock()
_exchanges = 0


def at_exchange(shim: Any) -> None:
    """One exchange reached the tape: collect, paused, the generation its count calls for."""
    global _exchanges
    with _lock:
        _exchanges += 1
        n = _exchanges
    gen = 2 if n % FULL_EVERY == 0 else 1 if n % 10 == 0 else 0
    with shim.paused():
        gc.collect(gen)
