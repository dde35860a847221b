"""The environment that puts a Python process (and its Python children) under the hooks."""

from __future__ import annotations

import os
import site
import sysconfig
from pathlib import Path

import stenograph

SITE_DIR = Path(__file__).resolve().parent.parent / "interpose" / "site"
"""The ``sitecustomize`` every Python process of a run loads (code that runs inside the
program: ``interpose/``)."""


def hook_paths() -> list[str]:
    """Where ``stenograph`` and its dependencies are importable from.

    Appended (not prepended) to the program's ``sys.path`` by our
    ``sitecustomize``, so a program in another virtualenv keeps its own packages
    and still finds ours.
    """
    pkg_parent = str(Path(stenograph.__file__).resolve().parent.parent)
    paths = [pkg_parent, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    paths += [p for p in site.getsitepackages() if p not in paths]
    return list(dict.fromkeys(paths))


def hook_env(mode: str, *, base: dict[str, str] | None = None, sock: str | None = None,
             store: str | None = None, tape: str | None = None, proc: str = "0",
             lenient: bool = False) -> dict[str, str]:
    """``base`` (default: this environment) plus what the hooks need for ``mode``."""
    if not (SITE_DIR / "sitecustomize.py").is_file():  # a packaging mistake, said loudly
        raise RuntimeError(f"stenograph's hooks are missing: {SITE_DIR}/sitecustomize.py")
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(SITE_DIR) + (os.pathsep + old if old else "")
    env["STENO_PYPATH"] = os.pathsep.join(hook_paths())
    env["STENO_MODE"] = mode
    env.setdefault("STENO_PROC", proc)
    for key, value in (("STENO_PYSOCK", sock), ("STENO_STORE", store), ("STENO_TAPE", tape)):
        if value is not None:
            env[key] = value
    if lenient:
        env["STENO_LENIENT"] = "1"
    return env
