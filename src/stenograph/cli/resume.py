"""``stenograph resume STORE TRAJ``: a crashed run, replayed up to its crash, then live
(``runner/resume.py``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import exit_code, lease_option, policy_options
from stenograph.recorder.errors import BadInput, NeedsPerson, ReplayDiverged
from stenograph.recorder.inputs import traj_id
from stenograph.recorder.policy import authorizer_for
from stenograph.runner.lines import drained_line, needs_person_line
from stenograph.runner.resume import ResumeRequest
from stenograph.runner.resume import resume as resume_run
from stenograph.runner.session import Held


@click.command("resume")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("traj", required=False)
@click.option("--any", "pick_any", is_flag=True, help="With --db, no TRAJ: every trajectory "
              "not ended whose lease no worker holds (a `stenograph drain` released it, or "
              "its worker died and the lease ran out), each resumed into STORE by a worker "
              "of its own (a trajectory another host took first is left to it).")
@click.option("--settle-http", type=click.Choice(["reissue", "escalate"]), default="reissue",
              show_default=True, help="An HTTP effect left in doubt: send it again with its "
              "recorded Idempotency-Key (reissue), or stop for a person (escalate, exit 4).")
@click.option("--escalate", "escalate", multiple=True, metavar="URL_REGEX",
              help="HTTP effects to URLs matching this are escalated whatever --settle-http "
              "says: services known to ignore idempotency keys (repeatable).")
@click.option("--drift", type=click.Choice(["pin", "cross", "refuse"]), default="cross",
              show_default=True, help="When a live model call differs from the recording's "
              "last one (the model that answers, the model asked for, tool schemas, the "
              "system prompt): note it as a Drift event and go on (cross), ask for the "
              "recorded model (pin), or stop (refuse, exit 6). A changed schema of a tool "
              "with an effect in doubt always stops.")
@click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
@policy_options
@lease_option
def resume(store: Path, traj: str | None, pick_any: bool, settle_http: str,
           escalate: tuple[str, ...], drift: str, as_json: bool, policy_file: str | None,
           budget_tokens: int | None,
           budget_usd: float | None, prices_file: str | None, lease_ttl: float,
           db: str | None, blobs: str | None) -> None:
    """Resume TRAJ in STORE: replay what it recorded up to the crash, then go on live.

    Nothing recorded is done twice: model replies and tool results come from the log;
    an effect whose intent is durable but whose result is not is settled first (sent
    again with its recorded idempotency key, its tool's probe asked, or left to a
    person: exit 4 and `stenograph settle`). Crash and resume any number of times.
    Exits with the program's status once it ran to its end.

    On another host: `stenograph resume STORE TRAJ --db URL [--blobs s3://...]` takes the
    trajectory's lease in the warm tier (its epoch + 1, once the old worker's ran out),
    brings its shipped events and blobs into STORE, and resumes it here; the old worker,
    if it comes back, is fenced (exit 8)."""
    if pick_any:
        _resume_any(store, traj, db, blobs, lease_ttl)
        return
    if traj is None:
        raise BadInput("resume needs TRAJ (or --any with --db)", str(store))
    traj_id(traj)
    patterns = []
    for p in escalate:
        try:
            patterns.append(re.compile(p))
        except re.error as exc:
            raise BadInput(f"--escalate: not a regular expression: {exc}", p) from None
    out = resume_run(ResumeRequest(
        store, traj, settle_http=settle_http, escalate=patterns, drift=drift,
        authorizer=authorizer_for(policy_file, budget_tokens, budget_usd, prices_file),
        lease_ttl=lease_ttl, db=db, blobs=blobs))
    if as_json:
        click.echo(json.dumps(out, sort_keys=True, default=str))
    if not out["resumed"]:
        click.echo(f"stenograph: {traj} already ended (exit {out['exit_status']}); nothing "
                   "to resume", err=True)
        return
    _finish(store, traj, out)


def _resume_any(store: Path, traj: str | None, db: str | None, blobs: str | None,
                lease_ttl: float) -> None:
    """``--any``: a worker per released or orphaned trajectory (this command started again with the
    trajectory named), all at once; exits 0 when each ended, held or drained again, else
    with the first other status."""
    import os
    import subprocess

    from stenograph.warm.leases import released

    if traj is not None or db is None:
        raise BadInput("--any takes no TRAJ and needs --db", str(store))
    trajs = released(db)
    if not trajs:
        click.echo("stenograph: no released trajectory to take", err=True)
        return
    from stenograph.recorder.reader import is_store
    from stenograph.recorder.store import init_store

    if not is_store(store):  # once, before its workers bring their trajectories in
        init_store(store)
    extra = [*(["--blobs", blobs] if blobs else []), "--lease-ttl", str(lease_ttl)]
    procs = {t: subprocess.Popen([sys.executable, "-m", "stenograph", "resume", str(store), t,
                                  "--db", db, *extra], env=os.environ.copy())
             for t in trajs}
    codes = {t: p.wait() for t, p in procs.items()}
    took = [t for t, c in codes.items() if c in (0, 5, 6)]
    left = [t for t, c in codes.items() if c == 2]  # held: another host took it first
    click.echo(f"stenograph: --any: {len(took)} of {len(trajs)} released trajectories "
               f"resumed here" + (f"; {len(left)} taken elsewhere first" if left else ""),
               err=True)
    bad = [c for c in codes.values() if c not in (0, 2, 5, 6)]
    if bad:
        sys.exit(bad[0])


def _finish(store: Path, traj: str, out: dict[str, Any]) -> None:
    if out.get("refused"):
        click.echo(f"stenograph: note: the resumed prefix's connections to peers outside the "
                   f"run were refused, not made again ({len(out['refused'])}: "
                   f"{'; '.join(out['refused'][:3])}{' ...' if len(out['refused']) > 3 else ''}"
                   f"); the program saw them fail", err=True)
    if out.get("set_aside"):
        paths = out["set_aside"]["paths"]
        click.echo(f"stenograph: set aside {len(paths)} file(s) the resumed run replaced "
                   f"(changed since the crash): {', '.join(paths[:5])}"
                   f"{' ...' if len(paths) > 5 else ''} -> {out['set_aside']['dir']}",
                   err=True)
    if out.get("drained"):
        click.echo(drained_line(str(store), traj), err=True)
        sys.exit(0)
    if "attention" in out:
        raise NeedsPerson(needs_person_line(str(store), traj, out["attention"]["line"]))
    if "paused" in out or "stopped" in out:
        raise Held(out.get("paused"), out.get("paused_call", {}), out.get("stopped"),
                   out.get("stopped_at", {})).error(str(store), traj)
    if "divergences" in out:
        for d in out["divergences"][:5]:
            if d.get("detail"):  # a Python hook's call: its report is the diff
                continue  # (the program printed it already)
            click.echo(f"stenograph: divergence: process {d['proc']} thread {d['thread']} "
                       f"channel {d['channel']} position {d['position']}: recorded "
                       f"{d['recorded']}, asked {d['asked']}", err=True)
        raise ReplayDiverged("the resumed prefix diverged from the recording: nothing past "
                             "it was run", traj)
    click.echo(f"stenograph: resumed {traj} at epoch {out['epoch']}: the recorded prefix "
               f"replayed, then live; {len(out['in_doubt'])} effect(s) were in doubt; "
               f"exit {out['status']}", err=True)
    sys.exit(exit_code(out["status"]))
