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

from stenograph.interpose import seam
from stenograph.interpose.pytape import PyTape, current


def _recorded_error(mod: ModuleType, err: dict[str, Any], request: Any) -> BaseException:
    cls = getattr(mod, err["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, mod.TransportError)):
        cls = mod.TransportError
    return cls(err["message"], request=request)


def install(mod: ModuleType) -> None:
    """Patch ``mod`` (httpx or httpx2) once."""
    sync_t, async_t = mod.HTTPTransport, mod.AsyncHTTPTransport
    if getattr(sync_t.handle_request, "_stenograph", False):
        return
    orig_sync, orig_async = sync_t.handle_request, async_t.handle_async_request

    class TapeStream(mod.SyncByteStream):  # type: ignore[name-defined,misc]
        """The body the program iterates: off the wire as it comes (record, ``inner`` is
        the real stream) or the recorded chunks (replay, no ``inner``)."""

        def __init__(self, chunks: seam.Chunks, inner: Any = None) -> None:
            self.chunks, self.inner = chunks, inner

        def __iter__(self) -> Iterator[bytes]:
            while (chunk := self.chunks.next()) is not None:
                yield chunk

        def close(self) -> None:
            if self.inner is not None:
                seam.passthrough(self.chunks.tape, self.inner.close)
            self.chunks.close()

    class AsyncTapeStream(mod.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, chunks: seam.AsyncChunks, inner: Any = None) -> None:
            self.chunks, self.inner = chunks, inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while (chunk := await self.chunks.next()) is not None:
                yield chunk

        async def aclose(self) -> None:
            if self.inner is not None:
                await seam.apassthrough(self.chunks.tape, self.inner.aclose())
            self.chunks.close()

    def _headers(request: Any) -> list[tuple[str, str]]:
        return [(k, v) for k, v in request.headers.multi_items()]

    def _ext(extensions: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in extensions.items()
                if k in ("http_version", "reason_phrase") and isinstance(v, bytes)}

    def _replayed(tape: PyTape, call: seam.Call, request: Any, is_async: bool) -> Any:
        def rebuild(err: dict[str, Any]) -> BaseException:
            return _recorded_error(mod, err, request)

        def ended(msg: str) -> BaseException:
            return mod.ReadError(msg, request=request)

        rp = call.replayed(rebuild, lambda msg: mod.ConnectError(msg, request=request))
        stream: Any
        if is_async:
            stream = AsyncTapeStream(seam.AsyncChunks(tape, replayed=rp, ended=ended,
                                                      rebuild=rebuild))
        else:
            stream = TapeStream(seam.Chunks(tape, replayed=rp, ended=ended, rebuild=rebuild))
        return mod.Response(status_code=rp.status, headers=[(k, v) for k, v in rp.headers],
                            stream=stream, extensions=rp.ext)

    def _begin(tape: PyTape, request: Any, body: bytes) -> seam.Call:
        return seam.begin(tape, request.method, str(request.url), _headers(request), body)

    def handle_request(self: Any, request: Any) -> Any:
        tape = current()
        if tape is None:
            return orig_sync(self, request)
        with tape.shim.paused():
            call = _begin(tape, request, request.read())
            if tape.mode == "replay":
                return _replayed(tape, call, request, is_async=False)
            with call.sending():
                resp = orig_sync(self, request)
        rec = call.received(resp.status_code, list(resp.headers.multi_items()),
                            ext=_ext(resp.extensions))
        it = iter(resp.stream)

        def pull() -> tuple[bytes, bool]:
            for chunk in it:
                return chunk, False
            return b"", True

        chunks = seam.Chunks(tape, pull=pull, body=rec, ended=mod.ReadError,
                             rebuild=lambda err: _recorded_error(mod, err, request))
        return mod.Response(status_code=resp.status_code, headers=resp.headers,
                            stream=TapeStream(chunks, resp.stream), extensions=resp.extensions)

    async def handle_async_request(self: Any, request: Any) -> Any:
        tape = current()
        if tape is None:
            return await orig_async(self, request)
        with tape.shim.paused():
            call = _begin(tape, request, await request.aread())
            if tape.mode == "replay":
                return _replayed(tape, call, request, is_async=True)
            with call.sending():
                resp = await orig_async(self, request)
        rec = call.received(resp.status_code, list(resp.headers.multi_items()),
                            ext=_ext(resp.extensions))
        it = resp.stream.__aiter__()

        async def pull() -> tuple[bytes, bool]:
            try:
                return await it.__anext__(), False
            except StopAsyncIteration:
                return b"", True

        chunks = seam.AsyncChunks(tape, pull=pull, body=rec, ended=mod.ReadError,
                                  rebuild=lambda err: _recorded_error(mod, err, request))
        return mod.Response(status_code=resp.status_code, headers=resp.headers,
                            stream=AsyncTapeStream(chunks, resp.stream),
                            extensions=resp.extensions)

    orig_close, orig_aclose = sync_t.close, async_t.aclose

    def close(self: Any) -> None:
        tape = current()
        if tape is None:
            return orig_close(self)
        return seam.passthrough(tape, orig_close, self)

    async def aclose(self: Any) -> None:
        # Closing the pool closes the connections record opened and replay never did (an
        # async close also runs event-loop iterations that read clocks): off the tape.
        tape = current()
        if tape is None:
            return await orig_aclose(self)
        if tape.mode == "replay":
            return None
        return await seam.apassthrough(tape, orig_aclose(self))

    handle_request._stenograph = True  # type: ignore[attr-defined]
    handle_async_request._stenograph = True  # type: ignore[attr-defined]
    sync_t.handle_request = handle_request
    async_t.handle_async_request = handle_async_request
    sync_t.close = close
    async_t.aclose = aclose
