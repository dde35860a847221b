"""aiohttp's client: the ``ClientSession._request`` seam.

aiohttp has no transport object to swap, so the hook wraps the session's request
method. In both modes the program's ``resp.content`` is a ``TapeReader``: aiohttp's
own ``StreamReader``, fed one chunk whenever a read finds it empty. Record lets the
real request run and feeds it from the real body reader as the program reads
(``readany``: what has arrived, already decoded by aiohttp's parser), so
``iter_any``, ``iter_chunked``, ``readline``, ``async for line``, ``read``,
``text`` and ``json`` see the data as it arrives; replay builds a ``ClientResponse``
over the recorded chunks and never opens a connection, feeding the same chunks in
the same sizes. Every private part of aiohttp used is in ``aiohttp_compat``.

The request is described from the call's own arguments (URL with ``params``,
``json=`` / ``data=``), computed the same way in both modes, so the fingerprint
does not depend on what aiohttp would have put on the wire.
"""

from __future__ import annotations

import functools
import json as jsonlib
import weakref
from types import ModuleType
from typing import Any
from urllib.parse import urlencode

from stenograph.interpose import aiohttp_compat as compat
from stenograph.interpose import seam
from stenograph.interpose.pytape import PyTape, current
from stenograph.interpose.settings import loop_taped

_BODY_ERRORS = ("aiohttp.client_exceptions", "aiohttp.http_exceptions", "asyncio.exceptions",
                "builtins")


def _body_of(kwargs: dict[str, Any]) -> bytes:
    if kwargs.get("json") is not None:
        return jsonlib.dumps(kwargs["json"]).encode()
    data = kwargs.get("data")
    if data is None:
        return b""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, dict):
        return urlencode(data).encode()
    return repr(data).encode()


