"""``stenograph bisect``: the first commit of the agent's repository whose build replay of
recorded runs fails.

Why a command, and not ``git bisect run stenograph replay --build``: a build replay judges
the code it is shown, and the recorded command names the files of the user's checkout,
which the sealed replay shows as they were recorded. So each revision is checked out
somewhere else, the command is pointed at that copy, the revision's package is installed
where its metadata and entry points are found, and a replay that could not judge (a log
it refuses, a crash, a time-out) is told apart from one that diverged: ``git bisect run``
would take any non-zero exit for "bad".

Where the revisions are checked out: a private ``git clone --shared`` in a temporary
directory, not a linked worktree. Both leave the user's HEAD, index and bisect state
alone (a worktree has its own HEAD and ``refs/bisect``), but a linked worktree writes
into the user's repository (an entry under ``.git/worktrees`` for the whole run, left
stale if the process is killed, and ``git bisect start`` there creates the common
``packed-refs``), and its checkouts run the user's hooks. The shared clone only reads
the user's objects; removing one directory undoes it.

The pieces: here, the checks (one ``BadInput`` line before anything is made) and the
report; ``ci/bisect_step.py``'s ``Plan``, what a step needs, written as JSON for the step
process ``git bisect run`` starts (``python -P -m stenograph.ci.bisect_step PLAN``), and
``judge``, one revision's verdict; ``ci/bisect.py``, both ends checked, then ``git
bisect run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import click

from stenograph.ci.bisect import bisect as run_bisect
from stenograph.ci.bisect_step import (
    Plan,
    base_interpreter,
    git,
    recorded_run,
    resolve,
    tracked_args,
    work_tree,
)
from stenograph.errors import BadInput
from stenograph.runner.buildcode import inside

# -- the command -------------------------------------------------------------------


@contextlib.contextmanager
def _term_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the clean-up in ``finally`` runs for both."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _short(value: Any, width: int = 160) -> str:
    s = json.dumps(value, ensure_ascii=False, default=str)
    return s if len(s) <= width else s[: width - 3] + "..."


def _progress(n: int, res: dict[str, Any], role: str = "") -> None:
    line = f"step {n}: {res['sha'][:10]} {res['verdict']} ({res['seconds']:.1f} s)"
    if role:
        line += f" [{role}]"
    if res.get("reason"):
        line += f": {res['reason']}"
    click.echo(line, err=True)


def _divergence_lines(d: dict[str, Any], log: str) -> list[str]:
    turn = d.get("turn")
    where = f"turn {turn}" if turn else "before the first turn"
    lines = [f"  {os.path.basename(log)}: {where}, {d.get('channel')}: {d.get('call')} "
             f"({d.get('kind')})"]
    for c in d.get("diff") or []:
        rec, asked = c.get("recorded"), c.get("asked")
        lines.append(f"    {c.get('path')}:")
        if isinstance(rec, str) and isinstance(asked, str) and rec != asked:
            at = next((i for i, (a, b) in enumerate(zip(rec, asked, strict=False))
                       if a != b),
                      min(len(rec), len(asked)))
            lines[-1] += f" (first difference at character {at})"
            rec, asked = _around(rec, at), _around(asked, at)
        else:
            rec, asked = _short(rec), _short(asked)
        lines.append(f"      recorded {rec}")
        lines.append(f"      asked    {asked}")
    return lines


def _around(text: str, at: int, before: int = 40, after: int = 80) -> str:
    """The part of a long string where it starts to differ, with its length: two
    prompts that share their first kilobyte differ somewhere the eye cannot find."""
    start = max(0, at - before)
    piece = json.dumps(text[start:at + after], ensure_ascii=False)
    return (("..." if start else "") + piece + ("..." if at + after < len(text) else "")
            + f" ({len(text)} chars)")


@click.command("bisect")
@click.option("--good", required=True, metavar="REV",
              help="A revision whose build replay of the logs matches (e.g. where they "
              "were recorded).")
@click.option("--bad", required=True, metavar="REV", help="A later revision that fails.")
@click.option("--log", "logs", multiple=True, required=True, metavar="FILE",
              help="A recorded run (.steno) to replay at each revision (repeatable: a "
              "revision is bad if any of them diverges).")
@click.option("--repo", default=".", show_default=True, metavar="DIR",
              help="The git work tree of the agent's code (only read, never changed).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              metavar="SECONDS", help="A replay (or install) taking longer is stopped and "
              "its revision skipped.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def bisect(good: str, bad: str, logs: tuple[str, ...], repo: str, as_json: bool,
           timeout: float, cmd: tuple[str, ...]) -> None:
    """Find the first commit of the agent's repository whose build replay fails.

    Between --good and --bad, git bisect picks revisions; each is checked out into a
    private clone (your checkout, index, HEAD and bisect state are never touched) and
    judged by `stenograph replay --build` of every --log: the recorded command (or CMD)
    runs with the repository's files it names taken from that revision, the clone first
    on PYTHONPATH, every other recorded file as recorded, model replies served from the
    log. A revision is bad if the requests it makes differ from the recorded ones (or
    its exit status does). A revision with packaging (pyproject.toml, setup.py,
    setup.cfg) is installed into a private venv whenever those files change. A replay
    that cannot judge a revision (refused, crashed, out of time) makes git skip it.
    `-- CMD` replaces the recorded command (its paths in the repository are taken from
    each revision too). A recording made outside the repository (a deployment copy)
    has its working directory taken as the repository's top: the files the command
    names there come from each revision.

    \b
    Example (recorded at v1.4; the steps go to stderr, the verdict to stdout):
      stenograph record -o run.steno -- python agent.py
      stenograph bisect --good v1.4 --bad main --log run.steno
    \b
      step 1: 875c331b04 bad (0.8 s) [--bad]
      step 2: 893fe010bb good (1.0 s) [--good]
      step 3: 0b260d2fca good (1.1 s)
      step 4: b29e0f5a35 bad (0.9 s)
      step 5: 9b40df48ff bad (0.8 s)
      first bad commit: 9b40df48ff7d6b3f6ab00284079860093c66855a cut tool output to 200
        run.steno: turn 2, model: model #1 POST http://127.0.0.1:8000/v1/chat/completions (changed)
          body $.messages[3].content: (first difference at character 200)
            recorded ..." 3: the agent keeps careful notes about step 3.\\nnote"... (628 chars)
            asked    ..." 3: the agent keeps careful notes about " (200 chars)
      5 revisions replayed (3 by git bisect) in 4.6 s

    \b
    Exit codes: 0 the first bad commit was found; 2 bad input (not a git work tree,
    an unknown revision, --good not an ancestor of --bad, a log that is missing or not
    a recorded run), --bad does not fail, --good fails too, or skipped revisions leave
    the first bad commit undecided; 3 a corrupt log; 130 interrupted.
    """
    top = work_tree(repo)
    good_sha = resolve(top, good, "--good")
    bad_sha = resolve(top, bad, "--bad")
    if good_sha == bad_sha:
        raise BadInput("--good and --bad are the same commit", good_sha[:12])
    if git(top, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False).returncode:
        raise BadInput(f"--good {good} is not an ancestor of --bad {bad}")
    runs = [recorded_run(log) for log in logs]
    for run in runs:
        run.mapped = tracked_args(top, list(cmd) or run.argv, run.cwd, (good_sha, bad_sha))
        if run.cwd is not None and inside(run.cwd, top) is None and not run.mapped and (
                not cmd):
            click.echo(f"stenograph: note: {os.path.basename(run.log)} was recorded in "
                       f"{run.cwd}, outside {top}, and its command names no file of the "
                       "repository: only PYTHONPATH points it at each revision", err=True)
    with _term_as_interrupt():
        tmp = tempfile.mkdtemp(prefix="steno-bisect-")
        try:
            plan = Plan(repo=top, work=os.path.join(tmp, "src"), tmp=tmp, runs=runs,
                        cmd=list(cmd) or None, timeout=timeout,
                        base_python=base_interpreter(list(cmd) or runs[0].argv, runs[0]))
            out = run_bisect(plan, good_sha, bad_sha, _progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _print(out, as_json)
    if out["first_bad"] is None:
        sys.exit(BadInput.exit_code)


def _print(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        steps = [{k: v for k, v in s.items() if k in ("sha", "verdict", "seconds", "role",
                                                       "reason", "log")} for s in out["steps"]]
        click.echo(json.dumps({**out, "steps": steps}, sort_keys=True, default=str))
        return
    n = len(out["steps"])
    by_git = sum(s.get("role") == "bisect" for s in out["steps"])
    summary = f"{n} revisions replayed ({by_git} by git bisect) in {out['seconds']:.1f} s"
    if out["first_bad"] is None:
        click.echo("the first bad commit is one of these (the others could not be judged):")
        for c in out.get("candidates", []):
            why = f": {c['reason']}" if c.get("reason") else ""
            click.echo(f"  {c['sha']} {c['subject']}{why}")
        click.echo(summary)
        return
    fb = out["first_bad"]
    click.echo(f"first bad commit: {fb['sha']} {fb['subject']}")
    if out.get("divergence"):
        for line in _divergence_lines(out["divergence"], out["log"] or ""):
            click.echo(line)
    skipped = [s for s in out["steps"] if s["verdict"] == "skip"]
    for s in skipped:
        click.echo(f"  skipped {s['sha'][:12]}: {s.get('reason')}")
    click.echo(summary)

