"""asyncio under the tape: an event loop's iterations are an input like a clock.

A hooked async request (httpx, aiohttp) suspends its task while the real network
call runs (record); meanwhile the loop goes round, other tasks run, timers fire.
Replay makes no network call, so unless the loop goes round the same way, the other
tasks run at other moments and read other clocks. Pausing the tape across the await
(what a sync hook does) cannot work: the pause is per thread, and every task of the
loop runs on that thread.

So under the tape the loop's work is split in two:

* **plumbing** — what exists only because a hooked call really ran: sockets the hook
  registered, callbacks and timers scheduled by paused code, tasks it started. Under
  record these never reach the loop's own queues: they wait in side queues and run,
  paused, inside the loop's ``select``; replay has none.
* **the program** — everything else, which runs the same in both modes.

Each ``select`` of the loop is one *tick*, recorded on the thread's wait stream
(``OP_LOOP_TICK``: which of the program's registered fds were ready); replay serves
the ticks in order, waiting for real readiness where the recording had some (a
subprocess pipe, a worker thread's wake-up). A hooked call's task is resumed by
plumbing at some tick, after some number of the program's schedulings (``call_soon``
and friends, counted per loop): those points are recorded with the exchange
(``Drive``), and replay resolves the call's futures at exactly the same points
(``replay_suspensions``), so every task wakes up in the recorded order.

Only asyncio's selector event loops are covered (uvloop and trio are not).
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import select
import selectors
import struct
import threading
import types
import weakref
from collections import deque
from collections.abc import Awaitable, Generator
from typing import Any

from stenograph.interpose.pytape import PyTape, current

OP_LOOP_TICK = 8
"""steno_shim.h: the wait channel's op for one loop iteration."""

_TICK = struct.Struct("<I")
_EVENT = struct.Struct("<II")
_MAX_EVENTS = 4096


class _Shim:
    """The shim's exports this module needs (absent without the shim: no tape)."""

    def __init__(self) -> None:
        self.ok = False
        try:
            lib = ctypes.CDLL(None)
            self.put = lib.steno_tape_put
            self.get = lib.steno_tape_get
            self.gate_next = lib.steno_gate_next
            self.wait_fds = lib.steno_wait_fds
        except (OSError, AttributeError):
            return
        self.put.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.get.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.wait_fds.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_short),
                                  ctypes.c_int]
        self.ok = True
        self.buf = ctypes.create_string_buffer(_TICK.size + _EVENT.size * _MAX_EVENTS)


_SHIM: _Shim | None = None


def _shim() -> _Shim:
    global _SHIM
    if _SHIM is None:
        _SHIM = _Shim()
    return _SHIM


class _Marker:
    """A done-callback a hooked call puts on the future it suspends on: when the future
    completes, its scheduling is intercepted (never run) and notes the point — the
    tick, and how many program schedulings came before the task's wake-up."""

    __slots__ = ("point",)

    def __init__(self) -> None:
        self.point: tuple[int, int] | None = None

    def __call__(self, fut: Any) -> None:  # never scheduled
        pass


class _SideTimer(asyncio.TimerHandle):
    """A plumbing timer: outside the loop's heap, so it neither shortens the program's
    waits nor adds the clock reads the loop makes when its heap is not empty."""

    def cancel(self) -> None:
        asyncio.Handle.cancel(self)


