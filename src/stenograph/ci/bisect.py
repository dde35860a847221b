"""Bisect: both ends judged, then ``git bisect run`` in a private clone, each revision
judged by the step process (``bisect_step.py``); the first bad commit, or the commits it
could be when skipped revisions leave it undecided.

Why a private ``git clone --shared`` and not a linked worktree, and why not plain ``git
bisect run stenograph replay --build``: see ``cli/bisect.py``'s docstring.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stenograph.ci.bisect_step import Plan, git, git_env, judge, kill_group, subject
from stenograph.errors import BadInput

Progress = Callable[[int, dict[str, Any], str], None]
"""Told of each judged revision as it lands: (step number, its result, its role)."""


def bisect(plan: Plan, good_sha: str, bad_sha: str, progress: Progress) -> dict[str, Any]:
    """Both ends checked, then ``git bisect run`` in the clone; the result as JSON."""
    t0 = time.monotonic()
    git(plan.repo, "clone", "--quiet", "--shared", "--no-checkout", plan.repo, plan.work)
    plan_file = plan.save()
    steps: list[dict[str, Any]] = []
    for role, sha in (("--bad", bad_sha), ("--good", good_sha)):
        git(plan.work, "checkout", "--quiet", "--detach", sha)
        res = judge(plan)
        res["role"] = role.lstrip("-")
        steps.append(res)
        progress(len(steps), res, role)
        if res["verdict"] == "skip":
            raise BadInput(f"cannot judge the {role} revision {sha[:12]}: {res['reason']}")
        if role == "--bad" and res["verdict"] == "good":
            raise BadInput(f"the --bad revision {sha[:12]} does not fail: its build replay "
                           f"of {_names(plan)} matches; nothing to bisect")
        if role == "--good" and res["verdict"] == "bad":
            d = res["divergence"]
            raise BadInput(f"the --good revision {sha[:12]} fails too: "
                           f"{os.path.basename(res['log'])} diverges at turn {d.get('turn')}, "
                           f"{d.get('channel')}; give an older --good")
    git(plan.work, "bisect", "start", bad_sha, good_sha)
    first, candidates = _bisect_result(plan.work)
    if first is None and not candidates:  # not adjacent: git bisect has something to test
        output = _bisect_run(plan, plan_file, steps, progress)
        first, candidates = _bisect_result(plan.work)
        if first is None and not candidates:
            raise RuntimeError(f"git bisect run stopped without a result:\n{output[-2000:]}")
    by_sha = {s["sha"]: s for s in steps}
    out: dict[str, Any] = {"first_bad": None, "good": good_sha, "bad": bad_sha,
                           "steps": steps, "divergence": None, "log": None,
                           "seconds": round(time.monotonic() - t0, 3)}
    if first is not None:
        found = by_sha.get(first, {})
        out.update(first_bad={"sha": first, "subject": subject(plan.work, first)},
                   divergence=found.get("divergence"), log=found.get("log"))
    else:
        out["candidates"] = [{"sha": c, "subject": subject(plan.work, c),
                              "reason": by_sha.get(c, {}).get("reason")} for c in candidates]
    return out


def _names(plan: Plan) -> str:
    return ", ".join(os.path.basename(r.log) for r in plan.runs)


def _bisect_result(work: str) -> tuple[str | None, list[str]]:
    """(first bad commit, or None with the commits it could be) from ``git bisect log``."""
    log = git(work, "bisect", "log", check=False).stdout
    first = re.search(r"^# first bad commit: \[([0-9a-f]{40,64})\]", log, re.M)
    if first:
        return first.group(1), []
    return None, re.findall(r"^# possible first bad commit: \[([0-9a-f]{40,64})\]", log, re.M)


def _bisect_run(plan: Plan, plan_file: Path, steps: list[dict[str, Any]],
                progress: Progress) -> str:
    """``git bisect run`` with our step; each step is told as it lands. What git said is
    returned (the result itself is read from ``git bisect log``)."""
    output = Path(plan.tmp) / "bisect-run.txt"
    with open(output, "w") as sink:
        proc = subprocess.Popen(
            ["git", "bisect", "run", sys.executable, "-P", "-m", "stenograph.ci.bisect_step",
             str(plan_file)], cwd=plan.work, env=git_env(), stdin=subprocess.DEVNULL,
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        seen = 0
        try:
            while True:
                done = proc.poll() is not None
                seen = _new_steps(plan, steps, seen, progress)
                if done:
                    break
                time.sleep(0.05)
        except BaseException:
            kill_group(proc, grace=10.0)  # the step ends its replay's group first
            raise
    error = Path(plan.tmp) / "step-error.txt"
    if error.is_file():
        raise RuntimeError("a bisect step failed:\n" + error.read_text())
    return output.read_text(errors="replace")


def _new_steps(plan: Plan, steps: list[dict[str, Any]], seen: int,
               progress: Progress) -> int:
    """Keep and tell the steps the step processes have noted since the last look; a
    line still being written (no newline yet) waits for the next look."""
    if not plan.steps_file.is_file():
        return seen
    lines = plan.steps_file.read_text().split("\n")[:-1]
    for line in lines[seen:]:
        res = json.loads(line)
        res["role"] = "bisect"
        steps.append(res)
        progress(len(steps), res, "")
    return len(lines)
