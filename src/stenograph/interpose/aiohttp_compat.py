"""Every private part of aiohttp the hook touches, one function per coupling.

aiohttp has no transport object to swap, and a response built without a
connection has no public constructor: reaching into private attributes is what
broke VCR.py with aiohttp releases. So the hook (``http_aiohttp``) never names a
private attribute itself; each one is used here, once, in a function that says
what it relies on and which releases it was checked against. A new aiohttp that
moves one of them breaks one function, and ``tests/test_aiohttp_versions.py``
runs the aiohttp tests against the oldest and the newest supported release.

Checked against aiohttp 3.10.11 (oldest allowed by ``aiohttp>=3.10,<4``) and
3.14.5 (newest 3.x on the package index when written).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

CHECKED = ("3.10.11", "3.14.5")


def request_method(cls: type) -> Callable[..., Awaitable[Any]]:
    """``ClientSession._request``: the one coroutine every request of a session goes
    through (``get``/``post``/``request`` and their context managers). 3.10-3.14."""
    return cls._request  # type: ignore[attr-defined,no-any-return]


def set_request_method(cls: type, fn: Callable[..., Awaitable[Any]]) -> None:
    """Replace ``ClientSession._request`` (see ``request_method``)."""
    cls._request = fn  # type: ignore[attr-defined]


def session_loop(session: Any) -> asyncio.AbstractEventLoop:
    """``ClientSession._loop``: the loop the session runs on (3.10-3.14). Not
    ``asyncio.get_running_loop()``: on 3.11 it compares the loop's pid with ``getpid()``,
    which in replay is the recorded pid outside the hooks and the real one inside them."""
    loop = getattr(session, "_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else asyncio.get_running_loop()


def session_url(session: Any, str_or_url: Any) -> Any:
    """``ClientSession._build_url``: the request URL with the session's ``base_url``
    joined, as ``_request`` computes it (3.10-3.14)."""
    return session._build_url(str_or_url)


def session_raises_for_status(session: Any) -> Any:
    """``ClientSession._raise_for_status``: the session's ``raise_for_status`` setting
    (bool or callable; 3.10-3.14)."""
    return getattr(session, "_raise_for_status", False)


class _NoWriter:
    """The request-body writer a response asks for ``output_size`` (3.12+)."""

    output_size = 0


def _takes_stream_writer(aiohttp: ModuleType) -> bool:
    return "stream_writer" in inspect.signature(aiohttp.ClientResponse.__init__).parameters


def new_response(aiohttp: ModuleType, session: Any, method: str, url: Any,
                 request_headers: Any) -> Any:
    """A ``ClientResponse`` with no connection behind it. Its constructor is keyword-only
    and not public; ``stream_writer`` is required by 3.14.5 and rejected by 3.10.11, so it
    is passed only when the signature has it. ``_closed`` is set: there is no connection
    to release."""
    from multidict import CIMultiDictProxy

    info = aiohttp.RequestInfo(url, method, CIMultiDictProxy(request_headers), url)
    kwargs: dict[str, Any] = dict(
        writer=None, continue100=None, timer=None, request_info=info, traces=[],
        loop=session_loop(session), session=session)
    if _takes_stream_writer(aiohttp):
        kwargs["stream_writer"] = _NoWriter()
    resp = aiohttp.ClientResponse(method, url, **kwargs)
    resp._closed = True
    return resp


def set_head(aiohttp: ModuleType, resp: Any, status: int, reason: str | None,
             headers: list[list[str]]) -> None:
    """Status line and headers. ``headers``/``raw_headers`` are read-only properties over
    ``_headers``/``_raw_headers``, which ``ClientResponse.start`` sets from the parsed
    message (3.10-3.14)."""
    from multidict import CIMultiDict, CIMultiDictProxy

    resp.status = status
    resp.reason = reason
    resp.version = aiohttp.HttpVersion11
    resp._headers = CIMultiDictProxy(CIMultiDict([(k, v) for k, v in headers]))
    resp._raw_headers = tuple((k.encode(), v.encode()) for k, v in headers)


def set_content(resp: Any, reader: Any) -> None:
    """``ClientResponse.content``: the body reader every reading method uses (``read``,
    ``text``, ``json``, ``content.iter_*``). A documented attribute, written by
    ``start()`` (3.10-3.14)."""
    resp.content = reader


def wrap_connection_work(resp: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
                         ) -> None:
    """``release`` and ``close`` of one (recorded) response, wrapped: they hand its
    connection back to the pool or close it, which replay never opened. Public methods,
    set on the instance (ClientResponse has no ``__slots__``, 3.10-3.14)."""
    for name in ("release", "close"):
        fn = getattr(resp, name, None)
        if callable(fn):
            setattr(resp, name, wrap(fn))


class _Protocol:
    """What a ``StreamReader`` asks of its protocol: ``_reading_paused``,
    ``pause_reading``/``resume_reading`` (3.14 passes ``resume_parser=``), and
    ``connected`` (read by the ``_wait`` that ``TapeReader`` replaces). 3.10-3.14."""

    _reading_paused = False
    connected = True

    def pause_reading(self, *args: Any, **kwargs: Any) -> None:
        pass

    def resume_reading(self, *args: Any, **kwargs: Any) -> None:
        pass


def tape_reader_class(aiohttp: ModuleType) -> type:
    """A ``StreamReader`` fed on demand: whenever a read finds the buffer empty it calls
    ``_wait(func_name)`` (readany, read, readline/readuntil, readchunk, readexactly and the
    ``iter_*`` built on them; 3.10-3.14), and here ``_wait`` feeds the next chunk of the
    body (``next_chunk()``: bytes, or ``None`` at the end) instead of waiting for the
    protocol. Every reading style of the real reader then runs over the chunks the tape
    gives it, one at a time, in the order and sizes they came.

    ``set_exception`` is what ``ClientResponse.release()``/``close()`` call on the body
    reader (``_notify_content``); here it also tells the tape the program is done with it.
    """

    class TapeReader(aiohttp.StreamReader):  # type: ignore[misc,name-defined]
        def __init__(self, next_chunk: Callable[[], Awaitable[bytes | None]],
                     done: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
            super().__init__(_Protocol(), 2**16, loop=loop)
            self._steno_next, self._steno_done = next_chunk, done

        async def _wait(self, func_name: str) -> None:
            try:
                chunk = await self._steno_next()
            except BaseException as exc:
                aiohttp.StreamReader.set_exception(self, exc)
                raise
            if chunk is None:
                self.feed_eof()
            else:
                self.feed_data(chunk)

        def set_exception(self, *args: Any, **kwargs: Any) -> None:
            with contextlib.suppress(Exception):
                self._steno_done()
            super().set_exception(*args, **kwargs)

    return TapeReader
