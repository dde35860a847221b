"""Children the shim cannot see into, recorded whole (issue "Intent before effect at
every way out", part 2): a static program (here one gcc links statically, reading the
clock and getrandom, writing to stdout and stderr, exiting with a status; and, where the
machine has them, the Google Cloud SDK's static Go binaries) never loads the shim. Its
exec is recorded whole -- its output as it came and its exit status -- and at replay it
does not run: the output and status are served, so the replay is bit for bit although
the program would print another time and another random number. At the top level,
``stenograph record -- STATIC`` records it the same way instead of refusing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
GO_STATIC = Path("/usr/lib/google-cloud-sdk/bin/gcloud-crc32c")

SRC = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/random.h>
int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned r = 0;
    getrandom(&r, sizeof r, 0);
    int lines = argc > 3 ? atoi(argv[3]) : 3;
    for (int i = 0; i < lines; i++) {
        printf("%s line %d: %ld.%09ld %u\n", argc > 1 ? argv[1] : "-", i, (long)ts.tv_sec,
               ts.tv_nsec, r);
        fflush(stdout);
        fprintf(stderr, "err %d %u\n", i, r % 97);
    }
    return argc > 2 ? atoi(argv[2]) : 0;
}
"""

PROGRAM = """
import subprocess, sys
for args in (["./static", "a"], ["./static", "b", "3"], *[[g, "--help"] for g in sys.argv[1:]]):
    r = subprocess.run(args, capture_output=True, text=True)
    print(args[-1], r.returncode, r.stdout.strip(), "|", r.stderr.strip()[:80])
"""


@pytest.fixture()
def static(tmp_path: Path) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("no compiler")
    (tmp_path / "s.c").write_text(SRC)
    out = tmp_path / "static"
    if subprocess.run(["gcc", "-static", "-O2", "-o", str(out), str(tmp_path / "s.c")],
                      capture_output=True).returncode:
        pytest.skip("no static libc to link with")
    return out


def _replay(steno: Path, cwd: Path) -> dict:
    rep = subprocess.run([*CLI, "replay", "--json", str(steno)], cwd=cwd, capture_output=True,
                         text=True, timeout=120)
    report = json.loads(rep.stdout.splitlines()[-1])
    assert rep.returncode == 0 and report["divergences"] == [], report
    assert all(report["identical"].values()), report
    return report


def test_static_children_are_recorded_whole_and_served(tmp_path: Path, static: Path) -> None:
    (tmp_path / "p.py").write_text(PROGRAM)
    go = [str(GO_STATIC)] if GO_STATIC.exists() else []
    native = subprocess.run([PY, "p.py", *go], cwd=tmp_path, capture_output=True, text=True)
    steno = tmp_path / "p.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, "p.py", *go],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    # what it prints recorded is what it prints natively (another time, another number)
    assert re.sub(r"\d+", "N", rec.stdout) == re.sub(r"\d+", "N", native.stdout), rec.stdout
    assert "\n3 3 b line 0: " in rec.stdout, rec.stdout  # its exit status, 3, came back
    # nothing says what such a program does: each exec of one is an effect, its status the
    # result (with no policy at all)
    from stenograph.recorder.trajfile import read_trajectory

    events = read_trajectory(steno).events
    intents = [e.body["target"] for e in events if e.kind == "ToolIntent"]
    assert intents[:2] == ["exec static a", "exec static b 3"], intents
    results = [e.body["status"] for e in events if e.kind == "ToolResult"]
    assert results[:2] == ["0", "3"], results
    for _ in range(2):
        _replay(steno, tmp_path)
    static.unlink()  # not run at replay: nothing to run
    _replay(steno, tmp_path)


def test_a_static_program_is_recorded_whole_at_the_top_level(tmp_path: Path,
                                                              static: Path) -> None:
    steno = tmp_path / "s.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", str(static), "top", "5"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert rec.returncode == 5 and rec.stdout.startswith("top line 0: "), rec.stderr
    assert rec.stderr.startswith("err 0 "), rec.stderr
    report = _replay(steno, tmp_path)
    assert report["exit_status"] == {"recorded": 5, "replayed": 5}, report


def test_a_static_program_whose_reader_goes_away_replays(tmp_path: Path, static: Path) -> None:
    """``STATIC | head -1``: head leaves after one line, and the program dies of SIGPIPE
    at a write that depends on timing. Recorded whole, it ends where the recording says
    (the stand-in ignores SIGPIPE, then dies of it at the recorded point), replay after
    replay."""
    steno = tmp_path / "h.steno"
    cmd = ["sh", "-c", "./static x 0 200000 | head -1; echo done"]
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", *cmd], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0 and rec.stdout.startswith("x line 0: "), rec.stderr
    assert rec.stdout.endswith("done\n"), rec.stdout
    for _ in range(3):
        _replay(steno, tmp_path)


AGE_AGENT = """
import subprocess
for argv in (["age-keygen"], ["age-keygen", "-y", "missing.key"]):
    r = subprocess.run(argv, capture_output=True, text=True)
    print(argv[-1], r.returncode, r.stdout.splitlines()[-1][:16] if r.stdout else "-",
          "|", r.stderr.strip().splitlines()[0][:40] if r.stderr else "-")
"""


@pytest.mark.skipif(not shutil.which("age-keygen"), reason="age is not installed")
def test_a_go_program_with_the_system_loader_is_recorded_whole(tmp_path: Path) -> None:
    """Debian's ``age-keygen``: a Go program that names the system's loader (so the shim
    is loaded into it, and the inherited filter would trap its runtime's own system calls:
    it died of SIGSYS). Recorded whole, as a child and as the command; a fresh key each
    time natively, the recorded one at every replay; as an effect, its exit status is the
    call's result."""
    from stenograph.recorder.reader import StoreReader

    (tmp_path / "p.py").write_text(AGE_AGENT)
    (tmp_path / "policy.toml").write_text('[commands]\neffect = ["age-keygen*"]\n')
    store = tmp_path / "store"
    rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "--policy",
                          "policy.toml", "-o", str(tmp_path / "a.steno"), "--", PY, "p.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    lines = rec.stdout.splitlines()
    assert lines[0].startswith("age-keygen 0 AGE-SECRET-KEY-1"), rec.stdout
    assert lines[1].startswith("missing.key 1 - | age-keygen: error: failed to open"), \
        rec.stdout
    results = [ev.body.get("status") for ev in StoreReader(store).events(traj="t")
               if ev.kind == "ToolResult"]
    assert results == ["0", "1"], results
    for _ in range(2):
        rep = subprocess.run([*CLI, "replay", str(tmp_path / "a.steno")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert rep.returncode == 0 and rep.stdout == rec.stdout, rep.stderr
    top = tmp_path / "k.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(top), "--", "age-keygen"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0 and rec.stdout.count("AGE-SECRET-KEY-1") == 1, rec.stderr
    report = _replay(top, tmp_path)
    assert report["exit_status"] == {"recorded": 0, "replayed": 0}, report
