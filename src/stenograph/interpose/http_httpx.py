"""httpx and httpx2 (same API): the transport seam, sync and async.

``HTTPTransport.handle_request`` / ``AsyncHTTPTransport.handle_async_request``
are where a request leaves for the network, as in VCR.py and respx. Record wraps
the response stream so every chunk is kept with its boundaries (SSE replays in
the same chunks); replay builds the response from the tape and never connects.
Bytes are kept as they came off the wire (before content decoding), so the
client's own decoders run in replay exactly as they did.

Async: the real call's steps run paused, its waits do not, and where each wait ended
is kept with the exchange and reproduced at replay (``interpose.aioloop``), so any
number of overlapping requests in one loop replay in the recorded interleaving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

from stenograph.interpose import seam
from stenograph.interpose.pytape import PyTape, current
from stenograph.interpose.settings import loop_taped


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
            tape = self.chunks.tape
            if self.inner is not None:
                await seam.apassthrough(tape, self.inner.aclose(), "httpx response close")
            elif tape.mode == "replay":  # the recorded close's suspensions, nothing closed
                await seam.apassthrough(tape, _nothing(), "httpx response close")
            self.chunks.close()

    async def _nothing() -> None:
        return None

    def _headers(request: Any) -> list[tuple[str, str]]:
        return [(k, v) for k, v in request.headers.multi_items()]

    def _ext(extensions: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in extensions.items()
                if k in ("http_version", "reason_phrase") and isinstance(v, bytes)}

    def _replayed(tape: PyTape, call: seam.Call, request: Any, is_async: bool,
                  entry: dict[str, Any] | None = None) -> Any:
        def rebuild(err: dict[str, Any]) -> BaseException:
            return _recorded_error(mod, err, request)

        def ended(msg: str) -> BaseException:
            return mod.ReadError(msg, request=request)

        rp = call.replayed(rebuild, lambda msg: mod.ConnectError(msg, request=request), entry)
        stream: Any
        if is_async:
            stream = AsyncTapeStream(seam.AsyncChunks(tape, replayed=rp, ended=ended,
                                                      rebuild=rebuild))
        else:
            stream = TapeStream(seam.Chunks(tape, replayed=rp, ended=ended, rebuild=rebuild))
        return mod.Response(status_code=rp.status, headers=[(k, v) for k, v in rp.headers],
                            stream=stream, extensions=rp.ext)

    def _override(request: Any, call: seam.Call) -> None:
        """A resume pinning its model (``seam.drift_check``): the request's new body; a
        fork's rerouted call (``seam.fork_route``): its new URL."""
        if call.url_override is not None:
            request.url = mod.URL(call.url_override)
            request.headers["Host"] = request.url.netloc.decode("ascii")
        if call.body_override is not None:
            request.stream = mod.ByteStream(call.body_override)
            request._content = call.body_override
            request.headers["Content-Length"] = str(len(call.body_override))

    def _begin(tape: PyTape, request: Any, body: bytes) -> seam.Call:
        return seam.begin(tape, request.method, str(request.url), _headers(request), body)

    def handle_request(self: Any, request: Any) -> Any:
        tape = seam.tape_for(str(request.url))
        if tape is None:
            _mark_local(self)
            return orig_sync(self, request)
        with tape.shim.paused():
            call = _begin(tape, request, request.read())
            if call.replaying:
                return _replayed(tape, call, request, is_async=False)
            for k, v in call.extra_headers:  # an effect's idempotency key, fencing token
                request.headers[k] = v
            _override(request, call)
            with call.sending(lambda m: mod.ConnectError(m, request=request)):
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
        tape = seam.tape_for(str(request.url))
        if tape is None:
            _mark_local(self)
            return await orig_async(self, request)
        if not loop_taped():
            return await _paused_async(self, tape, request)
        body = await request.aread()
        with tape.shim.paused():
            call = _begin(tape, request, body)
            if call.replaying:
                entry = call.take(lambda msg: mod.ConnectError(msg, request=request))
        if call.replaying:
            if tape.mode == "replay":
                await seam._aioloop().replay_suspensions(tape,
                                                         entry.get("suspend", {}).get("head"))
            with tape.shim.paused():
                return _replayed(tape, call, request, is_async=True, entry=entry)
        with tape.shim.paused():
            call.before_send(lambda m: mod.ConnectError(m, request=request))
            for k, v in call.extra_headers:  # an effect's idempotency key, fencing token
                request.headers[k] = v
            _override(request, call)
        try:
            aio = seam._aioloop()
            resp = await aio.Drive(tape, orig_async(self, request), call.suspend["head"])
        except Exception as exc:
            call.failed(exc)
            raise
        return _recorded_async(tape, call, request, resp)

    def _recorded_async(tape: PyTape, call: seam.Call, request: Any, resp: Any) -> Any:
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

    async def _paused_async(self: Any, tape: PyTape, request: Any) -> Any:
        """The whole call with the tape paused across its awaits (no ``--asyncio``)."""
        with seam.paused_across_awaits(tape):
            call = _begin(tape, request, await request.aread())
            if call.replaying:
                return _replayed(tape, call, request, is_async=True)
            for k, v in call.extra_headers:
                request.headers[k] = v
            _override(request, call)
            with call.sending(lambda m: mod.ConnectError(m, request=request)):
                resp = await orig_async(self, request)
        return _recorded_async(tape, call, request, resp)

    orig_close, orig_aclose = sync_t.close, async_t.aclose

    def _mark_local(transport: Any) -> None:
        """The transport holds a connection to a server of the tree (``seam.tape_for``),
        live at replay too: its close is made as the program made it, in both."""
        if current() is not None:
            transport._stenograph_local = True

    def _local(transport: Any) -> bool:
        return getattr(transport, "_stenograph_local", False)

    def close(self: Any) -> None:
        tape = current()
        if tape is None or _local(self):
            return orig_close(self)
        return seam.passthrough(tape, orig_close, self)

    async def aclose(self: Any) -> None:
        # Closing the pool closes the connections record opened and replay never did:
        # replay only waits the way the recorded close did.
        tape = current()
        if tape is None or _local(self):
            return await orig_aclose(self)
        await seam.apassthrough(tape, orig_aclose(self), "httpx transport close")

    orig_exit, orig_aexit = sync_t.__exit__, async_t.__aexit__

    def __exit__(self: Any, *exc: Any) -> None:
        # ``with httpx.Client()`` closes the pool here, not through close()
        tape = current()
        if tape is None or _local(self):
            return orig_exit(self, *exc)
        return seam.passthrough(tape, orig_exit, self, *exc)

    async def __aexit__(self: Any, *exc: Any) -> None:
        tape = current()
        if tape is None or _local(self):
            return await orig_aexit(self, *exc)
        await seam.apassthrough(tape, orig_aexit(self, *exc), "httpx transport close")

    handle_request._stenograph = True  # type: ignore[attr-defined]
    handle_async_request._stenograph = True  # type: ignore[attr-defined]
    sync_t.handle_request = handle_request
    async_t.handle_async_request = handle_async_request
    sync_t.close = close
    async_t.aclose = aclose
    sync_t.__exit__ = __exit__
    async_t.__aexit__ = __aexit__
