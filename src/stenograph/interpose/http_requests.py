"""requests (urllib3 underneath): the adapter seam, ``HTTPAdapter.send``.

Record reads the whole raw body (undecoded) off the connection inside the hook,
then hands requests a fresh urllib3 response over those bytes, so content
decoding runs in replay exactly as in record. Chunk boundaries are kept as read;
a streamed requests response is therefore buffered before the program sees it
(same bytes, earlier arrival). Cookies from ``set-cookie`` are not re-applied in
replay (the header is redacted from the log).
"""

from __future__ import annotations

import io
from types import ModuleType
from typing import Any

from stenograph.interpose.exchange import classify, describe, error_body, response_headers
from stenograph.interpose.pytape import PyTape, ReplayExhausted, current


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


def _raw(urllib3: ModuleType, status: int, reason: str | None, headers: list[list[str]],
         body: bytes, method: str) -> Any:
    return urllib3.HTTPResponse(
        body=io.BytesIO(body),
        headers=urllib3.HTTPHeaderDict([(k, v) for k, v in headers]),
        status=status, reason=reason, version=11, version_string="HTTP/1.1",
        preload_content=False, decode_content=True, request_method=method,
    )


def _error_class(requests: ModuleType, name: str) -> type[Exception]:
    cls = getattr(requests.exceptions, name, None)
    if isinstance(cls, type) and issubclass(cls, requests.exceptions.RequestException):
        return cls
    return requests.exceptions.ConnectionError


def install(adapters: ModuleType) -> None:
    """Patch ``requests.adapters.HTTPAdapter.send`` once."""
    import requests
    import urllib3

    cls = adapters.HTTPAdapter
    if getattr(cls.send, "_stenograph", False):
        return
    orig = cls.send

    def send(self: Any, request: Any, stream: bool = False, timeout: Any = None,
             verify: Any = True, cert: Any = None, proxies: Any = None) -> Any:
        tape = current()
        if tape is None:
            return orig(self, request, stream, timeout, verify, cert, proxies)
        with tape.shim.paused():
            return _send(tape, self, request, stream, timeout, verify, cert, proxies)

    def _send(tape: PyTape, adapter: Any, request: Any, stream: bool, timeout: Any,
              verify: Any, cert: Any, proxies: Any) -> Any:
        body = _body_bytes(request)
        url = request.url
        channel = classify(url)
        pos = tape.begin(channel)
        headers = [(k, v) for k, v in request.headers.items()]
        rec, match, fp = describe(tape, request.method, url, headers, body)
        if tape.mode == "replay":
            try:
                entry = tape.take(channel, pos, match, fp)
            except ReplayExhausted as exc:
                raise requests.exceptions.ConnectionError(str(exc), request=request) from None
            resp = entry.get("response")
            if resp is None:
                err = entry["error"]
                raise _error_class(requests, err["type"])(err["message"], request=request)
            raw = _raw(urllib3, resp["status"], resp.get("reason"), resp["headers"],
                       tape.resolve(resp["body"]), request.method)
            return adapter.build_response(request, raw)
        try:
            response = orig(adapter, request, True, timeout, verify, cert, proxies)
            chunks = list(response.raw.stream(64 << 10, decode_content=False))
        except Exception as exc:
            tape.commit(channel, pos, {"fingerprint": fp, "request": rec, "response": None,
                                       "error": error_body(exc)})
            raise
        data = b"".join(chunks)
        raw_headers = list(response.raw.headers.items())
        tape.commit(channel, pos, {
            "fingerprint": fp, "request": rec, "error": None,
            "response": {"status": response.status_code, "reason": response.reason,
                         "headers": response_headers(tape, raw_headers),
                         "body": tape.spill(data), "chunks": [len(c) for c in chunks],
                         "complete": True},
        })
        response.raw.release_conn()
        response.raw = _raw(urllib3, response.status_code, response.reason,
                            [[k, v] for k, v in raw_headers], data, request.method)
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
        with tape.shim.paused():
            return orig(pool)

    _close_pool_connections._stenograph = True  # type: ignore[attr-defined]
    pools._close_pool_connections = _close_pool_connections
