"""The aiohttp hook against the oldest supported aiohttp, not only the installed one.

``pyproject.toml`` allows ``aiohttp>=3.10,<4`` and the virtualenv holds the newest;
the hook reaches into private parts of aiohttp (all in ``aiohttp_compat``), which is
what breaks across releases. So the aiohttp tests also run in a subprocess whose
``PYTHONPATH`` starts with aiohttp 3.10 and its dependencies, installed once with
``pip install --target`` under ``.venv/`` (seconds from the local wheel cache; the
test is skipped when pip cannot get it). The programs those tests record inherit
that ``PYTHONPATH``, so they run on 3.10 too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pip_target import installed

ROOT = Path(__file__).resolve().parent.parent
OLDEST = "3.10"


def _oldest_aiohttp() -> Path:
    return installed(f"aiohttp-{OLDEST}", f"aiohttp=={OLDEST}.*", "aiohttp")


@pytest.mark.soak
def test_aiohttp_tests_pass_on_the_oldest_supported_aiohttp() -> None:
    target = _oldest_aiohttp()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env["PYTHONPATH"] = str(target) + (os.pathsep + env["PYTHONPATH"]
                                       if env.get("PYTHONPATH") else "")
    version = subprocess.run([sys.executable, "-c", "import aiohttp; print(aiohttp.__version__)"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith(OLDEST + "."), version.stderr
    for args in (["tests/test_http_streaming.py", "-k", "aiohttp"],
                 ["tests/test_http_hooks.py", "-k", "record_then_replay or sse or lenient"]):
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-x", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, f"aiohttp {version.stdout.strip()}: {args}\n" + p.stdout[-3000:]
