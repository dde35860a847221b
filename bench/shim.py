"""Shim overhead: ns per call natively, recorded, replayed and under libfaketime.

Micro: a small C program (built here with the system compiler) times N calls of
``clock_gettime``, ``getrandom(16)``, ``readdir`` and ``stat`` (meta channel) with a
*raw* clock syscall, so the measurement itself is never served from the tape (replay
with the live drift check and, for stat, without it: ``STENO_DRIFT=0``). Start-up: the
wall time of ``python -c pass`` and ``python -c "import json, asyncio, email"`` native,
recorded and replayed (and recorded with another build of the library given as
``--before PATH``, e.g. one without the meta channel). Macro: the wall time of a Python
workload (imports, 10k clock reads, 1k listings, a few subprocesses) run natively,
recorded and replayed through the library (no CLI start-up in the figures); its native
baseline goes through the same launcher without the shim (``native_subprocess_s`` is a
plain ``subprocess.run`` for comparison).

    python bench/shim.py [--json] [-n CALLS] [--before OLD_SHIM.so]

Each micro figure is the least of 5 runs (noise on a shared machine only adds).
``clock`` is one loop from the process's first call (the ring's pages faulted in, the
recorder draining alongside); ``clock-warm`` times n/10 calls after 50,000 (the steady
cost of a record).

Targets (issue 3): record <= 1.5x native per clock call and below libfaketime; replay
<= native; whole recorded run <= 1.10x native.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stenograph.recorder.store import Store
from stenograph.recorder.tape import RecordSession, prepare_tape
from stenograph.runner.launch import python_executable, run_under_shim
from stenograph.runner.shim import shim_path

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
TRIES = 5

MICRO_C = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static long long raw_now(void) {
    struct timespec t; long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_clock_gettime), "D"(CLOCK_MONOTONIC), "S"(&t)
                     : "rcx", "r11", "memory");
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
    long n = atol(argv[2]);
    long calls = 0;
    struct timespec ts; unsigned char buf[16]; volatile long sink = 0;
    long long t0 = raw_now();
    if (!strcmp(argv[1], "clock")) {
        for (long i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }
        calls = n;
    } else if (!strcmp(argv[1], "clock-warm")) { /* after a pass over the ring */
        for (long i = 0; i < 50000; i++) clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = raw_now();
        for (long i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }
        calls = n;
    } else if (!strcmp(argv[1], "stat")) {
        struct stat st;
        for (long i = 0; i < n; i++) { stat(argv[3], &st); sink += st.st_mtim.tv_nsec; }
        calls = n;
    } else if (!strcmp(argv[1], "getrandom")) {
        for (long i = 0; i < n; i++) { getrandom(buf, 16, 0); sink += buf[0]; }
        calls = n;
    } else {
        for (long i = 0; i < n; i++) {
            DIR *d = opendir(argv[3]); struct dirent *e;
            while ((e = readdir(d)) != NULL) { sink += e->d_name[0]; calls++; }
            closedir(d);
        }
    }
    long long t1 = raw_now();
    printf("%.2f\n", (double)(t1 - t0) / (double)calls);
    return 0;
}
"""

WORKLOAD = r"""
import json, os, shutil, subprocess, time, tempfile, decimal, email.parser, http.client, asyncio
d = tempfile.mkdtemp()
for i in range(50):
    open(os.path.join(d, f"f{i:03d}"), "w").close()
s = 0
for _ in range(10000):
    s += time.monotonic_ns() & 1
n = 0
for _ in range(1000):
    n += len(os.listdir(d))
for _ in range(3):
    subprocess.run(["true"])
shutil.rmtree(d)  # a leftover directory would change the replayed mkdtemp retries
print(s >= 0, n)
"""


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env.pop("LD_PRELOAD", None)
    env.update(extra)
    return env


