"""Every pid a program sees is the recorded one, and every pid it hands back reaches the
live process it stands for.

fork/vfork results, ``posix_spawn``'s pid (``Popen.pid``), what the waits return
(``waitpid``, ``wait4``, ``wait``, ``waitid``'s ``si_pid``), ``getpgid``/``getsid`` are
taped; at replay the shim serves the recorded values and maps them back to the live
processes for ``kill``, ``waitpid``, ``waitid(P_PID)``, ``setpgid``, ``sched_*``... (its
own recorded pid included: ``kill(getpid(), sig)``). Live pids differ from one run to
the next (the kernel hands out the next free number), so a replay that printed them
would differ. Each program is recorded once and replayed three times.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import steno_cli

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]
REPLAYS = 3

PY_PROGRAM = r"""
import os, signal, subprocess, sys
pid = os.fork()
if pid == 0:
    print("child", os.getpid(), os.getppid(), flush=True)
    os._exit(7)
r = os.waitpid(pid, 0)  # before printing: the child's line comes first in both runs
print("fork", pid, flush=True)
print("waitpid", r, r[0] == pid, os.WEXITSTATUS(r[1]), flush=True)
p = subprocess.Popen(["sleep", "5"])
print("popen", p.pid, flush=True)
os.kill(p.pid, signal.SIGTERM)
print("wait", p.wait(), flush=True)
q = subprocess.Popen([sys.executable, "-c",
                      "import os; print('grandchild', os.getpid(), os.getppid())"])
print("popen", q.pid, q.wait(), flush=True)
pid = os.fork()
if pid == 0:
    os._exit(3)
w = os.wait4(pid, 0)
print("wait4", w[0] == pid, w[0], w[1], flush=True)
pid = os.fork()
if pid == 0:
    os._exit(4)
w = os.wait()
print("wait", w[0] == pid, w, flush=True)
print("self", os.getpid(), os.getppid(), os.getpgid(0) == os.getpgrp(), os.getsid(0) > 0)
os.kill(os.getpid(), 0)  # the recorded own pid reaches the live process
os.kill(os.getppid(), 0)
print("kill(self, 0) ok", flush=True)
print("affinity", len(os.sched_getaffinity(os.getpid())) > 0)
"""

C_PROGRAM = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(void) {
    pid_t a, b;
    char *sl[] = {"sleep", "5", NULL};
    char *tr[] = {"true", NULL};
    if (posix_spawnp(&a, "sleep", NULL, NULL, sl, environ)) return 1;
    if (posix_spawnp(&b, "true", NULL, NULL, tr, environ)) return 1;
    printf("spawned %d %d\n", a, b);
    siginfo_t si;
    if (waitid(P_PID, b, &si, WEXITED)) return 2;
    printf("waitid pid=%d same=%d code=%d status=%d\n", si.si_pid, si.si_pid == b, si.si_code,
           si.si_status);
    printf("kill %d\n", kill(a, SIGTERM));
    if (waitid(P_PID, a, &si, WEXITED)) return 3;
    printf("waitid pid=%d same=%d code=%d status=%d\n", si.si_pid, si.si_pid == a, si.si_code,
           si.si_status);
    printf("self %d parent %d, kill(self, 0) = %d\n", getpid(), getppid(), kill(getpid(), 0));
    return 0;
}
"""

SHELL = "sleep 0.1 & echo $!; wait $!; echo $?; sleep 5 & echo $!; kill $!; wait $!; echo $?"


def _record(tmp: Path, argv: list[str], name: str) -> tuple[Path, bytes]:
    out = tmp / f"{name}.steno"
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return out, steno_cli.record(out, argv, work).stdout


def _replay(tmp: Path, steno: Path) -> dict:
    code, rep = steno_cli.replay_json(steno, tmp / "work")
    assert code == 0, rep
    return rep


def _replays_identically(tmp: Path, argv: list[str]) -> bytes:
    steno, out = _record(tmp, argv, "rec")
    for i in range(REPLAYS):
        rep = _replay(tmp, steno)
        assert rep["divergences"] == [], f"replay {i}: {rep['divergences']}"
        assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}, (
            f"replay {i}: {rep}")
    return out


def _pids(out: bytes, word: str) -> list[int]:
    return [int(line.split()[1]) for line in out.decode().splitlines() if line.startswith(word)]


