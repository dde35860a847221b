"""httpx and httpx2 (same API): the transport seam, sync and async.

``HTTPTransport.handle_request`` / ``AsyncHTTPTransport.handle_async_request``
are where a request leaves for the network, as in VCR.py and respx. Record wraps
the response stream so every chunk is kept with its boundaries (SSE replays in
the same chunks); replay builds the response from the tape and never connects.
Bytes are kept as they came off the wire (before content decoding), so the
client's own decoders run in replay exactly as they did.

Async caveat: the tape is paused for the whole awaited network call, which is
exact for one request at a time per thread; concurrent tasks that read clocks
while a request is in flight are reported as incidental drift.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

from stenograph.interpose.exchange import (
    classify,
    describe,
    error_body,
    response_headers,
    split_chunks,
)
from stenograph.interpose.pytape import PyTape, ReplayExhausted, current


class _Entry:
    """One exchange being recorded: committed once its response is finished."""

    def __init__(self, tape: PyTape, channel: str, pos: int, fp: str,
                 request: dict[str, Any], status: int, headers: list[tuple[str, str]],
                 extensions: dict[str, Any]) -> None:
        self.tape, self.channel, self.pos, self.fp = tape, channel, pos, fp
        self.request = request
        self.status = status
        self.headers = headers
        self.ext = {k: v for k, v in extensions.items()
                    if k in ("http_version", "reason_phrase") and isinstance(v, bytes)}
        self.chunks: list[bytes] = []
        self.error: dict[str, Any] | None = None
        self.done = False

    def failed(self, exc: BaseException) -> None:
        """The wire broke mid-body: keep the chunks so far and what went wrong."""
        self.error = error_body(exc)
        self.finish(complete=False)

    def finish(self, complete: bool) -> None:
        if self.done:
            return
        self.done = True
        body = b"".join(self.chunks)
        self.tape.commit(self.channel, self.pos, {
            "fingerprint": self.fp,
            "request": self.request,
            "response": {
                "status": self.status,
                "headers": response_headers(self.tape, self.headers),
                "ext": self.ext,
                "body": self.tape.spill(body),
                "chunks": [len(c) for c in self.chunks],
                "complete": complete,
            },
            "error": self.error,
        })


def _raise_recorded(mod: ModuleType, err: dict[str, Any], request: Any) -> None:
    cls = getattr(mod, err["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, mod.TransportError)):
        cls = mod.TransportError
    raise cls(err["message"], request=request)


def install(mod: ModuleType) -> None:
    """Patch ``mod`` (httpx or httpx2) once."""
    sync_t, async_t = mod.HTTPTransport, mod.AsyncHTTPTransport
    if getattr(sync_t.handle_request, "_stenograph", False):
        return
    orig_sync, orig_async = sync_t.handle_request, async_t.handle_async_request

    class RecStream(mod.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, entry: _Entry) -> None:
            self.inner, self.entry = inner, entry

        def __iter__(self) -> Iterator[bytes]:
            it = iter(self.inner)
            while True:
                with self.entry.tape.shim.paused():
                    try:
                        chunk = next(it)
                    except StopIteration:
                        break
                    except Exception as exc:
                        self.entry.failed(exc)
                        raise
                    self.entry.chunks.append(chunk)
                yield chunk
            with self.entry.tape.shim.paused():
                self.entry.finish(complete=True)

        def close(self) -> None:
            with self.entry.tape.shim.paused():
                self.inner.close()
                self.entry.finish(complete=False)

    class AsyncRecStream(mod.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, entry: _Entry) -> None:
            self.inner, self.entry = inner, entry

        async def __aiter__(self) -> AsyncIterator[bytes]:
            it = self.inner.__aiter__()
            while True:
                with self.entry.tape.shim.paused():
                    try:
                        chunk = await it.__anext__()
                    except StopAsyncIteration:
                        break
                    except Exception as exc:
                        self.entry.failed(exc)
                        raise
                    self.entry.chunks.append(chunk)
                yield chunk
            with self.entry.tape.shim.paused():
                self.entry.finish(complete=True)

        async def aclose(self) -> None:
            with self.entry.tape.shim.paused():
                await self.inner.aclose()
                self.entry.finish(complete=False)

    class ReplayStream(mod.SyncByteStream, mod.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, chunks: list[bytes], error: dict[str, Any] | None,
                     request: Any) -> None:
            self.chunks, self.error, self.request = chunks, error, request

        def __iter__(self) -> Iterator[bytes]:
            yield from self.chunks
            if self.error is not None:
                _raise_recorded(mod, self.error, self.request)

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for c in self.chunks:
                yield c
            if self.error is not None:
                _raise_recorded(mod, self.error, self.request)

    def _headers(request: Any) -> list[tuple[str, str]]:
        return [(k, v) for k, v in request.headers.multi_items()]

    def _replayed(tape: PyTape, request: Any, body: bytes) -> Any:
        url = str(request.url)
        channel = classify(url)
        pos = tape.begin(channel)
        _, match, fp = describe(tape, request.method, url, _headers(request), body)
        try:
            entry = tape.take(channel, pos, match, fp)
        except ReplayExhausted as exc:
            raise mod.ConnectError(str(exc), request=request) from None
        resp = entry.get("response")
        if resp is None:
            _raise_recorded(mod, entry["error"], request)
        chunks = split_chunks(tape.resolve(resp["body"]), resp["chunks"])
        return mod.Response(
            status_code=resp["status"],
            headers=[(k, v) for k, v in resp["headers"]],
            stream=ReplayStream(chunks, entry.get("error"), request),
            extensions=dict(resp.get("ext", {})),
        )

    def handle_request(self: Any, request: Any) -> Any:
        tape = current()
        if tape is None:
            return orig_sync(self, request)
        with tape.shim.paused():
            body = request.read()
            if tape.mode == "replay":
                return _replayed(tape, request, body)
            url = str(request.url)
            channel = classify(url)
            pos = tape.begin(channel)
            rec, _, fp = describe(tape, request.method, url, _headers(request), body)
            try:
                resp = orig_sync(self, request)
            except Exception as exc:
                tape.commit(channel, pos, {"fingerprint": fp, "request": rec, "response": None,
                                           "error": error_body(exc)})
                raise
        entry = _Entry(tape, channel, pos, fp, rec, resp.status_code,
                       list(resp.headers.multi_items()), resp.extensions)
        return mod.Response(status_code=resp.status_code, headers=resp.headers,
                            stream=RecStream(resp.stream, entry), extensions=resp.extensions)

    async def handle_async_request(self: Any, request: Any) -> Any:
        tape = current()
        if tape is None:
            return await orig_async(self, request)
        with tape.shim.paused():
            body = await request.aread()
            if tape.mode == "replay":
                return _replayed(tape, request, body)
            url = str(request.url)
            channel = classify(url)
            pos = tape.begin(channel)
            rec, _, fp = describe(tape, request.method, url, _headers(request), body)
            try:
                resp = await orig_async(self, request)
            except Exception as exc:
                tape.commit(channel, pos, {"fingerprint": fp, "request": rec, "response": None,
                                           "error": error_body(exc)})
                raise
        entry = _Entry(tape, channel, pos, fp, rec, resp.status_code,
                       list(resp.headers.multi_items()), resp.extensions)
        return mod.Response(status_code=resp.status_code, headers=resp.headers,
                            stream=AsyncRecStream(resp.stream, entry), extensions=resp.extensions)

    orig_close, orig_aclose = sync_t.close, async_t.aclose

    def close(self: Any) -> None:
        tape = current()
        if tape is None:
            return orig_close(self)
        with tape.shim.paused():
            return orig_close(self)

    async def aclose(self: Any) -> None:
        # Closing the pool closes the connections record opened and replay never did (an
        # async close also runs event-loop iterations that read clocks): off the tape.
        tape = current()
        if tape is None:
            return await orig_aclose(self)
        if tape.mode == "replay":
            return None
        with tape.shim.paused():
            return await orig_aclose(self)

    handle_request._stenograph = True  # type: ignore[attr-defined]
    handle_async_request._stenograph = True  # type: ignore[attr-defined]
    sync_t.handle_request = handle_request
    async_t.handle_async_request = handle_async_request
    sync_t.close = close
    async_t.aclose = aclose
