"""File metadata the kernel stamps (mtimes, ctimes, inode numbers) replays as recorded.

The stat family (stat, lstat, fstat, fstatat, statx and the old __xstat names) is taped
on the meta channel: replay checks the call's path/fd/flags and serves the whole
recorded result. A file written by the program gets a new mtime and often a new inode
every run, so a replay that read them live would print other numbers. When the world
changed between record and replay (a file the program only reads grew), replay still
serves the recorded result and reports the difference as drift.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import steno_cli

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]
REPLAYS = 3

PY_PROGRAM = r"""
import os
with open("f.txt", "w") as f:
    f.write("hello")
st = os.stat("f.txt")
print(st.st_mtime_ns, st.st_ino, st.st_size, st.st_ctime_ns)
os.utime("f.txt", None)
st = os.stat("f.txt")
print(st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
with open("f.txt") as f:
    print(os.fstat(f.fileno()).st_mtime_ns)
print(os.lstat("f.txt").st_ino == st.st_ino)
print(os.path.getmtime("../input.txt"), os.path.getsize("../input.txt"))
os.unlink("f.txt")
"""


def _record(tmp: Path, argv: list[str]) -> tuple[Path, bytes]:
    out = tmp / "rec.steno"
    return out, steno_cli.record(out, argv, tmp / "work").stdout

def _replay(tmp: Path, steno: Path) -> dict:
    code, rep = steno_cli.replay_json(steno, tmp / "work")
    assert code == 0, rep
    assert rep["divergences"] == [], rep["divergences"]
    assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}, rep
    return rep


def _setup(tmp: Path) -> None:
    (tmp / "work").mkdir()
    (tmp / "input.txt").write_text("data\n")


def _replays_identically(tmp: Path, argv: list[str]) -> bytes:
    steno, out = _record(tmp, argv)
    for _ in range(REPLAYS):
        time.sleep(0.01)  # the clock moves on: a live mtime could not repeat
        rep = _replay(tmp, steno)
        assert not [d for d in rep["drift"] if d["channel"] == "meta"], rep["drift"]
    return out


def test_python_stat_of_a_file_it_writes(tmp_path: Path) -> None:
    _setup(tmp_path)
    prog = tmp_path / "meta.py"
    prog.write_text(PY_PROGRAM)
    out = _replays_identically(tmp_path, [PY, str(prog)])
    lines = out.decode().splitlines()
    assert lines[1].split()[0] != lines[0].split()[0]  # utime moved the mtime on
    assert lines[3] == "True"


def test_coreutils_stat_ls_and_find(tmp_path: Path) -> None:
    _setup(tmp_path)
    script = ("touch a; sleep 0.01; touch x; sleep 0.01; touch b; stat -c '%Y %i %y' a x b; "
              "ls -l --time-style=full-iso; find . -newer x | sort; rm -f a b x")
    out = _replays_identically(tmp_path, ["bash", "-c", script])
    text = out.decode()
    assert "./b" in text and "./a" not in text


def test_a_file_changed_between_record_and_replay_is_drift(tmp_path: Path) -> None:
    """The log is the truth: the recorded size and mtime are served, the change is
    reported as drift, and the output stays identical."""
    _setup(tmp_path)
    prog = tmp_path / "meta.py"
    prog.write_text(PY_PROGRAM)
    steno, _ = _record(tmp_path, [PY, str(prog)])
    with open(tmp_path / "input.txt", "a") as f:
        f.write("more\n")
    rep = _replay(tmp_path, steno)
    drift = [d for d in rep["drift"] if d["channel"] == "meta"]
    assert drift, rep
    assert any("input.txt" in d["asked"] and "live size 10" in d["asked"] for d in drift), drift
    os.unlink(tmp_path / "input.txt")
    rep = _replay(tmp_path, steno)  # gone: reported, still served as recorded
    assert any("input.txt" in d["asked"] and "errno" in d["recorded"] for d in rep["drift"])


def test_a_stat_of_another_path_is_a_divergence(tmp_path: Path) -> None:
    """The program reads the name to stat from a file (read live at replay); the file now
    names another path, so the replayed stat asks for something the recording never did."""
    _setup(tmp_path)
    (tmp_path / "name.txt").write_text("../input.txt")
    (tmp_path / "other.txt").write_text("x")
    prog = tmp_path / "p.py"
    prog.write_text("import os\nname = open('../name.txt').read()\n"
                    "print(os.stat(name).st_size)\n")
    steno, _ = _record(tmp_path, [PY, str(prog)])
    (tmp_path / "name.txt").write_text("../other.txt")
    p = subprocess.run([*CLI, "replay", str(steno), "--json"], cwd=tmp_path / "work",
                       capture_output=True, timeout=120)
    assert p.returncode != 0
    rep = json.loads(p.stdout.decode().splitlines()[-1])
    div = [d for d in rep["divergences"] if d["channel"] == "meta"]
    assert div, rep
    assert "input.txt" in div[0]["recorded"] and "other.txt" in div[0]["asked"], div
