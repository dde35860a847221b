"""A framework agent's whole run: native vs recorded, and replayed vs its recording.

Runs ``examples/frameworks/<agent>.py`` (LangGraph by default) against the loopback
model server, ``-n`` times each way, and prints the median wall times and the ratios
``record / native`` and ``replay / record``. The peer is the same program run natively
in the same process tree, the same minute. Each run starts in a project directory that
holds only the agent (the workspace a user's agent would snapshot; the repository's own
checkout with its .git would be measured otherwise); ``record --workspace none`` is timed
too, so the snapshot's share shows. No timed test asserts these figures.

    python bench/agent_run.py [--agent langgraph_agent] [-n 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/http_capture.py would shadow the standard library's http for a script run from bench/
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from stenograph.testing.model_server import ModelServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "examples" / "frameworks"
CLI = [sys.executable, "-m", "stenograph"]


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=300)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(argv[:6])}... failed: {p.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", default="langgraph_agent")
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    script = AGENTS / f"{args.agent}.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    native, record, bare, replay = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, ModelServer(
            script=AGENTS / "script.json") as srv:
        env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-bench")
        project = Path(tmp) / "project"
        project.mkdir()
        shutil.copy(script, project)
        out = Path(tmp) / "out"
        out.mkdir()
        prog = [sys.executable, script.name]
        _timed(prog, env, project)  # warm the page cache and the server
        for i in range(args.n):
            native.append(_timed(prog, env, project))
            steno = str(out / f"r{i}.steno")
            record.append(_timed([*CLI, "record", "-o", steno, "--", *prog], env, project))
            bare.append(_timed([*CLI, "record", "--workspace", "none", "-o",
                                str(out / f"b{i}.steno"), "--", *prog], env, project))
            replay.append(_timed([*CLI, "replay", steno], env, project))
    med = {k: statistics.median(v) for k, v in
           (("native_s", native), ("record_s", record), ("record_no_workspace_s", bare),
            ("replay_s", replay))}
    out = {"agent": args.agent, "runs": args.n, **{k: round(v, 3) for k, v in med.items()},
           "record_over_native": round(med["record_s"] / med["native_s"], 3),
           "record_no_workspace_over_native": round(med["record_no_workspace_s"]
                                                    / med["native_s"], 3),
           "replay_over_record": round(med["replay_s"] / med["record_s"], 3)}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.agent}, median of {args.n}: native {med['native_s']:.3f} s, "
          f"recorded {med['record_s']:.3f} s ({out['record_over_native']}x native; "
          f"{med['record_no_workspace_s']:.3f} s with --workspace none, "
          f"{out['record_no_workspace_over_native']}x), "
          f"replayed {med['replay_s']:.3f} s ({out['replay_over_record']}x its recording)")


if __name__ == "__main__":
    main()
