"""The recorder's listening end: a unix ``SOCK_SEQPACKET`` socket, one thread per peer.

Both of the recorder's sockets (the shim's tape session and the Python hooks'
exchange server) need the same thing: message boundaries kept by the kernel, the
messages of one connection handled strictly in order (a barrier or an
acknowledgement then means "everything before it on this connection is appended"),
and a close that lets connections still draining finish first.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[socket.socket, bytes], None]
FdHandler = Callable[[socket.socket, bytes, list[int]], None]
CloseHandler = Callable[[socket.socket], None]


class SeqpacketServer:
    """Serve ``handler(conn, message)`` for every message of every connection.

    A handler that raises has the error noted in ``errors``; with ``stop_on_error``
    the connection is then closed, so a client waiting for an acknowledgement fails
    instead of going on as if its message had been kept.

    With ``fd_handler``, a message that carries file descriptors (``SCM_RIGHTS``) goes
    to it instead, with the descriptors (which it owns from then on). ``on_close`` runs
    once a connection has ended, after its last message: for a peer that dies, that
    is the moment its death is known.
    """

    def __init__(self, path: str | Path, handler: Handler, *, name: str,
                 max_message: int, rcvbuf: int | None = None,
                 stop_on_error: bool = False, fd_handler: FdHandler | None = None,
                 on_close: CloseHandler | None = None) -> None:
        self.path = str(path)
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
        self._threads: list[threading.Thread] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind(self.path)
        self._sock.listen(128)
        self._acceptor = threading.Thread(target=self._accept, name=name, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._rcvbuf:
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            with self._lock:
                self._open += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            if len(self._threads) >= 64:  # a long run has thousands of processes: keep
                self._threads = [x for x in self._threads if x.is_alive()]  # the live ones
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                fds: list[int] = []
                try:
                    if self._fd_handler is None:
                        msg = conn.recv(self._max)
                    else:
                        msg, fds = _recv_fds(conn, self._max)
                except OSError:
                    return
                if not msg:
                    for fd in fds:
                        os.close(fd)
                    return
                try:
                    if fds and self._fd_handler is not None:
                        self._fd_handler(conn, msg, fds)
                    else:
                        self._handler(conn, msg)
                except Exception as exc:  # noted; one bad peer must not stop the others
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    if self._stop_on_error:
                        return
        finally:
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

    def close(self, grace: float = 2.0) -> None:
        """Stop accepting; give open connections up to ``grace`` seconds to finish."""
        with self._lock:
            self._idle.wait_for(lambda: self._open == 0, timeout=grace)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        for t in list(self._threads):
            t.join(timeout=0.5)


def _recv_fds(conn: socket.socket, limit: int) -> tuple[bytes, list[int]]:
    """One message and the descriptors that came with it (at most 4 are kept)."""
    msg, ancdata, _flags, _addr = conn.recvmsg(limit, socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i:i + 4], "little") for i in range(0, usable, 4))
    return msg, fds
