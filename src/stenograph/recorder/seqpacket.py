"""The recorder's listening end: a unix ``SOCK_SEQPACKET`` socket, one event loop.

Both of the recorder's sockets (the shim's tape session and the Python hooks'
exchange server) need the same thing: message boundaries kept by the kernel, the
messages of one connection handled strictly in order (a barrier or an
acknowledgement then means "everything before it on this connection is appended"),
and a close that lets connections still draining finish first.

Every process of a recorded tree connects at least once (and again after each exec),
so a connection must cost next to nothing: a thread started per connection cost
~0.35 ms of wall each under GIL contention, on every exec. Here one selector thread
watches every connection, and a connection with messages waiting is handed to a small
pool of workers (sized to the cores, not to the processes), which handles its messages
in order until it has none, then gives it back to the selector. A connection is in at
most one worker at a time, so its order holds; a handler that waits (a barrier's sync)
holds one worker, never the loop.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

Handler = Callable[[socket.socket, bytes], None]
Quick = Callable[[bytes], bool]
FdHandler = Callable[[socket.socket, bytes, list[int]], None]
CloseHandler = Callable[[socket.socket], None]

_DONE, _WAIT, _ENDED = "done", "wait", "ended"
"""What one turn of ``SeqpacketServer._serve_one`` came to."""

WORKERS = max(4, 2 * (os.cpu_count() or 2))
"""Workers per server: messages of different connections handled at once (a barrier
waiting for a sync holds one)."""


class SeqpacketServer:
    """Serve ``handler(conn, message)`` for every message of every connection.

    A handler that raises has the error noted in ``errors``; with ``stop_on_error``
    the connection is then closed, so a client waiting for an acknowledgement fails
    instead of going on as if its message had been kept.

    With ``quick``, the loop looks at (peeks) each waiting message's first ``peek``
    bytes and handles one that ``quick`` says never waits for anything itself: no hand-off
    to a worker and back, which cost more than the handling (a process's exit, its arena
    announced: two per exec). The first message that is not quick goes to a worker with
    the rest of the connection's queue, as without it.

    With ``fd_handler``, a message that carries file descriptors (``SCM_RIGHTS``) goes
    to it instead, with the descriptors (which it owns from then on). ``on_close`` runs
    once a connection has ended, after its last message: for a peer that dies, that
    is the moment its death is known.
    """

    def __init__(self, path: str | Path, handler: Handler, *, name: str,
                 max_message: int, rcvbuf: int | None = None,
                 stop_on_error: bool = False, fd_handler: FdHandler | None = None,
                 on_close: CloseHandler | None = None, quick: Quick | None = None,
                 peek: int = 64) -> None:
        self.path = str(path)
        self._quick = quick
        self._peek = peek
        self.errors: list[str] = []
        self._handler = handler
        self._max = max_message
        self._rcvbuf = rcvbuf
        self._stop_on_error = stop_on_error
        self._fd_handler = fd_handler
        self._on_close = on_close
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._open = 0
        self._closing = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind(self.path)
        self._sock.listen(512)
        self._sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._back: list[socket.socket] = []  # connections a worker gives back
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"{name}-w")
        self._loop = threading.Thread(target=self._run, name=name, daemon=True)
        self._loop.start()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    # -- the loop

    def _run(self) -> None:
        while True:
            try:
                ready = self._sel.select()
            except (OSError, ValueError):
                return
            for key, _ in ready:
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                    if self._regive() is None:
                        return
                elif key.fileobj is self._sock:
                    self._accept()
                else:
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    self._sel.unregister(conn)
                    if self._quick is None or not self._serve_quick(conn):
                        self._pool.submit(self._serve, conn)

    def _regive(self) -> bool | None:
        """Watch again the connections workers gave back; None once closing is done."""
        with self._lock:
            back, self._back = self._back, []
            done = self._closing and self._open == 0
        for conn in back:
            with contextlib.suppress(ValueError, KeyError, OSError):
                self._sel.register(conn, selectors.EVENT_READ, None)
        return None if done else True

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._rcvbuf:
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            with self._lock:
                self._open += 1
            self._sel.register(conn, selectors.EVENT_READ, None)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def _serve_quick(self, conn: socket.socket) -> bool:
        """On the loop: handle ``conn``'s waiting messages while they are quick. True when
        the connection is dealt with (watched again, or ended); False: a worker takes it."""
        while True:
            try:
                head = conn.recv(self._peek, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                head = None
            except OSError:
                return False
            if head is not None and (not head or not self._quick(head)):
                return False  # (an end, too: the worker's path closes it)
            step = self._serve_one(conn) if head is not None else _WAIT
            if step is _WAIT:
                with contextlib.suppress(ValueError, KeyError, OSError):
                    self._sel.register(conn, selectors.EVENT_READ, None)
                return True
            if step is _ENDED:
                self._end(conn)
                return True

    def _serve_one(self, conn: socket.socket) -> str:
        """One message off ``conn``, handled: ``_DONE``; ``_WAIT`` when none is waiting;
        ``_ENDED`` when the connection has ended (its peer closed it, or a handler failed
        under ``stop_on_error``). A handler's error is noted: one bad peer must not stop
        the others."""
        fds: list[int] = []
        try:
            if self._fd_handler is None:  # (sends, the acks, stay blocking)
                msg = conn.recv(self._max, socket.MSG_DONTWAIT)
            else:
                msg, fds = _recv_fds(conn, self._max, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return _WAIT
        except OSError:
            return _ENDED
        if not msg:
            for fd in fds:
                os.close(fd)
            return _ENDED
        try:
            if fds and self._fd_handler is not None:
                self._fd_handler(conn, msg, fds)
            else:
                self._handler(conn, msg)
        except Exception as exc:
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            if self._stop_on_error:
                return _ENDED
        return _DONE

    # -- a worker

    def _serve(self, conn: socket.socket) -> None:
        """Handle every message ``conn`` has waiting, in order; then give it back to the
        loop (or, at its end, close it)."""
        ended = False
        try:
            while (step := self._serve_one(conn)) is _DONE:
                pass
            ended = step is _ENDED
        except BaseException:  # (never leave a connection unwatched)
            ended = True
            raise
        finally:
            if ended:
                self._end(conn)
            else:
                with self._lock:
                    self._back.append(conn)
                self._wake()

    def _end(self, conn: socket.socket) -> None:
        if self._on_close is not None:
            try:
                self._on_close(conn)
            except Exception as exc:  # noted, as a handler's error is
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
        conn.close()
        with self._lock:
            self._open -= 1
            self._idle.notify_all()
        self._wake()

    def close(self, grace: float = 2.0) -> None:
        """Stop accepting; give open connections up to ``grace`` seconds to finish."""
        with self._lock:
            self._idle.wait_for(lambda: self._open == 0, timeout=grace)
            self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with self._lock:
            self._open = 0  # (the rest are abandoned: the loop ends)
        self._wake()
        self._loop.join(timeout=1.0)
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            for key in list(self._sel.get_map().values()):
                if isinstance(key.fileobj, socket.socket) and key.fileobj is not self._sock:
                    key.fileobj.close()  # a process still alive: its barriers now fail
            self._sel.close()
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _recv_fds(conn: socket.socket, limit: int, flags: int = 0) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it (at most 4 are kept)."""
    msg, ancdata, _flags, _addr = conn.recvmsg(limit, socket.CMSG_SPACE(4 * 4), flags)
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i:i + 4], "little") for i in range(0, usable, 4))
    return msg, fds
