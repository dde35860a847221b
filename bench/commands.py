"""The cost of commands as effects: an exec recorded as read-only, as an effect, natively.

A Python program runs ``/bin/true`` N times through ``subprocess.run`` and times the
loop itself (``time.perf_counter``; imports and start-up not counted). It runs natively
(the peer: the same program, same machine, no shim), under ``stenograph record`` (every
exec tells the recorder what runs: ``MSG_EXEC``, one round trip), and under ``record
--policy`` naming ``true`` an effect (each exec also makes its ``ToolIntent`` durable,
an fdatasync, and its exit its ``ToolResult``, another). Then a coding agent's shell-outs:
50 everyday commands (``git status``, ``ls``, ``grep``, ``cat``, ``wc``, ``sed``) in a
small git repository, natively and recorded, whole commands timed from outside.

    python bench/commands.py [--json] [-n 200] [--reps 3]

A benchmark prints figures; it asserts nothing.
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
import textwrap
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)

LOOP = textwrap.dedent("""
    import json, subprocess, sys, time
    n = int(sys.argv[1])
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["/bin/true"])
    print(json.dumps({"s": time.perf_counter() - t0}))
""")

AGENT = textwrap.dedent("""
    import subprocess
    cmds = ["git status --short", "ls -la", "grep -n def *.py", "cat a.py", "wc -l a.py",
            "sed -n 1,3p a.py", "git log --oneline", "git diff --stat", "ls src",
            "grep -rn TODO ."]
    for i in range(int(sys.argv[1])):
        subprocess.run(cmds[i % len(cmds)], shell=True, capture_output=True)
""").replace("import subprocess", "import subprocess, sys")


def _json_line(out: str) -> dict[str, Any]:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    work = Path(tempfile.mkdtemp(prefix="steno-bench-cmd-"))
    results: dict[str, Any] = {}
    try:
        (work / "loop.py").write_text(LOOP)
        (work / "effect.toml").write_text('[commands]\neffect = ["true*"]\n')
        (work / "readonly.toml").write_text('default = "allow"\n')
        modes = {"native": None, "record": "readonly.toml", "record_effect": "effect.toml"}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for rep in range(args.reps):
            for mode, policy in modes.items():
                argv = [PY, "loop.py", str(args.n)]
                if policy is not None:
                    argv = [*CLI, "record", "--store", str(work / f"s-{mode}{rep}"), "--traj",
                            "t", "--workspace", "none", "--policy", policy, "--", *argv]
                out = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                                     check=True)
                times[mode].append(_json_line(out.stdout)["s"])
        ms = {m: statistics.median(v) / args.n * 1000 for m, v in times.items()}
        results["exec"] = {"ms_per_exec": {m: round(v, 3) for m, v in ms.items()},
                           "record_vs_native": round(ms["record"] / ms["native"], 2),
                           "effect_vs_native": round(ms["record_effect"] / ms["native"], 2)}
        repo = work / "repo"
        (repo / "src").mkdir(parents=True)
        (repo / "a.py").write_text("def f():\n    return 1  # TODO\n\ndef g():\n    pass\n")
        (repo / "agent.py").write_text(AGENT)
        genv = {**env, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
                "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "1"]):
            subprocess.run(cmd, cwd=repo, env=genv, check=True)
        walls: dict[str, list[float]] = {"native": [], "record": [], "native0": [],
                                         "record0": []}
        for rep in range(args.reps):
            for mode in walls:
                argv = [PY, "agent.py", "0" if mode.endswith("0") else "50"]
                if mode.startswith("record"):
                    argv = [*CLI, "record", "-o", str(work / f"agent{rep}{mode}.steno"), "--",
                            *argv]
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=repo, env=genv, capture_output=True, check=True)
                walls[mode].append(time.perf_counter() - t0)
        w = {m: statistics.median(v) for m, v in walls.items()}
        each = {m: (w[m] - w[m + "0"]) / 50 * 1000 for m in ("native", "record")}
        results["agent_50_shellouts"] = {
            "wall_s": {m: round(v, 3) for m, v in w.items()},
            "record_vs_native": round(w["record"] / w["native"], 2),
            "ms_per_shellout": {m: round(v, 2) for m, v in each.items()},
            "shellouts_record_vs_native": round(each["record"] / each["native"], 2)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    e = results["exec"]
    print(f"exec of /bin/true: ms each: native {e['ms_per_exec']['native']}, recorded "
          f"{e['ms_per_exec']['record']} ({e['record_vs_native']}x), recorded as an effect "
          f"{e['ms_per_exec']['record_effect']} ({e['effect_vs_native']}x)")
    a = results["agent_50_shellouts"]
    print(f"50 shell-outs of a coding agent: native {a['wall_s']['native']} s, recorded "
          f"{a['wall_s']['record']} s ({a['record_vs_native']}x, CLI start-up included); "
          f"each shell-out: native {a['ms_per_shellout']['native']} ms, recorded "
          f"{a['ms_per_shellout']['record']} ms ({a['shellouts_record_vs_native']}x)")


if __name__ == "__main__":
    main()
