"""``stenograph status``: what a store's trajectories are doing, and their effects.

For each trajectory: its state -- ``running`` (a writer holds the store), ``ended`` (the
run ended and said so), ``crashed`` (no writer, no end), ``needs-attention`` (crashed
with an effect in doubt) -- its model turns, the lease epoch and holder, and every
effect as ``settled`` or ``in-doubt`` (``recorder/effects.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from stenograph.cli_checks import traj_id
from stenograph.recorder.effects import TrajectoryState, fold
from stenograph.recorder.errors import BadInput
from stenograph.recorder.reader import StoreReader


def _writer_alive(store: Path) -> bool:
    """Whether some process holds the store's lock now."""
    import fcntl

    try:
        fd = os.open(store / "LOCK", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def states(store: Path, traj: str | None = None) -> list[TrajectoryState]:
    if not (store / "wal").is_dir():
        raise BadInput("not a store (no wal/ directory)", str(store))
    reader = StoreReader(store)
    alive = _writer_alive(store)
    by_traj: dict[str, list] = {}
    for ev in reader.events(traj=traj):
        by_traj.setdefault(ev.traj, []).append(ev)
    if traj is not None and traj not in by_traj:
        raise BadInput(f"no trajectory {traj!r} in the store", str(store))
    return [fold(t, evs, writer_alive=alive) for t, evs in sorted(by_traj.items())]


@click.command("status")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("traj", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per trajectory, with an `effects` list.")
def status(store: Path, traj: str | None, as_json: bool) -> None:
    """The state of each trajectory in STORE (or of TRAJ), and of its effects."""
    if traj is not None:
        traj_id(traj)
    for st in states(store, traj):
        if as_json:
            click.echo(json.dumps(st.to_json(), sort_keys=True))
            continue
        doubt = sum(e.state == "in-doubt" for e in st.effects)
        click.echo(f"{st.traj}  {st.state}  turns {st.turns}  epoch {st.epoch}  "
                   f"effects {len(st.effects)} ({doubt} in doubt)")
        for e in st.effects:
            click.echo(f"    {e.call_id:<16} {e.state:<9} {e.target}"
                       + (f"  key {e.idempotency_key}" if e.idempotency_key else ""))