class LoopTape:
    """The tape state of one event loop."""

    def __init__(self, loop: Any, tape: PyTape) -> None:
        self.loop, self.tape = loop, tape
        self.tick = 0
        self.count = 0
        self.regs: dict[int, int] = {}  # fd -> registration id (program fds)
        self.fds: dict[int, int] = {}  # registration id -> fd
        self.next_reg = 0
        self.plumb: set[int] = set()  # fds registered by paused code (record)
        self.side_ready: deque[asyncio.Handle] = deque()
        self.side_timers: list[_SideTimer] = []
        self.plumb_tasks: weakref.WeakSet[Any] = weakref.WeakSet()
        self.prog_tasks: weakref.WeakSet[Any] = weakref.WeakSet()
        self.plumb_agens: dict[int, weakref.ref[Any]] = {}
        """Async generators a hook started (their first step ran paused), by id."""
        self.dying_plumbing: set[int] = set()
        """Ids of those being destroyed now: a generator's weak references are cleared
        just before its finalizer hook runs, in the same deallocation."""
        self.pending: list[tuple[tuple[int, int], int, asyncio.Future[None]]] = []  # a heap
        self.cancels: set[int] = set()  # futures replay cancels itself (ids)
        self.self_writes = [0, 0]  # program, plumbing writes to the self-pipe since a tick
        self.adopt = tape.mode == "replay"
        """A resume's loop: when it goes live, every task it has is the program's (its
        prefix was replayed: no hooked call really ran, so none of them is plumbing)."""

    @property
    def record(self) -> bool:
        """Record mode -- which a resumed run's loop enters where its tape ends."""
        return self.tape.mode == "record"

    def paused(self) -> bool:
        return self.tape.shim.active()

    def plumbing(self, callback: Any, args: tuple[Any, ...] = ()) -> bool:
        """Is a callback being scheduled now plumbing (see the module docstring)?

        A plain done-callback of a plumbing task (a function, not a task's wake-up) is
        plumbing too, even when the program adds it to a task that is already done
        (asyncio then schedules it at once, from the program's code): whether the task was
        done by then is the real network's timing (aiohttp 3.10 releases a connection
        through its request writer's completion). A program task waking up on one stays
        the program's."""
        if self.adopt:  # the first scheduling since a resume went live
            self.adopt = False
            self.prog_tasks.update(asyncio.all_tasks(self.loop))
        owner = getattr(callback, "__self__", None)
        if (owner is None and args and isinstance(args[0], asyncio.Future)
                and args[0] in self.plumb_tasks):
            return True
        if isinstance(owner, asyncio.Future):  # a task's step or wake-up: the task's side
            if owner in self.plumb_tasks:
                return True
            if owner in self.prog_tasks:
                return False
            p = self.paused()
            (self.plumb_tasks if p else self.prog_tasks).add(owner)
            return p
        return self.paused()

    def adopt_agen(self, agen: Any) -> bool:
        """Record: an async generator starts; a hook's (paused) is plumbing for life.
        Whether it is."""
        if not (self.record and self.paused()):
            return False
        key = id(agen)

        def dying(_ref: Any, key: int = key) -> None:
            self.plumb_agens.pop(key, None)
            self.dying_plumbing.add(key)

        self.plumb_agens[key] = weakref.ref(agen, dying)
        return True

    def closing_plumbing(self, agen: Any) -> bool:
        """Is the async generator the garbage collector is closing now a hook's? Closed
        by refcount in the program's code (the response it read is dropped), a
        transport's generator is still plumbing: replay never had it."""
        return self.record and id(agen) in self.dying_plumbing

    def register(self, fd: int) -> None:
        if self.paused():
            self.plumb.add(fd)
            return
        self.regs[fd] = self.next_reg
        self.fds[self.next_reg] = fd
        self.next_reg += 1

    def unregister(self, fd: int) -> None:
        self.plumb.discard(fd)
        reg = self.regs.pop(fd, None)
        if reg is not None:
            self.fds.pop(reg, None)

    def resolve(self) -> None:
        """Replay: wake the hooked calls whose recorded point has come."""
        now = (self.tick, self.count)
        while self.pending and self.pending[0][0] <= now:
            fut = heapq.heappop(self.pending)[2]
            if fut.done():
                continue
            if id(fut) in self.cancels:
                fut.cancel()  # the same C path as the recorded wake-up (a cancel scope)
            else:
                fut.set_result(None)

    def run_plumbing(self, events: list[tuple[Any, int]]) -> None:
        """Record: the callbacks of plumbing fds, due plumbing timers, queued plumbing
        handles, all paused (replay has none of them)."""
        with self.tape.shim.paused():
            for key, mask in events:
                reader, writer = key.data if isinstance(key.data, tuple) else (None, None)
                if mask & selectors.EVENT_READ and reader is not None:
                    if reader._cancelled:
                        self.loop._remove_reader(key.fileobj)
                    else:
                        reader._run()
                if mask & selectors.EVENT_WRITE and writer is not None:
                    if writer._cancelled:
                        self.loop._remove_writer(key.fileobj)
                    else:
                        writer._run()
            if self.side_timers:
                end = self.loop.time() + self.loop._clock_resolution
                while self.side_timers and self.side_timers[0]._when < end:
                    t = heapq.heappop(self.side_timers)
                    if not t._cancelled:
                        t._run()
            for _ in range(len(self.side_ready)):
                h = self.side_ready.popleft()
                if not h._cancelled:
                    h._run()


