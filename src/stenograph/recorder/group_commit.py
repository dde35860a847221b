"""Group commit: many producers, one ``writev`` and one ``fdatasync`` per batch.

Leader/follower, as in LevelDB's write queue: there is no dedicated writer
thread on the hot path. A producer that must wait for durability and finds
nobody writing becomes the leader: it takes the queued frames, writes and syncs
them, then releases every waiter the sync covered and hands leadership to the
next unsatisfied waiter. A lone producer therefore syncs its own event with no
thread hand-off; under load, one sync covers everyone who queued while the
previous sync was in flight.

asyncio producers cannot block their loop, so they register a future and, if
nobody is writing, wake a background flusher thread that leads on their behalf.

Batches are written strictly in sequence, each after the previous sync returned.
Recovery (``segment.FrameScanner``) relies on that order.

What it costs under load, and the three choices that follow from it. The sync
is cheap (~0.1 ms) and runs without the GIL; what limits many producer threads
is that every durable append ends in one blocking wait, and each wake-up is a
context switch plus a GIL hand-off, all of it serialized by the GIL.

* Waiters are woken in a chain, not all at once: the leader releases the
  first, and each woken waiter releases the next before it does anything else.
  Releasing fifty threads at once makes them fight over the GIL (each one then
  sleeps again on the GIL's condition variable and must be woken a second time),
  and the leader would pay for every wake-up while it holds the GIL.
* The leader waits, briefly and only for producers it has reason to expect,
  before taking its batch: as many durable appends as the previous batch held (a
  closed loop of N producers settles into batches of N; non-durable frames bring
  no producer back and are not counted), at most ``window_s``, and no longer
  than ``idle_s`` after the last one arrived. Fewer, fuller batches mean fewer
  leader cycles, each of which costs several GIL hand-offs of its own. A lone
  producer expects nobody and never waits.
* ``lock`` is held only for bookkeeping, never while a thread is woken and
  never during I/O, and a woken waiter whose event is durable returns without
  taking it again (``synced_lsn`` only grows, so reading it unlocked is safe).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from stenograph.recorder.errors import StorePoisoned

WriteBatch = Callable[[list[bytes], int, int, int], None]
"""``write(frames, nbytes, first_lsn, last_lsn)``: write and sync, or raise."""

_Batch = tuple[list[bytes], int, int, int]
"""``(frames, nbytes, first_lsn, last_lsn)`` as taken off the queue by a leader."""

_Waiter = list
"""``[lsn, lock, next_waiter | None]``: a parked producer thread. The lock is
held until the waiter may go; ``next_waiter`` is who it must wake in turn. A
list, not a class: one is built per durable append."""


@dataclass(frozen=True, slots=True)
class CommitSettings:
    window_s: float = 0.004
    """Longest a leader waits for the producers it expects (0: never wait)."""
    idle_s: float = 0.0003
    """A leader stops waiting once no producer has queued anything for this long."""
    batch_cap: int = 4096
    """Most events in one batch."""
    batch_bytes: int = 16 << 20
    """Most bytes in one batch (a single larger event still goes alone)."""


class GroupCommit:
    """The commit queue. ``lock`` also orders LSN assignment by the store."""

    def __init__(self, write: WriteBatch, next_lsn: int, settings: CommitSettings) -> None:
        self.lock = threading.Lock()
        self.settings = settings
        self.next_lsn = next_lsn
        self.synced_lsn = next_lsn - 1
        self.syncs = 0
        self._write = write
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._writing = False
        self._error: StorePoisoned | None = None
        self._waiters: list[_Waiter] = []
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[int]]] = []
        self._kick = threading.Condition(self.lock)
        self._flusher: threading.Thread | None = None
        self._closed = False
        self._last_batch = 0
        self._expect = 0
        self._gate: threading.Lock | None = None
        """Held by a leader waiting for ``_expect`` durable appends; ``push`` opens it."""
        self._pending_durable = 0
        """Queued frames whose producer will wait for them: only those are expected back.
        Non-durable frames (a recorder's tape chunks) ride along but bring nobody."""

    def push(self, frame: bytes, durable: bool = True) -> int:
        """Queue one frame as the next LSN. Caller holds ``lock``."""
        if self._error is not None:
            raise self._error
        lsn = self.next_lsn
        self.next_lsn = lsn + 1
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        if durable:
            self._pending_durable += 1
            if self._gate is not None and self._pending_durable >= self._expect:
                self._gate.release()
                self._gate = None
        return lsn

    def wait(self, lsn: int) -> None:
        """Block until ``lsn`` is covered by a completed sync.

        Either lead a batch (nobody is writing) or park until the leader that
        covers ``lsn`` (or hands leadership over) wakes us.
        """
        while self.synced_lsn < lsn:
            with self.lock:
                if self.synced_lsn >= lsn:
                    return
                if self._error is not None:
                    raise self._error
                lead = not self._writing
                if lead:
                    self._writing = True
                else:
                    me = threading.Lock()
                    me.acquire()
                    waiter: _Waiter = [lsn, me, None]
                    self._waiters.append(waiter)
            if lead:
                self._lead()
            else:
                self._park(waiter)

    def wait_async(self, lsn: int) -> asyncio.Future[int]:
        """A future that resolves once ``lsn`` is durable."""
        import asyncio  # here: the CLI's start-up need not pay for it

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with self.lock:
            if self.synced_lsn >= lsn:
                fut.set_result(lsn)
            elif self._error is not None:
                fut.set_exception(self._error)
            else:
                self._async_waiters.append((lsn, loop, fut))
                if not self._writing:
                    self._start_flusher()
                    self._kick.notify()
        return fut

    def flush(self) -> None:
        """Make everything queued so far durable."""
        with self.lock:
            last = self.next_lsn - 1
        self.wait(last)

    def close(self) -> None:
        try:
            self.flush()
        finally:  # even when poisoned: stop the flusher, or it waits forever
            with self.lock:
                self._closed = True
                self._kick.notify_all()
            if self._flusher is not None:
                self._flusher.join()

    # -- parked threads ------------------------------------------------------------

    def _park(self, waiter: _Waiter) -> None:
        """Sleep until released, then pass the wake-up down the chain."""
        try:
            waiter[1].acquire()
        except BaseException:  # interrupted (a signal in the main thread)
            self._abandon(waiter)
            raise
        nxt = waiter[2]
        if nxt is not None:
            nxt[1].release()

    def _abandon(self, waiter: _Waiter) -> None:
        """Leave the queue without breaking a chain that may already include us."""
        with self.lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
            nxt, waiter[2] = waiter[2], None  # links are set under ``lock``, so final
        if nxt is not None:
            nxt[1].release()

    # -- leading -------------------------------------------------------------------

    def _lead(self) -> None:
        """Gather, write and sync one batch, then wake whom it covers.

        The caller has set ``_writing`` under ``lock`` and no longer holds it.
        """
        try:
            self._gather()
        except BaseException:  # interrupted while waiting: someone else must lead
            with self.lock:
                self._writing = False
                head = self._release(self.synced_lsn)
            if head is not None:
                head[1].release()
            raise
        with self.lock:
            durable = self._pending_durable
            frames, nbytes = self._take()
            self._pending_durable = min(durable, len(self._pending))
            self._last_batch = durable - self._pending_durable
            first = self.synced_lsn + 1
        self._commit((frames, nbytes, first, first + len(frames) - 1))

    def _gather(self) -> None:
        """Wait for the producers this batch can expect (see the module docstring)."""
        s = self.settings
        with self.lock:
            expect = min(self._last_batch, s.batch_cap)
            seen = self._pending_durable
            if s.window_s <= 0 or seen >= expect:
                return
            gate = self._gate = threading.Lock()
            gate.acquire()
            self._expect = expect
        try:
            deadline = time.monotonic() + s.window_s
            while not gate.acquire(timeout=min(s.idle_s, max(deadline - time.monotonic(), 0))):
                now = self._pending_durable
                if now == seen or time.monotonic() >= deadline:
                    break
                seen = now
        finally:
            with self.lock:
                self._gate = None

    def _commit(self, batch: _Batch) -> None:
        """Write and sync ``batch``, then wake whom it covers. Caller does not hold ``lock``."""
        frames, nbytes, first, last = batch
        error: BaseException | None = None
        try:
            if frames:
                self._write(frames, nbytes, first, last)
        except BaseException as exc:
            error = exc
        with self.lock:
            self._writing = False
            if error is None:
                self.syncs += 1
                self.synced_lsn = last
                head = self._release(last)
            else:
                self._error = StorePoisoned(
                    f"write or sync failed, store closed for writing: {error}"
                )
                self._error.__cause__ = error
                head = self._release(None)
        if head is not None:
            head[1].release()
        if error is not None:
            assert self._error is not None
            raise self._error

    def _take(self) -> tuple[list[bytes], int]:
        s, pending = self.settings, self._pending
        if len(pending) <= s.batch_cap and self._pending_bytes <= s.batch_bytes:
            frames, nbytes = pending, self._pending_bytes
            self._pending, self._pending_bytes = [], 0
            return frames, nbytes
        n, nbytes = 0, 0
        while n < len(pending) and n < s.batch_cap:
            if n and nbytes + len(pending[n]) > s.batch_bytes:
                break
            nbytes += len(pending[n])
            n += 1
        frames = pending[:n]
        self._pending = pending[n:]
        self._pending_bytes -= nbytes
        return frames, nbytes

    def _release(self, last: int | None) -> _Waiter | None:
        """Settle waiters covered by ``last`` (all on error); pick the next leader.

        Caller holds ``lock``. Links the thread waiters to wake into a chain and
        returns its head, for the caller to release once it has dropped
        ``lock``. The first uncovered waiter, if any, heads the chain: it wakes,
        finds nobody writing, and leads the next batch.
        """
        waiters = self._waiters
        if last is None or last >= self.next_lsn - 1:  # error, or nothing queued since
            wake, self._waiters = waiters, []
        else:
            wake = [w for w in waiters if w[0] <= last]
            keep = [w for w in waiters if w[0] > last]
            if keep:
                wake.insert(0, keep.pop(0))
            self._waiters = keep
        for i in range(len(wake) - 1):
            wake[i][2] = wake[i + 1]
        if self._async_waiters:
            done: dict[asyncio.AbstractEventLoop, list[asyncio.Future[int]]] = {}
            rest = []
            for item in self._async_waiters:
                if last is None or item[0] <= last:
                    done.setdefault(item[1], []).append(item[2])
                else:
                    rest.append(item)
            self._async_waiters = rest
            for loop, futs in done.items():
                with contextlib.suppress(RuntimeError):  # loop closed: nobody waits
                    loop.call_soon_threadsafe(_settle, futs, self._error)
            if rest and not self._waiters:
                self._start_flusher()
                self._kick.notify()
        return wake[0] if wake else None

    # -- the flusher (leads for asyncio waiters) ----------------------------------

    def _start_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flusher_main, name="stenograph-flusher", daemon=True
            )
            self._flusher.start()

    def _flusher_main(self) -> None:
        while True:
            with self.lock:
                while not self._closed and not (
                    self._async_waiters and not self._writing and self._error is None
                ):
                    self._kick.wait()
                if self._closed:
                    return
                self._writing = True
            with contextlib.suppress(StorePoisoned):  # delivered to every waiter already
                self._lead()


def _settle(futs: list[asyncio.Future[int]], error: BaseException | None) -> None:
    for f in futs:
        if not f.done():
            if error is None:
                f.set_result(0)
            else:
                f.set_exception(error)
