"""requests (urllib3 underneath): the adapter seam, ``HTTPAdapter.send``.

The program's response is read, in both modes, by urllib3 and ``http.client`` over
a tape wire (``_Wire``): the response head, then the body framed the way it came
(``transfer-encoding: chunked`` frames, or the bytes as they are). Record fills
that wire from the real connection one read at a time, when the program asks for
it, so ``iter_content``, ``iter_lines``, ``raw.read``/``raw.stream`` get each chunk
as it arrives, the end arrives when the body ends, and content decoding (gzip) runs
over the same undecoded bytes in both modes; replay fills it from the tape with the
recorded chunks. Only the source of the wire differs between the modes, so every
reading style sees the same chunks in both.

The real response's undecoded body is read with urllib3's public ``read_chunked``
(one HTTP chunk at a time) or ``read1`` (what the socket has) and
``decode_content=False``.
"""

from __future__ import annotations

import http.client
import io
from types import ModuleType
from typing import Any

from stenograph.interpose import seam
from stenograph.interpose.pytape import PyTape, current

_NO_BODY = {204, 304}
_READ = 64 << 10


def _body_bytes(request: Any) -> bytes:
    body = request.body
    if body is None:
        return b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif not isinstance(body, (bytes, bytearray)):
        data = body.read() if hasattr(body, "read") else b"".join(body)
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        request.body = body
    return bytes(body)


class _Wire(io.RawIOBase):
    """One response as ``http.client`` reads it off a socket: the head, then the body
    chunks from ``seam.Chunks`` (each pulled when the reader needs more bytes), framed
    as chunked when the response was. Closing it (the program closed the response, or
    it was collected) closes the body: a half-read one is committed incomplete."""

    def __init__(self, head: bytes, chunks: seam.Chunks, chunked: bool) -> None:
        super().__init__()
        self._buf, self._at = head, 0
        self._chunks, self._chunked, self._ended = chunks, chunked, False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._at >= len(self._buf):
            if self._ended:
                return 0
            chunk = self._chunks.next()
            if chunk is None:
                self._ended = True
                self._buf, self._at = (b"0\r\n\r\n" if self._chunked else b""), 0
            elif self._chunked:
                self._buf, self._at = b"%x\r\n%s\r\n" % (len(chunk), chunk), 0
            else:
                self._buf, self._at = chunk, 0
        n = min(len(b), len(self._buf) - self._at)
        b[:n] = self._buf[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._chunks.close()
        super().close()


class _Socket:
    """What ``http.client.HTTPResponse`` asks of its socket: a file to read from."""

    def __init__(self, wire: _Wire) -> None:
        self._wire = wire

    def makefile(self, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(self._wire)


def _head(status: int, reason: str | None, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or ''}".rstrip()]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _tape_response(urllib3: ModuleType, method: str, status: int, reason: str | None,
                   headers: list[tuple[str, str]], chunks: seam.Chunks) -> Any:
    """The urllib3 response the program reads, over ``_Wire``; the same in both modes.
    ``decode_content=False`` as ``HTTPAdapter.send`` asks: ``iter_content`` decodes,
    ``raw.read()`` gives the bytes as sent."""
    chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower()
                  for k, v in headers)
    wire = _Wire(_head(status, reason, headers), chunks, chunked)
    original = http.client.HTTPResponse(_Socket(wire), method=method)  # type: ignore[arg-type]
    original.begin()
    return urllib3.HTTPResponse(
        body=original, headers=urllib3.HTTPHeaderDict(headers), status=status,
        version=11, version_string="HTTP/1.1", reason=reason, preload_content=False,
        decode_content=False, original_response=original, request_method=method,
    )


def _has_body(method: str, status: int) -> bool:
    return method.upper() != "HEAD" and status not in _NO_BODY and status >= 200


def _puller(raw: Any, method: str) -> seam.Pull:
    """One read of the real body, undecoded, as it arrives: an HTTP chunk, or what the
    socket has (at most ``_READ`` bytes); the end is known as soon as it is read."""
    if not _has_body(method, raw.status):
        return lambda: (raw.read(decode_content=False), True)
    if raw.chunked and raw.supports_chunked_reads():
        it = raw.read_chunked(None, decode_content=False)

        def chunk() -> tuple[bytes, bool]:
            for c in it:
                return c, False
            return b"", True
        return chunk
    remaining = raw.length_remaining
    read1 = getattr(raw, "read1", None)

    def some() -> tuple[bytes, bool]:
        nonlocal remaining
        if read1 is not None:
            data = read1(_READ, decode_content=False)
        else:
            data = raw.read(_READ if remaining is None else min(_READ, remaining),
                            decode_content=False)
        if remaining is not None:
            remaining -= len(data)
        return data, not data or remaining == 0
    return some


