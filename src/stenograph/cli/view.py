"""``stenograph view``: a recording (or two, compared) as one static HTML page.

The page is a file a person opens in a browser or attaches to a bug: no server, no
network. The work is in ``harness.viewer`` (pure: trajectories in, text out); this
command reads the inputs, checks the output before anything is written, and writes
the page atomically, so a failed or interrupted run never leaves half a page.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import RECORDING
from stenograph.harness.source import Recording, open_input
from stenograph.harness.viewer import DEFAULT_PAGE_SIZE, Run, page_count, render
from stenograph.recorder.errors import BadInput
from stenograph.recorder.inputs import output_file


@click.command("view")
@click.argument("file", type=RECORDING)
@click.option("-o", "--output", required=True, metavar="PAGE.html",
              help="The page to write (replaced atomically if it exists).")
@click.option("--diff", "other", metavar="OTHER",
              help="A second recording: both runs side by side, turn N beside turn N, "
              "the turn where they diverge marked and its cause in a banner.")
@click.option("--traj", help="The trajectory of FILE, when it is a store holding several.")
@click.option("--other-traj", help="The trajectory of OTHER, when it is such a store.")
@click.option("--page-size", type=click.IntRange(min=1), default=DEFAULT_PAGE_SIZE,
              show_default=True, metavar="N", help="Turns per page; the page shows one "
              "page of turns at a time, with links to the others.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {path, turns, bytes, pages} as one JSON object on stdout.")
def view(file: str, output: str, other: str | None, traj: str | None,
         other_traj: str | None, page_size: int, as_json: bool) -> None:
    """Write a recording as one self-contained HTML page to look at in a browser.

    The page has the run's header (trajectory, file, turns, tokens, exit status, the
    recording it was forked from), a chart of tokens per turn, and one card per model
    turn: the model, its tokens, the action it chose, the calls and effects the program
    made with their state, approvals and checkpoints. Open a card for the turn's
    context (every message the model was given, the tools offered), the reply and the
    tool results. No server and no network: inline CSS and script only. A link to
    `#turn-N` opens turn N; `#page=K` shows page K.

    \b
    Examples:
      stenograph view run.steno -o run.html
      stenograph view run.steno --diff rerun.steno -o diff.html
      stenograph view big.steno -o big.html --page-size 100 --json
    """
    t0 = time.monotonic()
    inputs = [file, *([other] if other else [])]
    out = output_file(output, inputs=tuple(Path(p) for p in inputs))
    a = open_input(file, traj)
    b = open_input(other, other_traj) if other is not None else None
    runs = [_run(a), *([_run(b)] if b is not None else [])]
    divergence = _analyze(runs[0], runs[1]) if len(runs) > 1 else None
    page = render(runs[0], other=runs[1] if len(runs) > 1 else None, divergence=divergence,
                  page_size=page_size)
    data = page.encode("utf-8")
    write_atomic(out, data)
    turns = max(len(r.trajectory.turns) for r in runs)
    pages = page_count(turns, page_size)
    click.echo(f"stenograph: view: {out}: {turns} turn(s), {len(data):,} bytes, "
               f"{pages} page(s), {time.monotonic() - t0:.2f} s", err=True)
    if as_json:
        click.echo(json.dumps({"path": str(out), "turns": turns, "bytes": len(data),
                               "pages": pages}))


def _run(rec: Recording) -> Run:
    return Run(rec.trajectory(), rec.path, rec.parent)


def _analyze(a: Run, b: Run) -> dict[str, Any]:
    try:
        from stenograph.harness.divergence import analyze
    except ImportError as exc:  # a build without the divergence analysis
        raise BadInput(f"--diff needs stenograph.harness.divergence ({exc})") from None
    return analyze(a.trajectory, b.trajectory).to_json()


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``: a
    reader sees the old page or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                               dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
