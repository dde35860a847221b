"""Every payment exactly once, through every way out, across crashes (``ways_out.py``
says how a trial goes). ``make test`` runs a few trials of each way; ``make soak`` runs
``STENO_WAYS_TRIALS`` of each (``STENO_WAYS`` narrows the ways). The counts of the last
soak are in ``docs/crash-and-resume.md``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from ways_out import WAYS, Trial, plan_trials, run_trial, whole_run_time

TRIALS = int(os.environ.get("STENO_WAYS_TRIALS", "1"))
CHOSEN = [w for w in os.environ.get("STENO_WAYS", ",".join(WAYS)).split(",") if w]


def _needs(way: str) -> None:
    tool = {"curl": "curl", "node": "node", "node-agent": "node", "psql": "psql",
            "go": "go"}.get(way)
    if tool and not shutil.which(tool):
        pytest.skip(f"{tool} is not installed")


@pytest.mark.parametrize("way", CHOSEN)
def test_every_payment_exactly_once_through(tmp_path: Path, way: str) -> None:
    _needs(way)
    took = whole_run_time(tmp_path / "whole", way)
    trials = plan_trials(way, TRIALS, int(os.environ.get("STENO_WAYS_SEED", "38")), took)
    for i, trial in enumerate(trials):
        run_trial(tmp_path / f"t{i}", trial)


@pytest.mark.parametrize("settle", ["none", "output"])
def test_a_static_tool_settled_done_is_not_run_again(tmp_path: Path, settle: str) -> None:
    """The Go tool killed once it paid (the service applied, the tool not yet answered):
    a person settles its exec done, with nothing or with its output, and the resume
    reaches that exec live (the cut is at its intent). It must not run: a recorder that
    let a settled exec through because its intent was known paid twice (a soak trial)."""
    _needs("go")
    run_trial(tmp_path, Trial("go", [("applied", 2)], settle))
