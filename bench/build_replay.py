"""Build replay: what judging a recording against the current code costs.

1. The demo agent (examples/agent.py, the openai SDK, four model turns and three tools,
   one a shell) is recorded once against the loopback model server; printed: the
   recorded run's wall time (the `record` command, model server replies at once), an
   exact replay's and a build replay's (`replay --build`, the agent edited with extra
   clock, entropy and listing reads so the build path is exercised), the least of
   ``--tries``, and their ratios to the recorded time.
2. ``stenograph regress`` over a directory of ``--logs`` copies of that log: wall time
   and logs/s with ``-j 1`` and ``-j 2`` (the ratio is the parallel speed-up on this
   machine's cores).

    python bench/build_replay.py [--logs 100] [--tries 3] [--json]

A benchmark prints figures; it asserts nothing.
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
from typing import Any

from stenograph.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stenograph"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
    env.update(extra)
    return env


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=900)
    took = time.perf_counter() - t0
    if p.returncode not in (0,):
        raise SystemExit(f"{' '.join(argv[:5])}...: exit {p.returncode}\n"
                         f"{p.stderr.decode(errors='replace')[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=int, default=100)
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="steno-bench-build-"))
    out: dict[str, Any] = {}
    try:
        ws = root / "ws"
        ws.mkdir()
        shutil.copy(REPO / "examples" / "agent.py", ws)
        shutil.copy(REPO / "examples" / "agent_script.json", ws)
        steno = root / "agent.steno"
        script = json.loads((REPO / "examples" / "agent_script.json").read_text())
        rec = []
        for _ in range(a.tries):
            with ModelServer(script=script) as srv:
                rec.append(_timed([*CLI, "record", "-o", str(steno), "--", sys.executable,
                                   "agent.py", "--workdir", "."], ws,
                                  _env(OPENAI_BASE_URL=srv.openai_base_url,
                                       OPENAI_API_KEY="sk-bench")))
        exact = min(_timed([*CLI, "replay", str(steno)], ws, _env()) for _ in range(a.tries))
        src = (ws / "agent.py").read_text()
        (ws / "agent.py").write_text(src.replace(
            "from openai import OpenAI\n",
            "from openai import OpenAI\nimport decimal, random\n"
            "_x = (time.time(), uuid.uuid4(), os.listdir('.'), random.random())\n"))
        build = min(_timed([*CLI, "replay", "--build", str(steno)], ws, _env())
                    for _ in range(a.tries))
        out["demo"] = {"recorded_s": round(min(rec), 3), "exact_replay_s": round(exact, 3),
                       "build_replay_s": round(build, 3),
                       "build_over_recorded": round(build / min(rec), 2),
                       "build_over_exact": round(build / exact, 2)}
        logs = root / "logs"
        logs.mkdir()
        for i in range(a.logs):
            shutil.copy(steno, logs / f"run{i:03d}.steno")
        for jobs in (1, 2):
            t = _timed([*CLI, "regress", str(logs), "-j", str(jobs), "--json"], ws, _env())
            out[f"regress_j{jobs}"] = {"logs": a.logs, "wall_s": round(t, 2),
                                       "logs_per_s": round(a.logs / t, 2)}
        out["regress_speedup_j2_over_j1"] = round(out["regress_j1"]["wall_s"]
                                                  / out["regress_j2"]["wall_s"], 2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(out))
        return
    d = out["demo"]
    print(f"demo agent: recorded {d['recorded_s']:.3f} s, exact replay {d['exact_replay_s']:.3f}"
          f" s, build replay {d['build_replay_s']:.3f} s (x{d['build_over_recorded']} the "
          f"recorded run, x{d['build_over_exact']} an exact replay)")
    for jobs in (1, 2):
        r = out[f"regress_j{jobs}"]
        print(f"regress -j {jobs}: {r['logs']} logs in {r['wall_s']:.1f} s "
              f"({r['logs_per_s']:.2f} logs/s)")
    print(f"regress -j 2 over -j 1: x{out['regress_speedup_j2_over_j1']}")


if __name__ == "__main__":
    main()
