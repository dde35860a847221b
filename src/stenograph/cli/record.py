"""``stenograph record``: run a program under the process tape (``runner/record.py``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import exit_code, lease_option, parse_labels, policy_options
from stenograph.recorder import keyshapes
from stenograph.recorder.inputs import output_file, traj_id
from stenograph.recorder.policy import authorizer_for
from stenograph.recorder.snapshots import Cadence
from stenograph.runner.lines import drained_line
from stenograph.runner.record import Recorded, RecordRequest, check_request
from stenograph.runner.record import record as record_run
from stenograph.runner.workspace import plan as plan_workspace


@click.command("record")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Trajectory file to write (default: <trajectory id>.steno).")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Store to record into and keep (default: .<output>.rec beside the output, "
              "removed once the .steno file is written).")
@click.option("--traj", default=None, help="Trajectory id (default: run-<time>-<pid>).")
@click.option("--asyncio/--no-asyncio", "asyncio_loop", default=True, show_default=True,
              help="Put asyncio event loops on the tape: tasks that run while hooked async "
              "requests are in flight (overlapping requests, asyncio.gather of streams, an "
              "async agent framework's graph: pydantic-ai, the OpenAI Agents SDK) replay in "
              "the recorded order. --no-asyncio keeps a hooked async call paused across its "
              "awaits instead, exact only for one request at a time per loop. The replay "
              "follows the recording.")
@click.option("--workspace", "workspaces", multiple=True, metavar="DIR",
              help="Snapshot DIR before the program starts and at checkpoints; a replay "
              "then sees DIR as it was (repeatable; default: the working directory; "
              "`--workspace none`: no snapshots).")
@click.option("--workspace-ignore", "ws_ignore", multiple=True, metavar="GLOB",
              help="Leave paths matching GLOB out of the snapshots (repeatable; like a "
              "line of a .stenoignore). Left-out paths are live at replay.")
@click.option("--workspace-secret", "ws_secret", multiple=True, metavar="GLOB",
              help="Treat files matching GLOB as secret files too: their values are masked "
              "in every snapshot (repeatable; like a `secret: GLOB` line of a .stenoignore; "
              ".env, keys and credentials files are by default, see "
              "docs/record-your-agent.md).")
@click.option("--workspace-not-secret", "ws_not_secret", multiple=True, metavar="GLOB",
              help="Files matching GLOB are not secret files (still scanned for key shapes; "
              "repeatable; like `!secret: GLOB`).")
@click.option("--workspace-max", "ws_max", metavar="FILES|SIZE|FILES:SIZE", default=None,
              help="Refuse to start when a workspace is bigger (default 100000 files, 2G).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="A checkpoint every N model turns (default: Daly's optimal interval "
              "from the measured snapshot cost and --mtbf).")
@click.option("--mtbf", type=click.FloatRange(min=0.001), default=4.0, show_default=True,
              metavar="HOURS", help="Mean time between failures the checkpoint cadence "
              "is chosen for.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="Label the run (repeatable): `--label tenant=acme --label team=payments`. "
              "Kept in its RunStarted; `status --label` and `show` show and filter by them, "
              "and `archive` partitions by tenant.")
@policy_options
@lease_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def record(output: str | None, store_dir: str | None, traj: str | None, asyncio_loop: bool,
           workspaces: tuple[str, ...], ws_ignore: tuple[str, ...], ws_secret: tuple[str, ...],
           ws_not_secret: tuple[str, ...], ws_max: str | None,
           checkpoint_every: int | None, mtbf: float, policy_file: str | None,
           budget_tokens: int | None, budget_usd: float | None, prices_file: str | None,
           lease_ttl: float, db: str | None, blobs: str | None, labels: tuple[str, ...],
           cmd: tuple[str, ...]) -> None:
    """Run CMD under the tape and record everything it reads from the world.

    The workspace (the working directory unless --workspace says otherwise) is
    snapshotted first, and again at checkpoints between model turns: a replay runs
    against the recorded files in a private mount namespace, and `stenograph checkpoint
    restore` gives the files at any turn."""
    argv = list(cmd)
    wanted_labels = parse_labels(labels)
    traj = traj_id(traj) if traj is not None else (
        f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    out = output_file(output if output else f"{traj}.steno")
    store = Path(store_dir) if store_dir else out.parent / f".{out.name}.rec"
    check_request(argv, out, store, named=bool(store_dir))
    shapes = keyshapes.for_run()
    ws = plan_workspace(workspaces, ws_ignore, ws_max, os.getcwd(),
                        exclude=[str(store), str(out)], secret=ws_secret,
                        not_secret=ws_not_secret, shapes=shapes)
    rec = record_run(RecordRequest(
        argv, traj, out, store, keep_store=bool(store_dir), asyncio=asyncio_loop,
        workspace=ws, cadence=Cadence(mtbf=mtbf * 3600, every=checkpoint_every),
        authorizer=authorizer_for(policy_file, budget_tokens, budget_usd, prices_file),
        lease_ttl=lease_ttl, shapes=shapes, db=db, blobs=blobs, labels=wanted_labels))
    if rec.held is not None and rec.held.drained:
        click.echo(drained_line(str(store), traj), err=True)
        sys.exit(0)
    if rec.held is not None:
        raise rec.held.error(str(store), traj)
    _summary(rec)
    sys.exit(exit_code(rec.result.status))


def _summary(rec: Recorded) -> None:
    say = lambda line: click.echo(f"stenograph: {line}", err=True)  # noqa: E731
    say(f"recorded {rec.traj}: exit {rec.result.status}, {rec.chunks} tape chunks from "
        f"{rec.processes} process(es), {rec.exchanges} exchanges -> {rec.out}")
    if rec.loss:
        say(f"warning: {rec.loss}")
    if rec.checkpoints:
        cp = rec.checkpoints
        say(f"workspace: {cp.taken[0].files} files in {len(cp.snap.roots)} root(s), "
            f"{len(cp.taken)} checkpoint(s){_redacted_note(cp.snap.redacted)}")
        for e in cp.errors:
            say(f"warning: {e}")
    for s in rec.stalls:
        say(f"warning: process {s.get('proc')} thread {s.get('thread')} waited past the "
            f"stall limit while thread {s.get('holder')} held the tape's scheduler without "
            "blocking (a busy-wait, or a blocking call the shim does not see): the rest of "
            f"that process ran unscheduled, and its replay will stop at turn {s.get('turn')}")


def _redacted_note(redacted: list[tuple[str, Any]]) -> str:
    """What the record's summary line says of the files stored masked."""
    files = {rel for rel, s in redacted if s.why == "file"}
    scanned = {rel: s.hits for rel, s in redacted if s.why == "content"}
    parts = []
    if files:
        parts.append(f"{len(files)} secret file(s) masked ({', '.join(sorted(files)[:3])}"
                     f"{' ...' if len(files) > 3 else ''})")
    if scanned:
        parts.append(f"{sum(scanned.values())} secret value(s) masked in {len(scanned)} "
                     "other file(s)")
    return "; " + ", ".join(parts) if parts else ""
