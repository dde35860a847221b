"""Loaded by every Python process of a recorded or replayed tree (via PYTHONPATH).

It installs stenograph's hooks, then runs the sitecustomize this one shadows, if
any, so a site's own start-up code still runs.
"""

import os
import sys


def _steno_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    extra = os.environ.get("STENO_PYPATH", "")
    for p in extra.split(os.pathsep):
        if p and p not in sys.path:
            sys.path.append(p)  # after the program's own paths: its packages win
    if os.environ.get("STENO_MODE") in ("record", "replay"):
        from stenograph.interpose import bootstrap, pytape

        pytape.current()
        bootstrap.install()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    shadowed = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  the site's own, now that ours is off the path
    except ImportError:
        if shadowed is not None:
            sys.modules["sitecustomize"] = shadowed


_steno_start()