def test_python_fork_popen_waits_and_kill(tmp_path: Path) -> None:
    prog = tmp_path / "pids.py"
    prog.write_text(PY_PROGRAM)
    out = _replays_identically(tmp_path, [PY, str(prog)])
    text = out.decode()
    assert "waitpid" in text and "True 7" in text
    assert "wait -15" in text  # the SIGTERM reached the live child at replay too
    assert "kill(self, 0) ok" in text
    assert "wait4 True" in text and "wait True" in text
    # the child printed the pid its parent was handed, and its parent's pid
    fork_pid = _pids(out, "fork")[0]
    child = next(line for line in text.splitlines() if line.startswith("child")).split()
    me = next(line for line in text.splitlines() if line.startswith("self")).split()
    assert int(child[1]) == fork_pid and child[2] == me[1]


def test_replayed_pids_are_the_recorded_ones_not_the_live_ones(tmp_path: Path) -> None:
    """A fresh replay's children get other live pids (the kernel counts on); the program
    still prints the recorded ones."""
    prog = tmp_path / "p.py"
    prog.write_text("import os, subprocess\n"
                    "p = subprocess.Popen(['true']); p.wait()\n"
                    "print(p.pid, os.getpid(), flush=True)\n")
    steno, out = _record(tmp_path, [PY, str(prog)], "rec")
    for _ in range(5):  # move the kernel's next pid on
        subprocess.run(["true"], check=True)
    rep = _replay(tmp_path, steno)
    assert rep["divergences"] == [] and all(rep["identical"].values()), rep
    assert subprocess.Popen(["true"]).pid != int(out.split()[0])


def test_shell_background_job_pid_and_wait(tmp_path: Path) -> None:
    out = _replays_identically(tmp_path, ["bash", "-c", SHELL])
    lines = out.decode().split()
    assert lines[1] == "0" and lines[3] == "143", lines


def test_c_posix_spawn_waitid_and_kill(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is part of the project's build requirements"
    src = tmp_path / "spawn.c"
    src.write_text(C_PROGRAM)
    exe = tmp_path / "spawn"
    subprocess.run([gcc, "-O2", "-o", str(exe), str(src)], check=True)
    out = _replays_identically(tmp_path, [str(exe)])
    text = out.decode()
    assert "same=1 code=1 status=0" in text  # CLD_EXITED
    assert "same=1 code=2 status=15" in text  # CLD_KILLED by the SIGTERM
    assert "kill(self, 0) = 0" in text


@pytest.mark.parametrize("attempt", range(2))
def test_killed_child_whose_replay_runs_further_waits_for_the_signal(tmp_path: Path,
                                                                     attempt: int) -> None:
    """A child killed at record stopped wherever the signal landed; at replay it may get
    further before the replayed kill arrives (sleeps return at once). Its tape has no
    exit record, so the shim waits for the signal instead of calling it a divergence."""
    prog = tmp_path / "k.py"
    prog.write_text("import os, signal, subprocess, time\n"
                    "p = subprocess.Popen(['sleep', '5'])\n"
                    "time.sleep(0.2)\n"  # record: the child is in its sleep by now
                    "os.kill(p.pid, signal.SIGTERM)\n"
                    "print(p.wait(), flush=True)\n")
    t0 = time.monotonic()
    out = _replays_identically(tmp_path, [PY, str(prog)])
    assert out == b"-15\n"
    assert time.monotonic() - t0 < 30


def test_paused_calls_see_the_recorded_pids(tmp_path: Path) -> None:
    """While the tape is paused (what the Python hooks do around a real call) nothing is
    taped, yet the program's pids keep their recorded numbering both ways: a recorded pid
    passed in reaches the live process, a live pid coming back is the recorded one."""
    prog = tmp_path / "paused.py"
    prog.write_text("import ctypes, os, signal, time\n"
                    "lib = ctypes.CDLL(None)\n"
                    "pid = os.fork()\n"
                    "if pid == 0:\n"
                    "    time.sleep(5)\n"
                    "    os._exit(0)\n"
                    "lib.steno_pause()\n"
                    "os.kill(pid, 0)\n"
                    "me = os.getpid()\n"
                    "os.kill(pid, signal.SIGKILL)\n"
                    "got, status = os.waitpid(pid, 0)\n"
                    "lib.steno_resume()\n"
                    "print(pid, got == pid, me == os.getpid(), os.WTERMSIG(status), flush=True)\n")
    out = _replays_identically(tmp_path, [PY, str(prog)])
    assert out.split()[1:] == [b"True", b"True", b"9"], out
