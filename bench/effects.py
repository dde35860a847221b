"""The intent barrier: what writing an effect down before sending it costs.

A program makes ``-n`` POSTs (``requests``) to the loopback effect service and prints
the mean seconds per call, timed inside the program:

* ``native``: the program alone;
* ``recorded, not effects``: under ``stenograph record`` with the URL declared read-only
  (``STENO_READONLY_URLS``): every call recorded, none written down first;
* ``recorded, effects``: the default: each call's ``ToolIntent`` is durable (the
  recorder drains the tree's rings, appends, fdatasyncs) before the request leaves.

The intent's cost is the difference of the last two. Against it, in this process: one
bare ``fdatasync`` of a small write in the same directory (the physical floor), and the
nearest peer doing the same job: a DBOS step (the ``dbos`` package with its SQLite
system database) wrapping the same POST inside a workflow, against the same POST made
plainly in this process. ``pip install dbos`` to include it.

    python bench/effects.py [-n 200] [--json]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from stenograph.testing.effect_service import EffectService

PROGRAM = """
import sys, time, requests
base, n = sys.argv[1], int(sys.argv[2])
s = requests.Session()
s.post(base + "/servers", json={"name": "warm"})
t = []
for i in range(n):
    t0 = time.perf_counter()
    s.post(base + "/servers", json={"name": f"s{i}"})
    t.append(time.perf_counter() - t0)
print(sum(t) / n)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env.update(extra)
    return env


def run_program(work: Path, url: str, n: int, mode: str) -> float:
    prog = work / "posts.py"
    prog.write_text(PROGRAM)
    argv = [sys.executable, str(prog), url, str(n)]
    if mode == "native":
        out = subprocess.run(argv, env=_env(), capture_output=True, text=True, check=True)
        return float(out.stdout.strip())
    extra = {"STENO_READONLY_URLS": "/servers"} if mode == "readonly" else {}
    steno = work / f"{mode}-{time.monotonic_ns()}.steno"
    out = subprocess.run([sys.executable, "-m", "stenograph", "record", "--workspace", "none",
                          "-o", str(steno), "--", *argv], cwd=work, env=_env(**extra),
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bare_fdatasync(work: Path, n: int) -> float:
    fd = os.open(work / "sync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, b"x" * 128)
            os.fdatasync(fd)
        return (time.perf_counter() - t0) / n
    finally:
        os.close(fd)


def dbos_step(work: Path, url: str, n: int) -> tuple[float, float] | None:
    """(plain POST, the same POST as a DBOS step inside a workflow), seconds per call."""
    try:
        import logging

        from dbos import DBOS
    except ImportError:
        return None
    logging.getLogger("dbos").setLevel(logging.WARNING)
    s = requests.Session()
    s.post(url + "/servers", json={"name": "warm"})
    t0 = time.perf_counter()
    for i in range(n):
        s.post(url + "/servers", json={"name": f"p{i}"})
    plain = (time.perf_counter() - t0) / n
    DBOS(config={"name": "steno-bench", "application_version": "1",
                 "system_database_url": f"sqlite:///{work / 'dbos.sqlite'}"})

    @DBOS.step()
    def post(i: int) -> int:
        return s.post(url + "/servers", json={"name": f"d{i}"}).status_code

    @DBOS.workflow()
    def flow(k: int) -> float:
        t = time.perf_counter()
        for i in range(k):
            post(i)
        return (time.perf_counter() - t) / k

    DBOS.launch()
    try:
        return plain, float(flow(n))
    finally:
        DBOS.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steno-bench-fx-", dir=str(Path.home())))
    out: dict[str, Any] = {}
    with EffectService() as svc:
        for mode in ("native", "readonly", "effects"):
            out[mode] = statistics.median(run_program(work, svc.url, a.n, mode)
                                          for _ in range(a.repeat))
        out["fdatasync"] = statistics.median(bare_fdatasync(work, a.n) for _ in range(3))
        d = dbos_step(work, svc.url, a.n)
        if d is not None:
            out["plain_in_process"], out["dbos_step"] = d
    out["intent"] = out["effects"] - out["readonly"]
    if a.json:
        print(json.dumps(out))
        return
    ms = {k: v * 1e3 for k, v in out.items()}
    print(f"POST to the loopback effect service, {a.n} calls, mean per call:")
    print(f"  native                 {ms['native']:7.3f} ms")
    print(f"  recorded, not effects  {ms['readonly']:7.3f} ms")
    print(f"  recorded, effects      {ms['effects']:7.3f} ms   intent barrier "
          f"{ms['intent']:6.3f} ms per effect")
    print(f"  bare fdatasync         {ms['fdatasync']:7.3f} ms   (intent = "
          f"{out['intent'] / out['fdatasync']:.2f}x one fdatasync)")
    if "dbos_step" in out:
        over = out["dbos_step"] - out["plain_in_process"]
        print(f"  DBOS step              {ms['dbos_step']:7.3f} ms   vs plain in-process "
              f"{ms['plain_in_process']:.3f} ms: {over * 1e3:.3f} ms per step "
              f"({over / out['fdatasync']:.2f}x one fdatasync; the intent is "
              f"{out['intent'] / over:.2f}x a DBOS step's overhead)")
    else:
        print("  DBOS step              (pip install dbos to compare)")


if __name__ == "__main__":
    main()
