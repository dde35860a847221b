"""Resume: how long bringing a crashed run back takes, against how long it ran.

A program (``requests``, the OpenAI chat-completions wire format) makes ``N`` model
turns against the loopback model server, each reply taking ``--latency`` ms to arrive
(a real model takes seconds; 0 measures stenograph alone). It is recorded into a store
and the whole process group is SIGKILLed as its last turn is asked for: the worst case,
the longest prefix. ``stenograph resume`` then replays the N - 1 recorded turns and
makes the last one live. Printed per N: the recorded wall time up to the crash, the
resume's wall time (the whole command: claim, tape preparation, the replayed prefix,
the live turn, the end), and their ratio; the least of ``--tries`` runs each.

    python bench/resume.py [--turns 10,100,1000] [--latency 0] [--tries 3] [--json]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from stenograph.testing.model_server import Knobs, ModelServer

CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import requests, sys
base, n = sys.argv[1], int(sys.argv[2])
msgs = [{"role": "user", "content": "count with me"}]
s = requests.Session()
s.headers["Authorization"] = "Bearer sk-bench"
for i in range(n):
    r = s.post(base + "/chat/completions", json={"model": "steno-bench", "messages": msgs[-8:]})
    msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    msgs.append({"role": "user", "content": f"turn {i}"})
print("turns", n)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}


def one(work: Path, n: int, latency: int) -> tuple[float, float, int]:
    """(recorded seconds to the crash, resume seconds, resume exit status)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prog = work / "p.py"
    prog.write_text(PROGRAM)
    with ModelServer(knobs=Knobs(delay_ms=latency)) as models:
        t0 = time.monotonic()
        p = subprocess.Popen([*CLI, "record", "--store", str(work / "s"), "--traj", "t",
                              "--workspace", "none", "-o", str(work / "t.steno"), "--",
                              sys.executable, str(prog), models.openai_base_url, str(n)],
                             cwd=work, env=_env(), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        crashed: list[float] = []

        def watch() -> None:
            while p.poll() is None:
                if len(models.requests) >= n:
                    os.killpg(p.pid, signal.SIGKILL)
                    crashed.append(time.monotonic())
                    return
                time.sleep(0.0005)

        threading.Thread(target=watch, daemon=True).start()
        p.wait()
        recorded = (crashed[0] if crashed else time.monotonic()) - t0
        t1 = time.monotonic()
        r = subprocess.run([*CLI, "resume", str(work / "s"), "t"], cwd=work, env=_env(),
                           capture_output=True, text=True)
        resumed = time.monotonic() - t1
        if r.returncode != 0 or "turns" not in r.stdout:
            print(r.stderr[-2000:], file=sys.stderr)
        return recorded, resumed, r.returncode if "turns" in r.stdout else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", default="10,100,1000")
    ap.add_argument("--latency", type=int, default=0, help="ms per model reply")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steno-bench-resume-", dir=str(Path.home())))
    rows: list[dict[str, Any]] = []
    try:
        for n in (int(x) for x in args.turns.split(",")):
            runs = [one(work / "w", n, args.latency) for _ in range(args.tries)]
            rec = min(r[0] for r in runs)
            res = min(r[1] for r in runs)
            rows.append({"turns": n, "latency_ms": args.latency,
                         "recorded_s": round(rec, 3), "resume_s": round(res, 3),
                         "resume_over_recorded": round(res / rec, 3),
                         "resume_ms_per_turn": round(1000 * res / n, 2),
                         "statuses": sorted({r[2] for r in runs})})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"resume after a crash at the last turn (model latency {args.latency} ms; "
          f"least of {args.tries})")
    print(f"{'turns':>6} {'recorded s':>11} {'resume s':>9} {'ratio':>7} {'ms/turn':>8}")
    for r in rows:
        print(f"{r['turns']:>6} {r['recorded_s']:>11.3f} {r['resume_s']:>9.3f} "
              f"{r['resume_over_recorded']:>7.3f} {r['resume_ms_per_turn']:>8.2f}"
              + ("" if r["statuses"] == [0] else f"  exit {r['statuses']}"))


if __name__ == "__main__":
    main()
