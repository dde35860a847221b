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
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stenograph.recorder.errors import StorePoisoned

WriteBatch = Callable[[list[bytes], int, int, int], None]
"""``write(frames, nbytes, first_lsn, last_lsn)``: write and sync, or raise."""


@dataclass(frozen=True, slots=True)
class CommitSettings:
    window_s: float = 0.0
    """How long a leader waits for more producers before writing (0: not at all)."""
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
        self._waiters: list[tuple[int, threading.Lock]] = []
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[int]]] = []
        self._kick = threading.Condition(self.lock)
        self._flusher: threading.Thread | None = None
        self._closed = False

    def push(self, frame: bytes) -> int:
        """Queue one frame as the next LSN. Caller holds ``lock``."""
        if self._error is not None:
            raise self._error
        lsn = self.next_lsn
        self.next_lsn = lsn + 1
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        return lsn

    def wait(self, lsn: int) -> None:
        """Block until ``lsn`` is covered by a completed sync."""
        if self.synced_lsn >= lsn:
            return
        with self.lock:
            while self.synced_lsn < lsn:
                if self._error is not None:
                    raise self._error
                if not self._writing:
                    self._lead()
                    continue
                me = threading.Lock()
                me.acquire()
                self._waiters.append((lsn, me))
                self.lock.release()
                try:
                    me.acquire()
                finally:
                    self.lock.acquire()

    def wait_async(self, lsn: int) -> asyncio.Future[int]:
        """A future that resolves once ``lsn`` is durable."""
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

    def _start_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flusher_main, name="stenograph-flusher", daemon=True
            )
            self._flusher.start()

    def _flusher_main(self) -> None:
        with self.lock:
            while not self._closed:
                if self._async_waiters and not self._writing and self._error is None:
                    with contextlib.suppress(StorePoisoned):  # already given to every waiter
                        self._lead()
                else:
                    self._kick.wait()

    def _lead(self) -> None:
        """Write and sync one batch. Called and returns with ``lock`` held."""
        self._writing = True
        s = self.settings
        if s.window_s > 0 and len(self._pending) < s.batch_cap:
            self.lock.release()
            time.sleep(s.window_s)
            self.lock.acquire()
        frames, nbytes = self._take()
        first = self.synced_lsn + 1
        last = first + len(frames) - 1
        error: BaseException | None = None
        self.lock.release()
        try:
            if frames:
                self._write(frames, nbytes, first, last)
        except BaseException as exc:
            error = exc
        finally:
            self.lock.acquire()
            self._writing = False
        if error is not None:
            self._error = StorePoisoned(f"write or sync failed, store closed for writing: {error}")
            self._error.__cause__ = error
            self._release(None)
            raise self._error
        self.syncs += 1
        self.synced_lsn = last
        self._release(last)

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

    def _release(self, last: int | None) -> None:
        """Wake waiters covered by ``last`` (all of them on error); hand over leadership."""
        keep: list[tuple[int, threading.Lock]] = []
        for lsn, w in self._waiters:
            if last is None or lsn <= last:
                w.release()
            else:
                keep.append((lsn, w))
        if keep:
            keep.pop(0)[1].release()  # it wakes, sees nobody writing, and leads
        self._waiters = keep
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
            if rest and not keep:
                self._start_flusher()
                self._kick.notify()


def _settle(futs: list[asyncio.Future[int]], error: BaseException | None) -> None:
    for f in futs:
        if not f.done():
            if error is None:
                f.set_result(0)
            else:
                f.set_exception(error)
