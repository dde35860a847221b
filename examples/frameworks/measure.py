#!/usr/bin/env python3
"""Record every framework agent N times, stop the server, replay each recording M times.

Why: whether a framework replays is a property of how it uses threads, clocks and the
event loop, and a single replay can be lucky. This prints, per recording and per
replay, the verdict and the exact divergence (process, thread, channel, position,
what the tape held and what the program asked), from ``stenograph replay --json``,
so a change to the shim can be judged framework by framework.

Usage (from the repository root, frameworks installed: ``pip install -e '.[frameworks]'``)::

    python examples/frameworks/measure.py [--records 3] [--replays 3] [--keep DIR] [--asyncio]
        [FW ...]

FW is one of langgraph, openai_agents, pydantic_ai, litellm, smolagents (default: all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stenograph.testing.model_server import ModelServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CLI = [sys.executable, "-m", "stenograph"]
FRAMEWORKS = ["langgraph", "openai_agents", "pydantic_ai", "litellm", "smolagents"]


def _script(fw: str) -> Path:
    # a ToolCallingAgent only ends on a final_answer call, so smolagents has its own
    return HERE / ("smolagents_script.json" if fw == "smolagents" else "script.json")


def _verdict(stdout: str) -> str:
    try:
        rep = json.loads(stdout)
    except ValueError:
        return f"no report: {stdout[-200:]!r}"
    same = rep.get("identical", {})
    if not rep.get("divergences") and same and all(same.values()):
        return "bit-identical"
    parts = [f"identical={same}", f"exit={rep.get('exit_status')}"]
    for d in rep.get("divergences", []):
        parts.append(
            f"divergence proc={d.get('proc')} thread={d.get('thread')} "
            f"channel={d.get('channel')} pos={d.get('position')} "
            f"recorded={d.get('recorded')!r} asked={d.get('asked')!r}"
        )
    return "; ".join(parts)


def measure(fw: str, records: int, replays: int, out: Path, flags: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    stenos = []
    with ModelServer(script=_script(fw)) as srv:
        env["OPENAI_BASE_URL"] = srv.openai_base_url
        env["OPENAI_API_KEY"] = "sk-measure"
        for i in range(records):
            steno = out / f"{fw}-{i}.steno"
            t = time.perf_counter()
            cmd = [
                *CLI,
                "record",
                *flags,
                "-o",
                str(steno),
                "--",
                sys.executable,
                str(HERE / f"{fw}_agent.py"),
            ]
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            print(f"{fw} record {i}: exit {r.returncode}, {time.perf_counter() - t:.1f}s: {last}")
            if r.returncode == 0:
                stenos.append(steno)
    del env["OPENAI_API_KEY"]  # the server is stopped; replay needs neither
    for i, steno in enumerate(stenos):
        for j in range(replays):
            t = time.perf_counter()
            r = subprocess.run(
                [*CLI, "replay", "--json", str(steno)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            dt = time.perf_counter() - t
            print(f"{fw} replay {i}.{j}: exit {r.returncode}, {dt:.1f}s: {_verdict(r.stdout)}")
        sys.stdout.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("frameworks", nargs="*", help=", ".join(FRAMEWORKS) + " (default: all)")
    p.add_argument("--records", type=int, default=3)
    p.add_argument("--replays", type=int, default=3)
    p.add_argument("--keep", help="keep the recordings in this directory")
    p.add_argument("--asyncio", action="store_true", help="record with --asyncio")
    a = p.parse_args()
    unknown = sorted(set(a.frameworks) - set(FRAMEWORKS))
    if unknown:
        p.error(f"unknown framework(s) {unknown}; choose from {FRAMEWORKS}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        for fw in a.frameworks or FRAMEWORKS:
            measure(fw, a.records, a.replays, out, ['--asyncio'] if a.asyncio else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