class TapedSelector:
    """The loop's selector, taped: see the module docstring."""

    def __init__(self, lt: LoopTape, inner: selectors.BaseSelector) -> None:
        self._lt, self._inner = lt, inner
        for key in sorted(inner.get_map().values(), key=lambda k: k.fd):
            lt.register(key.fd)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._inner.register(fileobj, events, data)
        self._lt.register(key.fd)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._inner.unregister(fileobj)
        self._lt.unregister(key.fd)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        lt = self._lt
        sh = _shim()
        if not sh.ok:
            return self._inner.select(timeout)
        lt.tick += 1
        lt.dying_plumbing.clear()  # (each was closed in the deallocation that marked it)
        if lt.record:
            return self._select_record(timeout, sh)
        lt.resolve()
        n = sh.get(OP_LOOP_TICK, sh.buf, len(sh.buf))
        if n < 0 and lt.tape.follow_shim():  # a resume went live here: this tick is taped
            return self._select_record(timeout, sh)
        if n < 0:  # lenient replay past a divergence: the live loop
            return self._inner.select(timeout)
        data = sh.buf.raw[:n]
        (count,) = _TICK.unpack_from(data)
        want = [_EVENT.unpack_from(data, _TICK.size + i * _EVENT.size) for i in range(count)]
        ready = [(lt.fds[reg], mask) for reg, mask in want if reg in lt.fds]
        fds = (ctypes.c_int * max(1, len(ready)))(*[fd for fd, _ in ready])
        evs = (ctypes.c_short * max(1, len(ready)))(*[
            (select.POLLIN if m & selectors.EVENT_READ else 0)
            | (select.POLLOUT if m & selectors.EVENT_WRITE else 0) for _, m in ready])
        sh.wait_fds(fds, evs, len(ready))  # the baton is released around the real wait
        return [(self._inner.get_key(lt.fds[reg]), mask) for reg, mask in want
                if reg in lt.fds]

    def _select_record(self, timeout: float | None, sh: _Shim) -> list[tuple[Any, int]]:
        lt = self._lt
        real = timeout
        with lt.tape.shim.paused():
            if lt.side_ready:
                real = 0
            elif lt.side_timers:
                wait = max(0.0, lt.side_timers[0]._when - lt.loop.time())
                real = wait if real is None else min(real, wait)
            sh.gate_next()  # the select below releases the baton though paused
            events = self._inner.select(real)
        program, plumbing = [], []
        ssock = getattr(lt.loop, "_ssock", None)
        ssfd = ssock.fileno() if ssock is not None else -1
        for key, mask in events:
            if key.fd in lt.plumb:
                plumbing.append((key, mask))
            elif key.fd == ssfd and lt.self_writes[0] == 0 and lt.self_writes[1]:
                plumbing.append((key, mask))  # only paused code woke the loop
            else:
                program.append((key, mask))
        lt.self_writes = [0, 0]
        lt.run_plumbing(plumbing)
        payload = _TICK.pack(len(program)) + b"".join(
            _EVENT.pack(lt.regs[key.fd], mask) for key, mask in program)
        sh.put(OP_LOOP_TICK, payload, len(payload))
        return program


