"""aiohttp's client: the ``ClientSession._request`` seam.

aiohttp has no transport object to swap, so the hook wraps the session's request
method. Record lets the real request run, reads the whole (already decoded) body
off the connection, keeps the chunks as they came, and hands the program a fresh
``StreamReader`` fed with them; replay builds a ``ClientResponse`` over the
recorded chunks and never opens a connection. A streamed aiohttp response is
therefore buffered before the program sees it (same bytes, earlier arrival).

The request is described from the call's own arguments (URL with ``params``,
``json=`` / ``data=``), computed the same way in both modes, so the fingerprint
does not depend on what aiohttp would have put on the wire.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from types import ModuleType
from typing import Any
from urllib.parse import urlencode

from stenograph.interpose.exchange import (
    classify,
    describe,
    error_body,
    response_headers,
    split_chunks,
)
from stenograph.interpose.pytape import PyTape, ReplayExhausted, current


class _Protocol:
    """The little a StreamReader asks of its protocol when nothing is on the wire."""

    _reading_paused = False

    def pause_reading(self, *args: Any, **kwargs: Any) -> None:
        pass

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        pass


class _NoWriter:
    output_size = 0


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


def _reader(aiohttp: ModuleType, chunks: list[bytes], loop: asyncio.AbstractEventLoop) -> Any:
    reader = aiohttp.StreamReader(_Protocol(), 2**16, loop=loop)
    for c in chunks:
        reader.feed_data(c)
    reader.feed_eof()
    return reader


def _loop_of(session: Any) -> asyncio.AbstractEventLoop:
    """The session's loop. Not ``asyncio.get_running_loop()``: on 3.11 it compares the
    loop's pid with ``getpid()``, which in replay is the recorded pid outside the hooks
    (where the loop was started) and the real one inside them (the tape is paused)."""
    loop = getattr(session, "_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else asyncio.get_running_loop()


def install(client: ModuleType) -> None:
    """Patch ``aiohttp.client.ClientSession._request`` once."""
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    cls = client.ClientSession
    if getattr(cls._request, "_stenograph", False):
        return
    orig = cls._request

    def _error(err: dict[str, Any]) -> BaseException:
        if err["type"] in ("TimeoutError", "ServerTimeoutError", "ConnectionTimeoutError"):
            return aiohttp.ServerTimeoutError(err["message"])
        return aiohttp.ClientConnectionError(err["message"])

    def _response(session: Any, method: str, url: Any, headers: list[list[str]],
                  status: int, reason: str | None, chunks: list[bytes]) -> Any:
        loop = _loop_of(session)
        info = aiohttp.RequestInfo(url, method, CIMultiDictProxy(CIMultiDict()), url)
        resp = aiohttp.ClientResponse(
            method, url, writer=None, continue100=None, timer=None, request_info=info,
            traces=[], loop=loop, session=session, stream_writer=_NoWriter(),
        )
        resp.status = status
        resp.reason = reason
        resp.version = aiohttp.HttpVersion11
        resp._headers = CIMultiDictProxy(CIMultiDict([(k, v) for k, v in headers]))
        resp._raw_headers = tuple((k.encode(), v.encode()) for k, v in headers)
        resp.content = _reader(aiohttp, chunks, loop)
        resp._closed = True
        return resp

    async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        tape = current()
        if tape is None:
            return await orig(self, method, str_or_url, **kwargs)
        with tape.shim.paused():
            return await _taped(tape, self, method, str_or_url, kwargs)

    async def _taped(tape: PyTape, session: Any, method: str, str_or_url: Any,
                     kwargs: dict[str, Any]) -> Any:
        url = session._build_url(str_or_url)
        if kwargs.get("params"):
            url = url.extend_query(kwargs["params"])
        body = _body_of(kwargs)
        hdrs = [(str(k), str(v)) for k, v in
                CIMultiDict({**dict(session.headers), **dict(kwargs.get("headers") or {})}).items()]
        channel = classify(str(url))
        pos = tape.begin(channel)
        rec, match, fp = describe(tape, method, str(url), hdrs, body)
        if tape.mode == "replay":
            try:
                entry = tape.take(channel, pos, match, fp)
            except ReplayExhausted as exc:
                raise aiohttp.ClientConnectionError(str(exc)) from None
            r = entry.get("response")
            if r is None:
                raise _error(entry["error"])
            chunks = split_chunks(tape.resolve(r["body"]), r["chunks"])
            resp = _response(session, method.upper(), URL(str(url)), r["headers"], r["status"],
                             r.get("reason"), chunks)
            if kwargs.get("raise_for_status") or (
                    kwargs.get("raise_for_status") is None and session._raise_for_status is True):
                resp.raise_for_status()
            return resp
        try:
            resp = await orig(session, method, str_or_url, **kwargs)
            chunks = [c async for c in resp.content.iter_any()]
        except Exception as exc:
            tape.commit(channel, pos, {"fingerprint": fp, "request": rec, "response": None,
                                       "error": error_body(exc)})
            raise
        data = b"".join(chunks)
        headers = [(k, v) for k, v in resp.headers.items()]
        tape.commit(channel, pos, {
            "fingerprint": fp, "request": rec, "error": None,
            "response": {"status": resp.status, "reason": resp.reason,
                         "headers": response_headers(tape, headers), "body": tape.spill(data),
                         "chunks": [len(c) for c in chunks], "complete": True},
        })
        resp.content = _reader(aiohttp, chunks, _loop_of(session))
        resp._body = None
        return resp

    orig_close = cls.close

    async def close(self: Any) -> None:
        # Closing the connector closes the connections record opened and replay never did
        # (the event-loop iterations that takes read clocks): off the tape.
        tape = current()
        if tape is None:
            return await orig_close(self)
        with tape.shim.paused():
            return await orig_close(self)

    _request._stenograph = True  # type: ignore[attr-defined]
    cls._request = _request
    cls.close = close