def install(adapters: ModuleType) -> None:
    """Patch ``requests.adapters.HTTPAdapter.send`` once."""
    import requests
    import urllib3

    cls = adapters.HTTPAdapter
    if getattr(cls.send, "_stenograph", False):
        return
    orig = cls.send
    body_mods = ("urllib3.exceptions", "http.client", "builtins", "ssl", "socket")

    def send(self: Any, request: Any, stream: bool = False, timeout: Any = None,
             verify: Any = True, cert: Any = None, proxies: Any = None) -> Any:
        tape = seam.tape_for(request.url)
        if tape is None:
            return orig(self, request, stream, timeout, verify, cert, proxies)
        with tape.shim.paused():
            return _send(tape, self, request, timeout, verify, cert, proxies)

    def _error(err: dict[str, Any], request: Any) -> BaseException:
        cls = getattr(requests.exceptions, err["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, requests.exceptions.RequestException)):
            cls = requests.exceptions.ConnectionError
        return cls(err["message"], request=request)

    def _body_error(err: dict[str, Any]) -> BaseException:
        return seam.rebuild_error(err, body_mods, urllib3.exceptions.ProtocolError)

    def _send(tape: PyTape, adapter: Any, request: Any, timeout: Any, verify: Any, cert: Any,
              proxies: Any) -> Any:
        body = _body_bytes(request)
        call = seam.begin(tape, request.method, request.url, list(request.headers.items()),
                          body)
        if call.replaying:
            rp = call.replayed(
                lambda err: _error(err, request),
                lambda msg: requests.exceptions.ConnectionError(msg, request=request))
            headers = [(k, v) for k, v in rp.headers]
            chunks = seam.Chunks(tape, replayed=rp, ended=urllib3.exceptions.ProtocolError,
                                 rebuild=_body_error)
            raw = _tape_response(urllib3, request.method, rp.status, rp.reason, headers, chunks)
            return adapter.build_response(request, raw)
        for k, v in call.extra_headers:  # an effect's idempotency key, fencing token
            request.headers[k] = v
        if call.url_override is not None:  # a fork's rerouted call (seam.fork_route)
            request.url = call.url_override
        if call.body_override is not None:  # a resume pinning its model (seam.drift_check)
            request.body = call.body_override
            request.headers["Content-Length"] = str(len(call.body_override))
        with call.sending(lambda m: requests.exceptions.ConnectionError(m, request=request)):
            response = orig(adapter, request, True, timeout, verify, cert, proxies)
        real = response.raw
        headers = list(real.headers.items())
        rec = call.received(response.status_code, headers, reason=response.reason)

        def end(read_all: bool) -> None:
            if not read_all:
                real.close()
            real.release_conn()

        chunks = seam.Chunks(tape, pull=_puller(real, request.method), body=rec,
                             ended=urllib3.exceptions.ProtocolError, rebuild=_body_error,
                             on_end=end)
        response.raw = _tape_response(urllib3, request.method, response.status_code,
                                      response.reason, headers, chunks)
        if not _has_body(request.method, response.status_code):
            chunks.next()
        return response

    send._stenograph = True  # type: ignore[attr-defined]
    cls.send = send
    _pause_pool_close(urllib3)


def _pause_pool_close(urllib3: ModuleType) -> None:
    """Closing a pool closes the connections record opened and replay never did (the pool
    itself exists only in record): do it off the tape, whether ``close()`` is called or the
    pool's finalizer runs when the session is collected."""
    pools = getattr(urllib3, "connectionpool", None)
    orig = getattr(pools, "_close_pool_connections", None)
    if orig is None or getattr(orig, "_stenograph", False):
        return

    def _close_pool_connections(pool: Any) -> None:
        tape = current()
        if tape is None:
            return orig(pool)
        return seam.passthrough(tape, orig, pool)

    _close_pool_connections._stenograph = True  # type: ignore[attr-defined]
    pools._close_pool_connections = _close_pool_connections
