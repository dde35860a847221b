"""Bisect: `stenograph bisect` over 16 commits, against a plain `git bisect run` whose
test runs the agent live against the model server.

The repository is the one ``tests/agent_history.py`` describes (its recipe is imported, so
the shapes cannot drift apart): a tool-calling agent on the ``openai`` SDK, recorded at
its first commit against the loopback model server, then 15 commits, the 7th of them
cutting tool output shorter so that the request of turn 2 changes.

* stenograph: ``stenograph bisect --good FIRST --bad LAST --log run.steno`` with the
  model server stopped: both ends checked, then ``git bisect run`` of build replays.
* the peer, run by this process the same minute: in a clone of the same repository,
  ``git bisect start LAST FIRST && git bisect run python check.py``, where ``check.py``
  starts the loopback model server, runs the agent live against it and compares the
  requests the server received with those of the first commit (what a test of an
  agent does without a recording). It checks its good end (that run makes the golden
  requests) but not its bad one, which stenograph also replays. ``--latency`` delays
  each of its model replies, as a real model would; replays are served from the log.

Printed: wall time, revisions tested, seconds per revision, the ratio of the two wall
times; the least of ``--tries`` runs each. Both must name the planted commit, or the
bench says so.

    python bench/bisect_run.py [--tries 3] [--latency 0] [--json]

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from agent_history import AGENT, COMMITS, NOTES, PLANTED, SCRIPT  # noqa: E402

sys.path.remove(str(ROOT / "tests"))

PY = sys.executable
CLI = [PY, "-P", "-m", "stenograph"]
GIT = ["git", "-c", "user.name=Bench", "-c", "user.email=bench@example.com"]

CHECK = '''
import json, os, subprocess, sys
from stenograph.testing.model_server import Knobs, ModelServer
golden, script, latency = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_", "GIT_"))}
with ModelServer(script=script, knobs=Knobs(delay_ms=latency)) as srv:
    env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-bench")
    p = subprocess.run([sys.executable, "agent.py"], env=env, capture_output=True, timeout=300)
    asked = [r.json() for r in srv.requests if r.path.endswith("/chat/completions")]
if not os.path.exists(golden):
    json.dump(asked, open(golden, "w"))
sys.exit(0 if p.returncode == 0 and asked == json.load(open(golden)) else 1)
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    env.update(extra)
    return env


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def build(work: Path) -> tuple[Path, Path, list[str], str]:
    """The repository, its recording at the first commit, the shas, the planted one."""
    repo = work / "agent"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "agent.py").write_text(AGENT)
    (repo / "notes.txt").write_text(NOTES)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "a small agent on the openai SDK")
    shas = [_git(repo, "rev-parse", "HEAD")]
    log = work / "run.steno"
    with ModelServer(script=SCRIPT) as srv:
        p = subprocess.run([*CLI, "record", "-o", str(log), "--", PY, "agent.py"], cwd=repo,
                           env=_env(OPENAI_BASE_URL=srv.openai_base_url,
                                    OPENAI_API_KEY="sk-bench"),
                           capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: record failed: {p.stderr[-1000:]}")
    planted = ""
    for message, edits in COMMITS:
        for edit in edits:
            edit(repo)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", message)
        shas.append(_git(repo, "rev-parse", "HEAD"))
        planted = shas[-1] if message == PLANTED else planted
    return repo, log, shas, planted


def ours(work: Path, repo: Path, log: Path, shas: list[str]) -> tuple[float, int, str]:
    """(seconds, revisions replayed, the first bad commit it named)."""
    t0 = time.perf_counter()
    p = subprocess.run([*CLI, "bisect", "--good", shas[0], "--bad", shas[-1], "--log",
                        str(log), "--repo", str(repo), "--json"], cwd=work, env=_env(),
                       capture_output=True, text=True)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"bench: stenograph bisect failed: {p.stderr[-1000:]}")
    out = json.loads(p.stdout)
    return took, len(out["steps"]), out["first_bad"]["sha"]


def peer(work: Path, repo: Path, shas: list[str], latency: int) -> tuple[float, int, str]:
    """The same range with git bisect run and a live check; the golden requests are made
    at the first commit (counted: the peer needs them as stenograph needs its log)."""
    clone = work / "peer"
    shutil.rmtree(clone, ignore_errors=True)
    check, golden = work / "check.py", work / "golden.json"
    check.write_text(CHECK)
    golden.unlink(missing_ok=True)
    args = [PY, str(check), str(golden), json.dumps(SCRIPT), str(latency)]
    t0 = time.perf_counter()
    _git(work, "clone", "-q", "--shared", str(repo), str(clone))
    _git(clone, "checkout", "-q", "--detach", shas[0])
    subprocess.run(args, cwd=clone, env=_env(), check=True)
    _git(clone, "bisect", "start", shas[-1], shas[0])
    run = subprocess.run([*GIT, "bisect", "run", *args], cwd=clone, env=_env(LC_ALL="C"),
                         capture_output=True, text=True)
    took = time.perf_counter() - t0
    first = _git(clone, "rev-parse", "refs/bisect/bad")
    steps = sum(ln.startswith("running ") for ln in run.stdout.splitlines())
    return took, 1 + steps, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--latency", type=int, default=0, help="ms per live model reply (peer)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steno-bench-bisect-"))
    try:
        repo, log, shas, planted = build(work)
        subjects = dict(zip(shas, ["a small agent on the openai SDK"]
                            + [m for m, _ in COMMITS], strict=True))
        rows: dict[str, Any] = {}
        for name in ("stenograph", "peer"):
            runs = [ours(work, repo, log, shas) if name == "stenograph"
                    else peer(work, repo, shas, args.latency) for _ in range(args.tries)]
            best = min(runs)
            rows[name] = {"seconds": round(best[0], 3), "revisions": best[1],
                          "seconds_per_revision": round(best[0] / best[1], 3),
                          "found_planted": all(r[2] == planted for r in runs),
                          "named": sorted({subjects[r[2]] for r in runs})}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = round(rows["stenograph"]["seconds"] / rows["peer"]["seconds"], 3)
    if args.json:
        print(json.dumps({"commits": len(shas), "latency_ms": args.latency, **rows,
                          "ratio": ratio}))
        return
    print(f"bisect over {len(shas)} commits (peer's model latency {args.latency} ms; "
          f"least of {args.tries})")
    print(f"{'':12} {'wall s':>8} {'revisions':>10} {'s/revision':>11}  found")
    for name, r in rows.items():
        print(f"{name:12} {r['seconds']:>8.3f} {r['revisions']:>10} "
              f"{r['seconds_per_revision']:>11.3f}  "
              + ("yes" if r["found_planted"] else f"NO: {', '.join(r['named'])}"))
    print(f"stenograph / peer: {ratio:.3f}")


if __name__ == "__main__":
    main()
