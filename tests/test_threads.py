"""Threads are an input like a clock: multi-threaded programs replay bit for bit.

Each program in ``tests/programs/`` is recorded three times and each recording is
replayed ten times in a row (the scheduler differs every time, so one pass proves
little). The programs are written the way their users write them: thread pools,
barriers, queues polled with timeouts, conditions and events with timeouts, asyncio
with ``to_thread``, threads running subprocesses, C threads on a mutex and a
condition variable, and coreutils ``sort --parallel``.
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
PROGRAMS = Path(__file__).resolve().parent / "programs"
RECORDINGS, REPLAYS = (int(n) for n in os.environ.get("STENO_THREAD_RUNS", "1x2").split("x"))
"""Recordings per program and replays per recording (``make soak``: 3x10)."""


def _record(tmp: Path, argv: list[str], name: str) -> tuple[Path, bytes, float]:
    out = tmp / f"{name}.steno"
    t0 = time.monotonic()
    p = steno_cli.record(out, argv, tmp)
    return out, p.stdout, time.monotonic() - t0

def _replay(tmp: Path, steno: Path) -> tuple[int, dict]:
    return steno_cli.replay_json(steno, tmp)

def _replays_identically(tmp: Path, argv: list[str]) -> list[bytes]:
    outputs = []
    for r in range(RECORDINGS):
        steno, out, _ = _record(tmp, argv, f"rec{r}")
        outputs.append(out)
        for i in range(REPLAYS):
            code, rep = _replay(tmp, steno)
            assert rep["divergences"] == [], f"recording {r}, replay {i}: {rep['divergences']}"
            assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}, (
                f"recording {r}, replay {i}: {rep}")
            assert code == 0
    return outputs


@pytest.mark.parametrize("program", ["threads_pool.py", "threads_waits.py",
                                     "threads_asyncio.py", "threads_subprocess.py"])
def test_threaded_python_replays_bit_for_bit(tmp_path: Path, program: str) -> None:
    outputs = _replays_identically(tmp_path, [PY, str(PROGRAMS / program)])
    assert all(outputs), "every recording printed something"


def test_pool_interleaving_is_an_input(tmp_path: Path) -> None:
    """The recorded runs differ from each other (the interleaving, the clocks, the uuids
    are live at record), so what the replays reproduce is the tape, not a fixed order."""
    outs = {_record(tmp_path, [PY, str(PROGRAMS / "threads_pool.py")], f"r{i}")[1]
            for i in range(3)}
    assert len(outs) == 3


def test_c_threads_on_a_mutex_and_condition(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is part of the project's build requirements"
    exe = tmp_path / "prodcons"
    subprocess.run([gcc, "-O1", "-pthread", "-o", str(exe), str(PROGRAMS / "prodcons.c")],
                   check=True)
    outputs = _replays_identically(tmp_path, [str(exe)])
    items = outputs[0].split(b"\n")[0].split()
    assert sorted(int(x) for x in items) == sorted(i * 100 + j for i in range(3)
                                                   for j in range(16))


def test_a_thread_spinning_on_the_clock_lets_the_one_it_waits_for_run(tmp_path: Path) -> None:
    """``clock_spin.c``: the main thread reads the clock until a sleeping worker sets a
    flag. It never blocks: before the scheduler's turns in a run of clock reads, record
    stalled (the worker never got the baton) and replay stopped there."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is part of the project's build requirements"
    exe = tmp_path / "clock_spin"
    subprocess.run([gcc, "-O1", "-pthread", "-o", str(exe), str(PROGRAMS / "clock_spin.c")],
                   check=True)
    warn = subprocess.run([*CLI, "record", "-o", str(tmp_path / "w.steno"), "--", str(exe)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120).stderr
    assert "stall limit" not in warn, warn
    outputs = _replays_identically(tmp_path, [str(exe)])
    assert all(int(o.split()[1]) > 4096 for o in outputs), outputs


def test_coreutils_sort_parallel(tmp_path: Path) -> None:
    nums = tmp_path / "nums.txt"
    nums.write_text("".join(f"{(i * 7919) % 100003}\n" for i in range(60000)))
    _replays_identically(tmp_path, ["sort", "--parallel=4", "-S", "8M", "-n", str(nums)])


def test_busy_wait_does_not_hang_record_and_replay_stops_where_it_broke(
        tmp_path: Path) -> None:
    """A thread that never blocks would starve the others for ever: record gives up on
    the schedule after the stall limit and finishes; replay fails closed at that point."""
    steno, out, took = _record(tmp_path, [PY, str(PROGRAMS / "busy_wait.py")], "busy")
    assert out.startswith(b"spun True")
    assert took < 30
    warn = subprocess.run([*CLI, "record", "-o", str(tmp_path / "busy2.steno"), "--", PY,
                           str(PROGRAMS / "busy_wait.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120).stderr
    assert "stenograph: warning: process 0 thread" in warn and "will stop at turn" in warn, warn
    code, rep = _replay(tmp_path, steno)
    assert code == 1
    sched = [d for d in rep["divergences"] if d["channel"] == "sched"]
    assert sched and "unscheduled" in sched[0]["recorded"], rep


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_threads_inside_a_call_when_the_process_ends(tmp_path: Path, how: str) -> None:
    """Their recordings end mid-call (no record of the call they were in): replay waits
    for the replayed exit there instead of reporting the end of their tape."""
    argv = [PY, str(PROGRAMS / "threads_at_exit.py"), *(["_exit"] if how == "_exit" else [])]
    steno, out, _ = _record(tmp_path, argv, "exit")
    assert b"done" in out
    for i in range(3):  # before: 3 of 3 replays of such a recording diverged
        code, rep = _replay(tmp_path, steno)
        assert code == 0 and rep["divergences"] == [], f"replay {i}: {rep['divergences']}"
        assert all(rep["identical"].values()), rep
