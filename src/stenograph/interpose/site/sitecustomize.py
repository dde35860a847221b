"""Loaded by every Python process of a recorded or replayed tree (via PYTHONPATH).

It installs stenograph's hooks, then runs the sitecustomize this one shadows, if
any, so a site's own start-up code still runs.
"""

import os
import sys


def _exec_settings() -> "tuple[str, str]":
    """(STENO_MODE, STENO_PYPATH) as this image was started with.

    The shim hides STENO_* from ``environ`` (record and replay must look alike to the
    program), but the block the kernel laid out at exec still holds them, and at
    interpreter start-up it is exactly this process's. Reading it costs one small file
    read; asking the shim through ctypes would cost an import of ctypes (~1.4 ms) in every
    Python process of the tree. Everything allocated here has the same size in record and
    replay -- a fixed buffer, and two values of equal length in both modes -- because
    with ASLR off the program's own allocations must land where they did when recorded.
    """
    if "STENO_MODE" in os.environ:  # no shim loaded (tests of the Python layer alone)
        return os.environ["STENO_MODE"], os.environ.get("STENO_PYPATH", "")
    buf = bytearray(1 << 18)
    try:
        with open("/proc/self/environ", "rb", buffering=0) as f:
            n = f.readinto(buf) or 0
    except OSError:
        return "", ""

    def value(name: bytes) -> str:
        at = 0 if buf.startswith(name) else buf.find(b"\0" + name, 0, n) + 1
        if at == 0 and not buf.startswith(name):
            return ""
        end = buf.find(b"\0", at, n)
        return buf[at + len(name):end if end >= 0 else n].decode()

    return value(b"STENO_MODE="), value(b"STENO_PYPATH=")


def _steno_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    mode, extra = _exec_settings()
    for p in extra.split(os.pathsep):
        if p and p not in sys.path:
            sys.path.append(p)  # after the program's own paths: its packages win
    if mode in ("record", "replay"):
        # A recording must not change the world its replay reads: bytecode caches
        # written under record would exist at replay and change which files the import
        # system stats, lists and reads.
        sys.dont_write_bytecode = True
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
