"""``stenograph diff A B``: where two recordings of one task went different ways, and why."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from stenograph.cli.options import RECORDING
from stenograph.harness.divergence import analyze
from stenograph.harness.source import open_input


def _short(v: Any, width: int = 100) -> str:
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=repr)
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 1] + "…"


@click.command("diff")
@click.argument("a", type=RECORDING)
@click.argument("b", type=RECORDING)
@click.option("--traj-a", help="The trajectory of A, when A is a store holding several.")
@click.option("--traj-b", help="The trajectory of B, when B is a store holding several.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def diff(a: str, b: str, traj_a: str | None, traj_b: str | None, as_json: bool) -> None:
    """Find where two recordings of the same task diverge, and whose doing it was.

    t_div is the first turn whose chosen action (the tool calls and their arguments,
    or the answer) differs. If the model was given the same context there (same hash),
    the cause is the model: sampling, serving, a new version behind the name (the
    served versions are compared first). Otherwise each difference in the context is
    named with where it came from: a tool result whose input changed (a file its work
    read, inside the workspace or not, by the stat on the tape and the bytes a snapshot
    holds; an HTTP response) or a time or id value is the environment; a file one run's
    tool read that the other run holds no evidence of is unknown, named; the system
    prompt, the tool schemas, the message list (truncation, history) or a tool result
    that changed while every file it read is the same is the harness.

    Exits 0 when the runs chose the same actions throughout, 1 when they diverge.

    \b
    Examples:
      stenograph diff monday.steno tuesday.steno
      stenograph diff a.steno b.steno --json | jq .cause
    """
    ra, rb = open_input(a, traj_a), open_input(b, traj_b)
    d = analyze(ra.trajectory(), rb.trajectory())
    if as_json:
        click.echo(json.dumps(d.to_json(), ensure_ascii=False, default=repr))
    else:
        click.echo(d.summary)
        if d.t_div is not None:
            same = "identical" if d.context_identical else "differ"
            click.echo(f"cause: {d.cause}" + (
                "" if d.context_identical is None else
                f" (contexts at turn {d.t_div} {same})"))
        shown: tuple[Any, ...] = ()
        for x in d.differences[:20]:
            click.echo(f"  {x.path}: {x.source}")
            click.echo(f"      a: {_short(x.a)}")
            click.echo(f"      b: {_short(x.b)}")
            if x.files and x.files != shown:
                shown = x.files
                for f in [f for f in x.files if f.verdict != "same" and not any(
                        f"the file {f.file}{c}" in x.source for c in " :")][:5]:
                    click.echo(f"      {f.verdict}: {f.file}: {f.describe()}")
        if len(d.differences) > 20:
            click.echo(f"  ... {len(d.differences) - 20} more (--json has them all)")
    if d.t_div is not None:
        sys.exit(1)