def _shim_env(mode: str, so: str | None = None, **kw: str) -> dict[str, str]:
    so = so or shim_path()
    return _env({"LD_PRELOAD": so, "STENO_MODE": mode, "STENO_PROC": "0", "STENO_SHIM": so,
                 **kw})


def _record(argv: list[str], work: Path, so: str | None = None) -> tuple[float, Path, bytes]:
    """Run argv recorded; return wall seconds, the prepared replay tape, stdout."""
    store_dir = work / f"store{time.monotonic_ns()}"
    with Store(store_dir) as store:
        sess = RecordSession(store, "bench", work / "s.sock")
        t0 = time.perf_counter()
        res = run_under_shim(argv, _shim_env("record", so, STENO_SOCK=sess.sock_path),
                             passthrough=False, capture=True)
        wall = time.perf_counter() - t0
        sess.close()
        events = store.events(traj="bench")
    tape = work / f"tape{time.monotonic_ns()}"
    prepare_tape(events, tape)
    shutil.rmtree(store_dir, ignore_errors=True)
    return wall, tape, res.stdout or b""


def _replay(argv: list[str], tape: Path, **kw: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    res = run_under_shim(argv, _shim_env("replay", STENO_TAPE=str(tape), **kw),
                         passthrough=False, capture=True)
    wall = time.perf_counter() - t0
    if (tape / "divergence").exists():
        print("warning: replay diverged:", (tape / "divergence").read_text()[:300],
              file=sys.stderr)
    return wall, res.stdout or b""


def _native(argv: list[str], extra: dict[str, str] | None = None) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=_env(extra or {}), capture_output=True, check=True)
    return time.perf_counter() - t0, p.stdout


def _native_launched(argv: list[str]) -> float:
    """Native, through the same launcher as record and replay (ASLR off, fork with a
    preexec hook, output pumps) but without the shim: the ratios then isolate what the
    shim and the recorder cost, not how a Python parent starts a child."""
    t0 = time.perf_counter()
    run_under_shim(argv, _env({}), passthrough=False, capture=True)
    return time.perf_counter() - t0


