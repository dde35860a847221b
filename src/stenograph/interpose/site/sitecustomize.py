"""Loaded by every Python process of a recorded or replayed tree (via PYTHONPATH).

It installs stenograph's hooks, then runs the sitecustomize this one shadows, if
any, so a site's own start-up code still runs.
"""

import os
import sys


def _steno_getenv(name: str) -> "str | None":
    """The shim hides STENO_* from the environment; ask it, when it is loaded."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).steno_getenv
    except (OSError, AttributeError):
        return os.environ.get(name)
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_char_p]
    value = fn(name.encode())
    return None if value is None else value.decode()


def _steno_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    extra = _steno_getenv("STENO_PYPATH") or ""
    for p in extra.split(os.pathsep):
        if p and p not in sys.path:
            sys.path.append(p)  # after the program's own paths: its packages win
    if _steno_getenv("STENO_MODE") in ("record", "replay"):
        # Only the import hook, identical in both modes: the tape itself is built on the
        # first intercepted call, so start-up allocates the same objects in record and
        # replay and, with ASLR off, the program's id()s and address-hashed orders repeat.
        from stenograph.interpose import bootstrap

        bootstrap.install()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    shadowed = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  the site's own, now that ours is off the path
    except ImportError:
        if shadowed is not None:
            sys.modules["sitecustomize"] = shadowed


_steno_start()
