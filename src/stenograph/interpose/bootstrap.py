"""Install the Python-level hooks in a process started under the tape.

Runs from ``sitecustomize`` (the launcher puts ``interpose/site`` first on
``PYTHONPATH``), so user code needs no change. Client libraries are patched when
they are imported (an import hook), not imported eagerly: a program that never
uses requests does not pay for it, and import order stays the program's own.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~1 ms per process
if TYPE_CHECKING:  # this module runs in every recorded process: import nothing it can avoid
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any


def _patch_httpx(mod: ModuleType) -> None:
    from stenograph.interpose import http_httpx

    http_httpx.install(mod)


def _patch_requests(mod: ModuleType) -> None:
    from stenograph.interpose import http_requests

    http_requests.install(mod)


def _patch_aiohttp(mod: ModuleType) -> None:
    from stenograph.interpose import http_aiohttp

    http_aiohttp.install(mod)


def _patch_mcp(mod: ModuleType) -> None:
    from stenograph.interpose import mcp_client

    mcp_client.install(mod)


def _patch_asyncio(mod: ModuleType) -> None:
    _inline_dns_when_paused(mod.BaseEventLoop)


def _patch_asyncio_loops(mod: ModuleType) -> None:
    from stenograph.interpose.settings import loop_taped

    if not loop_taped():
        return
    from stenograph.interpose import aioloop

    if hasattr(aioloop, "install"):  # else aioloop is mid-import and installs itself
        aioloop.install(mod)


def _inline_dns_when_paused(loop_cls: Any) -> None:
    """A hook's real network call (record only, tape paused) resolves names inline.

    The loop would hand ``getaddrinfo`` to its default executor, whose threads may be the
    program's own, ordered by the tape's scheduler: a paused call waiting on one of them
    would wait for ever (the paused thread keeps the scheduler's baton), and waking one
    would add turns that replay, which makes no such call, never takes.
    """
    import socket

    from stenograph.interpose.pytape import current

    orig_gai, orig_gni = loop_cls.getaddrinfo, loop_cls.getnameinfo
    if getattr(orig_gai, "_stenograph", False):
        return

    async def getaddrinfo(self: Any, host: Any, port: Any, *, family: int = 0, type: int = 0,
                          proto: int = 0, flags: int = 0) -> Any:
        tape = current()
        if tape is not None and tape.shim.active():
            return socket.getaddrinfo(host, port, family, type, proto, flags)
        return await orig_gai(self, host, port, family=family, type=type, proto=proto,
                              flags=flags)

    async def getnameinfo(self: Any, sockaddr: Any, flags: int = 0) -> Any:
        tape = current()
        if tape is not None and tape.shim.active():
            return socket.getnameinfo(sockaddr, flags)
        return await orig_gni(self, sockaddr, flags)

    getaddrinfo._stenograph = True  # type: ignore[attr-defined]
    loop_cls.getaddrinfo = getaddrinfo
    loop_cls.getnameinfo = getnameinfo


def _patch_threading(mod: ModuleType) -> None:
    from stenograph.interpose import ordered

    ordered.patch_threading(mod)


def _patch_thread_pool(mod: ModuleType) -> None:
    from stenograph.interpose import ordered

    ordered.patch_thread_pool(mod)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "threading": _patch_threading,
    "concurrent.futures.thread": _patch_thread_pool,
    "asyncio.base_events": _patch_asyncio,
    "asyncio.selector_events": _patch_asyncio_loops,
    "httpx": _patch_httpx,
    "httpx2": _patch_httpx,
    "requests.adapters": _patch_requests,
    "aiohttp.client": _patch_aiohttp,
    "mcp.client.session": _patch_mcp,
}


class _Loader:
    """Wraps a module's real loader; runs the patch once the module has executed."""

    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class PatchFinder:
    """Finds nothing itself; wraps the real loader of the modules it patches."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """Patch what is already imported; patch the rest on import. Idempotent."""
    if any(isinstance(f, PatchFinder) for f in sys.meta_path):
        return
    import gc

    gc.disable()  # collections run at taped points instead (interpose/gcpoints.py)
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, PatchFinder())