def micro(work: Path, n: int) -> dict[str, dict[str, float | None]]:
    src = work / "micro.c"
    src.write_text(MICRO_C)
    exe = work / "micro"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    listing = work / "dir"
    listing.mkdir()
    for i in range(100):
        (listing / f"entry-{i:04d}").touch()
    out: dict[str, dict[str, float | None]] = {}
    target = listing / "entry-0000"
    for what, calls in (("clock", n), ("clock-warm", n // 10), ("getrandom", n // 4),
                        ("readdir", max(1, n // 400)),
                        ("stat", n // 8)):
        argv = [str(exe), what, str(calls), str(target if what == "stat" else listing)]
        # the least of TRIES runs each: on a shared machine noise only ever adds
        native = min(float(_native(argv)[1]) for _ in range(TRIES))
        recs = [_record(argv, work) for _ in range(TRIES)]
        recorded = min(float(r[2]) for r in recs)
        tape = recs[0][1]
        replayed = min(float(_replay(argv, tape)[1]) for _ in range(TRIES))
        nodrift = float(_replay(argv, tape, STENO_DRIFT="0")[1]) if what == "stat" else None
        faked = None
        if os.path.exists(FAKETIME):
            faked = min(float(_native(argv, {"LD_PRELOAD": FAKETIME, "FAKETIME": "+0",
                                             "FAKETIME_NO_CACHE": "1"})[1])
                        for _ in range(TRIES))
        out[what] = {"native_ns": native, "record_ns": recorded, "replay_ns": replayed,
                     "libfaketime_ns": faked,
                     "record_x": round(recorded / native, 3),
                     "replay_x": round(replayed / native, 3)}
        if nodrift is not None:
            out[what]["replay_nodrift_ns"] = nodrift
            out[what]["replay_nodrift_x"] = round(nodrift / native, 3)
    return out


STARTUPS = {"pass": ["-c", "pass"], "imports": ["-c", "import json, asyncio, email"]}


def startup(work: Path, repeat: int, before: str | None) -> dict[str, dict[str, float]]:
    """Python start-up, native (same launcher, no shim) vs recorded vs replayed; with
    ``before``, also recorded with that build of the library."""
    out: dict[str, dict[str, float]] = {}
    for name, args in STARTUPS.items():
        argv = [python_executable(), *args]
        nat, rec, rep, old = [], [], [], []
        for _ in range(repeat):
            nat.append(_native_launched(argv))
            wall, tape, _ = _record(argv, work)
            rec.append(wall)
            rep.append(_replay(argv, tape)[0])
            if before:
                old.append(_record(argv, work, before)[0])
        n = min(nat)
        fig = {"native_s": round(n, 4), "record_s": round(min(rec), 4),
               "replay_s": round(min(rep), 4), "record_x": round(min(rec) / n, 3),
               "replay_x": round(min(rep) / n, 3)}
        if old:
            fig["record_before_s"] = round(min(old), 4)
            fig["record_before_x"] = round(min(old) / n, 3)
        out[name] = fig
    return out


def macro(work: Path, repeat: int) -> dict[str, float]:
    prog = work / "workload.py"
    prog.write_text(WORKLOAD)
    argv = [python_executable(), str(prog)]
    nat, spawned, rec, rep = [], [], [], []
    for _ in range(repeat):
        spawned.append(_native(argv)[0])
        nat.append(_native_launched(argv))
        wall, tape, _ = _record(argv, work)
        rec.append(wall)
        rep.append(_replay(argv, tape)[0])
    n, r, p, s = min(nat), min(rec), min(rep), min(spawned)
    return {"native_s": round(n, 4), "record_s": round(r, 4), "replay_s": round(p, 4),
            "record_x": round(r / n, 3), "replay_x": round(p / n, 3),
            "native_subprocess_s": round(s, 4), "record_vs_subprocess_x": round(r / s, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=400_000, help="clock calls in the micro loop")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--before", help="another build of the shim to record start-ups with")
    ap.add_argument("--only", choices=["micro", "startup", "workload"], action="append")
    a = ap.parse_args()
    parts = set(a.only or ["micro", "startup", "workload"])
    work = Path(tempfile.mkdtemp(prefix="steno-bench-"))
    try:
        result = {"micro": micro(work, a.n) if "micro" in parts else {},
                  "startup": startup(work, a.repeat, a.before) if "startup" in parts else {},
                  "workload": macro(work, a.repeat) if "workload" in parts else {}}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(result))
        return 0
    for what, fig in result["micro"].items():
        ft = fig["libfaketime_ns"]
        print(f"{what:10s} native {fig['native_ns']:8.1f} ns  record {fig['record_ns']:8.1f} ns "
              f"({fig['record_x']}x)  replay {fig['replay_ns']:8.1f} ns ({fig['replay_x']}x)  "
              f"libfaketime {'-' if ft is None else f'{ft:.1f} ns'}"
              + (f"  replay STENO_DRIFT=0 {fig['replay_nodrift_ns']:8.1f} ns "
                 f"({fig['replay_nodrift_x']}x)" if "replay_nodrift_ns" in fig else ""))
    for name, fig in result["startup"].items():
        before = (f"  [before: record {fig['record_before_s']} s ({fig['record_before_x']}x)]"
                  if "record_before_s" in fig else "")
        print(f"start-up {name:8s} native {fig['native_s']} s  record {fig['record_s']} s "
              f"({fig['record_x']}x)  replay {fig['replay_s']} s ({fig['replay_x']}x){before}")
    w = result["workload"]
    if not w:
        return 0
    print(f"workload   native {w['native_s']} s  record {w['record_s']} s ({w['record_x']}x)  "
          f"replay {w['replay_s']} s ({w['replay_x']}x)  [plain subprocess.run: "
          f"{w['native_subprocess_s']} s, record {w['record_vs_subprocess_x']}x of it]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
