"""Stand-ins for services a resumed run must not ask again.

A process of a resumed run that reaches, live, a request the log knows was made (its
answer is in the log, or a person settled it done and gave the answer) must get that
answer without the service being asked twice (``recorder/answers.py``). Its shim
connects the request's socket to a stand-in here, on 127.0.0.1, instead of the service:
the stand-in reads the request as a server would (its head, then the body its
``Content-Length`` announces), sends the known answer, and closes its side. The program
reads it as it would have read the service's; its receives are taped as any others, so
the finished run replays as one tape.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

READ_QUIET = 2.0
"""Seconds of silence after which a request is taken as whole (a body with no length)."""


def _read_request(conn: socket.socket) -> None:
    """Read one HTTP/1 request: its head, then ``Content-Length`` bytes of body."""
    conn.settimeout(READ_QUIET)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
        while len(body) < length:
            got = conn.recv(65536)
            if not got:
                return
            body += got


class StandIns:
    """Every stand-in of one resume: ``open(answer)`` listens for one request and gives
    the port; ``close()`` ends them all."""

    def __init__(self) -> None:
        self._socks: list[socket.socket] = []
        self._lock = threading.RLock()
        self.served = 0

    def opener(self, answer: Callable[[], bytes]) -> Callable[[], int]:
        """A callable that opens a stand-in for ``answer()`` the first time it is called
        (the answer is read from the log only for a request a process really reaches)."""
        port: list[int] = []

        def open_() -> int:
            with self._lock:
                if not port:
                    port.append(self.open(answer()))
            return port[0]
        return open_

    def open(self, answer: bytes) -> int:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        with self._lock:
            self._socks.append(srv)
        threading.Thread(target=self._serve, args=(srv, answer), daemon=True,
                         name="steno-standin").start()
        return int(srv.getsockname()[1])

    def _serve(self, srv: socket.socket, answer: bytes) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                _read_request(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_WR)
                    conn.settimeout(READ_QUIET)
                    while conn.recv(65536):
                        pass
            with self._lock:
                self.served += 1

    def close(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