def install(client: ModuleType) -> None:
    """Patch ``aiohttp.client.ClientSession._request`` once."""
    import aiohttp
    from multidict import CIMultiDict
    from yarl import URL

    cls = client.ClientSession
    orig = compat.request_method(cls)
    if getattr(orig, "_stenograph", False):
        return
    readers: list[type] = []

    def _error(err: dict[str, Any]) -> BaseException:
        if err["type"] in ("TimeoutError", "ServerTimeoutError", "ConnectionTimeoutError"):
            return aiohttp.ServerTimeoutError(err["message"])
        return aiohttp.ClientConnectionError(err["message"])

    def _body_error(err: dict[str, Any]) -> BaseException:
        return seam.rebuild_error(err, _BODY_ERRORS, aiohttp.ClientPayloadError)

    def _reader(session: Any, chunks: seam.AsyncChunks) -> Any:
        if not readers:  # not at install: aiohttp is still importing its client then
            readers.append(compat.tape_reader_class(aiohttp))
        reader = readers[0](chunks.next, chunks.close, compat.session_loop(session))
        weakref.finalize(reader, chunks.close, True)
        return reader

    async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        tape = seam.tape_for(str(compat.session_url(self, str_or_url)))
        if tape is None:
            return await orig(self, method, str_or_url, **kwargs)
        if not loop_taped():  # the whole call paused across its awaits
            with seam.paused_across_awaits(tape):
                return await _taped_paused(tape, self, method, str_or_url, kwargs)
        return await _taped(tape, self, method, str_or_url, kwargs)

    def _begin(tape: PyTape, session: Any, method: str, str_or_url: Any,
               kwargs: dict[str, Any]) -> tuple[Any, Any, seam.Call]:
        url = compat.session_url(session, str_or_url)
        if kwargs.get("params"):
            url = url.extend_query(kwargs["params"])
        hdrs = CIMultiDict({**dict(session.headers), **dict(kwargs.get("headers") or {})})
        call = seam.begin(tape, method, str(url), [(str(k), str(v)) for k, v in hdrs.items()],
                          _body_of(kwargs))
        return url, hdrs, call

    def _replayed(tape: PyTape, session: Any, method: str, url: Any, hdrs: Any,
                  call: seam.Call, kwargs: dict[str, Any], entry: dict[str, Any] | None) -> Any:
        rp = call.replayed(_error, aiohttp.ClientConnectionError, entry)
        resp = compat.new_response(aiohttp, session, method.upper(), URL(str(url)), hdrs)
        compat.set_head(aiohttp, resp, rp.status, rp.reason, rp.headers)
        chunks = seam.AsyncChunks(tape, replayed=rp, ended=aiohttp.ClientPayloadError,
                                  rebuild=_body_error)
        compat.set_content(resp, _reader(session, chunks))
        rfs = kwargs.get("raise_for_status")
        if rfs or (rfs is None and compat.session_raises_for_status(session) is True):
            resp.raise_for_status()
        return resp

    async def _recorded(tape: PyTape, session: Any, call: seam.Call, resp: Any) -> Any:
        real = resp.content
        with tape.shim.paused():
            rec = call.received(resp.status, list(resp.headers.items()), reason=resp.reason)
            # the connection's release or close schedules the pool's and the transport's
            # callbacks: the library's work, off the tape (replay has no connection)
            compat.wrap_connection_work(resp, lambda fn: functools.partial(
                seam.passthrough, tape, fn))

        async def pull() -> tuple[bytes, bool]:
            data = await real.readany()
            return data, not data or real.at_eof()

        with tape.shim.paused():
            chunks = seam.AsyncChunks(tape, pull=pull, body=rec,
                                      ended=aiohttp.ClientPayloadError, rebuild=_body_error)
            compat.set_content(resp, _reader(session, chunks))
        if real.at_eof():
            await chunks.next()
        return resp

    async def _taped(tape: PyTape, session: Any, method: str, str_or_url: Any,
                     kwargs: dict[str, Any]) -> Any:
        with tape.shim.paused():
            url, hdrs, call = _begin(tape, session, method, str_or_url, kwargs)
            if call.replaying:
                entry = call.take(aiohttp.ClientConnectionError)
        if call.replaying:
            if tape.mode == "replay":
                await seam._aioloop().replay_suspensions(tape,
                                                         entry.get("suspend", {}).get("head"))
            with tape.shim.paused():
                return _replayed(tape, session, method, url, hdrs, call, kwargs, entry)
        with tape.shim.paused():
            call.before_send(aiohttp.ClientConnectionError)
        if call.extra_headers:  # an effect's idempotency key, fencing token
            kwargs["headers"] = {**dict(kwargs.get("headers") or {}),
                                 **dict(call.extra_headers)}
        if call.body_override is not None:  # a resume pinning its model (seam.drift_check)
            kwargs = {k: v for k, v in kwargs.items() if k != "json"}
            kwargs["data"] = call.body_override
        if call.url_override is not None:  # a fork's rerouted call (seam.fork_route)
            str_or_url = call.url_override
        try:
            resp = await seam._aioloop().Drive(tape, orig(session, method, str_or_url, **kwargs),
                                               call.suspend["head"])
        except Exception as exc:
            call.failed(exc)
            raise
        return await _recorded(tape, session, call, resp)

    async def _taped_paused(tape: PyTape, session: Any, method: str, str_or_url: Any,
                            kwargs: dict[str, Any]) -> Any:
        url, hdrs, call = _begin(tape, session, method, str_or_url, kwargs)
        if call.replaying:
            return _replayed(tape, session, method, url, hdrs, call, kwargs, None)
        if call.extra_headers:  # an effect's idempotency key, fencing token
            kwargs["headers"] = {**dict(kwargs.get("headers") or {}),
                                 **dict(call.extra_headers)}
        if call.body_override is not None:  # a resume pinning its model (seam.drift_check)
            kwargs = {k: v for k, v in kwargs.items() if k != "json"}
            kwargs["data"] = call.body_override
        if call.url_override is not None:  # a fork's rerouted call (seam.fork_route)
            str_or_url = call.url_override
        with call.sending(aiohttp.ClientConnectionError):
            resp = await orig(session, method, str_or_url, **kwargs)
        return await _recorded(tape, session, call, resp)

    orig_close = cls.close

    async def close(self: Any) -> None:
        # Closing the connector closes the connections record opened and replay never did
        # (the event-loop iterations that takes read clocks): off the tape.
        tape = current()
        if tape is None:
            return await orig_close(self)
        await seam.apassthrough(tape, orig_close(self), "aiohttp session close", at_replay=True)

    _request._stenograph = True  # type: ignore[attr-defined]
    compat.set_request_method(cls, _request)
    cls.close = close