def install(selector_events: types.ModuleType) -> None:
    """Patch asyncio's selector loops (once): the selector, the schedulings, the timers."""
    base_events = asyncio.base_events
    cls = selector_events.BaseSelectorEventLoop
    if getattr(cls.__init__, "_stenograph", False):
        return
    orig_init = cls.__init__
    orig_call_soon = base_events.BaseEventLoop._call_soon
    orig_call_at = base_events.BaseEventLoop.call_at
    orig_write_to_self = cls._write_to_self
    orig_firstiter = base_events.BaseEventLoop._asyncgen_firstiter_hook
    orig_finalizer = base_events.BaseEventLoop._asyncgen_finalizer_hook

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        tape = current()
        if tape is None or not _shim().ok:
            return
        lt = LoopTape(self, tape)
        self._steno = lt
        self._selector = TapedSelector(lt, self._selector)

    def _call_soon(self: Any, callback: Any, args: Any, context: Any) -> Any:
        lt: LoopTape | None = getattr(self, "_steno", None)
        if lt is None:
            return orig_call_soon(self, callback, args, context)
        if isinstance(callback, _Marker):
            callback.point = (lt.tick, lt.count)
            h = asyncio.Handle(callback, args, self, context)
            h.cancel()
            return h
        if lt.record and lt.plumbing(callback, args):
            h = asyncio.Handle(callback, args, self, context)
            lt.side_ready.append(h)
            return h
        h = orig_call_soon(self, callback, args, context)
        lt.count += 1
        if lt.pending:
            lt.resolve()
        return h

    def call_at(self: Any, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        lt: LoopTape | None = getattr(self, "_steno", None)
        if lt is None or not lt.record or not lt.plumbing(callback):
            return orig_call_at(self, when, callback, *args, context=context)
        timer = _SideTimer(when, callback, args, self, context)
        heapq.heappush(lt.side_timers, timer)
        timer._scheduled = True
        return timer

    def _asyncgen_firstiter_hook(self: Any, agen: Any) -> None:
        lt: LoopTape | None = getattr(self, "_steno", None)
        if lt is not None and lt.adopt_agen(agen):
            return  # not the loop's to close at shutdown: replay never has it
        orig_firstiter(self, agen)

    def _asyncgen_finalizer_hook(self: Any, agen: Any) -> None:
        lt: LoopTape | None = getattr(self, "_steno", None)
        if lt is not None and lt.closing_plumbing(agen):
            with lt.tape.shim.paused():  # its aclose task and wake-up are plumbing
                orig_finalizer(self, agen)
            return
        if lt is not None and threading.get_ident() == self._thread_id:
            # on the loop's own thread the closing needs no wake-up of the selector: the
            # task is ready before the loop next waits. (A wake-up would put the moment
            # the collector dropped the generator -- which differs between a live
            # response and a recorded one -- on the tape.)
            self.call_soon(self.create_task, agen.aclose())
            return
        orig_finalizer(self, agen)

    def _write_to_self(self: Any) -> None:
        lt: LoopTape | None = getattr(self, "_steno", None)
        if lt is not None:
            lt.self_writes[1 if lt.paused() else 0] += 1
        orig_write_to_self(self)

    for fn in (__init__, _call_soon, call_at, _write_to_self, _asyncgen_firstiter_hook,
               _asyncgen_finalizer_hook):
        fn._stenograph = True  # type: ignore[attr-defined]
    cls.__init__ = __init__
    base_events.BaseEventLoop._call_soon = _call_soon
    base_events.BaseEventLoop.call_at = call_at
    cls._write_to_self = _write_to_self
    base_events.BaseEventLoop._asyncgen_firstiter_hook = _asyncgen_firstiter_hook
    base_events.BaseEventLoop._asyncgen_finalizer_hook = _asyncgen_finalizer_hook


# ------------------------------------------------------------------------ hooked calls


class Drive:
    """Record: await ``aw`` with every one of its steps paused but its suspensions not
    (other tasks run, taped, while it waits), noting how each suspension ended in
    ``log``: ``None`` for a bare yield, ``[tick, count]`` for a future completed at that
    point, ``"x"`` for a resumption by an exception (the program's own doing)."""

    def __init__(self, tape: PyTape, aw: Awaitable[Any], log: list[Any]) -> None:
        self.tape, self.aw, self.log = tape, aw, log

    def __await__(self) -> Generator[Any, Any, Any]:
        it = self.aw.__await__()
        send: Any = None
        exc: BaseException | None = None
        while True:
            with self.tape.shim.paused():
                try:
                    yielded = it.throw(exc) if exc is not None else it.send(send)
                except StopIteration as stop:
                    return stop.value
            marker = None
            if yielded is not None and hasattr(yielded, "add_done_callback"):
                marker = _Marker()
                yielded.add_done_callback(marker)
            try:
                send, exc = (yield yielded), None
            except BaseException as e:
                send, exc = None, e
            # A future completed (or cancelled: anyio delivers its cancel scopes by
            # cancelling the task's wait) at a known point; an exception thrown in with
            # no such point is the program's doing, and replays as its own doing.
            if marker is None:
                self.log.append(None if exc is None else "x")
            elif marker.point is None:
                self.log.append("x")
            elif exc is not None and yielded.cancelled():
                self.log.append([*marker.point, 1])  # woken by a cancel: replay cancels too
            else:
                self.log.append(list(marker.point))


@types.coroutine
def _bare_yield() -> Generator[None, None, None]:
    yield


async def replay_suspensions(tape: PyTape, log: list[Any] | None) -> None:
    """Replay: suspend as the recorded call did, waking at the recorded points. Its own
    bookkeeping runs paused (``get_running_loop`` reads the pid: record made no such
    call)."""
    if not log:
        return
    with tape.shim.paused():
        loop = asyncio.get_running_loop()
    lt: LoopTape | None = getattr(loop, "_steno", None)
    for s in log:
        if s is None:
            await _bare_yield()
            continue
        if lt is None:
            await _bare_yield()
            continue
        fut: asyncio.Future[None] = loop.create_future()
        if s == "x":
            await fut  # woken only by what the program throws in, as recorded
            continue
        point = (int(s[0]), int(s[1]))
        if point <= (lt.tick, lt.count):
            # the recorded wake-up came before anything else was scheduled: so does
            # this one (a done future would not suspend the task at all)
            await _bare_yield()
            continue
        heapq.heappush(lt.pending, (point, id(fut), fut))
        if len(s) > 2 and s[2]:
            lt.cancels.add(id(fut))
            try:
                await fut
            except asyncio.CancelledError:
                if id(fut) not in lt.cancels or not fut.cancelled():
                    raise
            finally:
                lt.cancels.discard(id(fut))
            continue
        await fut


def run_now(tape: PyTape, aw: Awaitable[Any]) -> Any:
    """Replay: run a library close for its effect on the program's objects, paused and
    without waiting (nothing it would wait for exists at replay); None if it must wait."""
    it = aw.__await__()
    with tape.shim.paused():
        try:
            while True:
                yielded = it.send(None)
                if yielded is not None and not (hasattr(yielded, "done") and yielded.done()):
                    it.close()
                    return None
        except StopIteration as stop:
            return stop.value


def discard(aw: Awaitable[Any]) -> None:
    """Replay: a call record made and replay does not: never started, closed quietly."""
    close = getattr(aw, "close", None)
    if close is not None:
        close()


if hasattr(asyncio, "selector_events"):  # imported by a hook while asyncio was importing
    from stenograph.interpose.settings import loop_taped

    if loop_taped():
        install(asyncio.selector_events)
