"""A developer's tools under the tape print what they print natively (issue "A coding
agent's everyday tools replay": recording must not change a program's output).

pytest loads stenograph's own plugin through its ``pytest11`` entry point; under
``record`` the hooks have imported the package already, and pytest warned that it could
not rewrite it (two lines the program never prints natively) until the package's
docstring said ``PYTEST_DONT_REWRITE``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "stenograph"]
TESTS = """
def test_a(tmp_path):
    (tmp_path / "x").write_text("1")
    assert (tmp_path / "x").read_text() == "1"

def test_b():
    assert 2
"""


def _timeless(out: str) -> str:
    return re.sub(r" in \d+\.\d+s", " in Xs", out)


def test_pytest_under_record_prints_what_it_prints_natively(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_two.py"]
    native = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    rec = subprocess.run([*CLI, "record", "-o", str(tmp_path.parent / "p.steno"), "--",
                          *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=180)
    assert native.returncode == rec.returncode == 0, rec.stderr[-2000:]
    assert "Warning" not in rec.stdout, rec.stdout
    assert _timeless(rec.stdout) == _timeless(native.stdout)


def test_a_deep_temporary_directory_does_not_stop_a_recording(tmp_path: Path) -> None:
    """``$TMPDIR`` deep enough that a socket path there passes the kernel's 108 bytes (a
    test runner's per-worker directories): the recorder puts its sockets in /tmp instead,
    and the run records and replays."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    work = tmp_path / "work"  # the workspace, beside the temporary directory
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    env["TMPDIR"] = str(deep)
    steno = tmp_path / "deep.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", sys.executable, "-c",
                          "import tempfile; print('hi', len(tempfile.gettempdir()) > 100)"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0 and rec.stdout == "hi True\n", rec.stderr[-2000:]
    rep = subprocess.run([*CLI, "replay", str(steno)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr[-2000:]
