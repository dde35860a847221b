"""The run as the code inside the recorded process sees it: its ``STENO_*`` settings.

The shim reads them at start-up and hides them from ``environ`` (record and replay then
look alike to the program); the hooks ask the shim for them (``steno_getenv``). Outside
a shim-loaded process they come from the environment. The parent side that writes them
is ``runner/settings.py``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any


def _shim_getenv_fn() -> Any:
    try:
        fn = ctypes.CDLL(None).steno_getenv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_char_p]
    return fn


_SHIM_GETENV = _shim_getenv_fn()


def getenv(name: str) -> str | None:
    """A ``STENO_*`` setting: from the shim when it is loaded, else from the environment."""
    if _SHIM_GETENV is not None:
        value = _SHIM_GETENV(name.encode())
        return None if value is None else bytes(value).decode()
    return os.environ.get(name)


def shim_proc() -> str | None:
    """The process path the shim assigned (it follows forks), else the environment's."""
    return getenv("STENO_PROC")


_LOOP_TAPED: bool | None = None


def loop_taped() -> bool:
    """Whether asyncio loops are on the tape (``stenograph record --asyncio``, kept in the
    recording so its replay agrees). Without it an async hooked call keeps the tape
    paused across its awaits, which is exact for one request at a time per thread."""
    global _LOOP_TAPED
    if _LOOP_TAPED is None:
        _LOOP_TAPED = getenv("STENO_ASYNCIO") == "1"
    return _LOOP_TAPED
