"""The toolbox sweep (``tests/toolbox_cases.py``): each tool recorded once and replayed,
every replay bit-identical, and what it printed under record the same as natively (its
times aside). ``make test`` runs the quick cases with 2 replays; ``make soak`` every case
with 3 (``STENO_TOOLBOX=all``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from toolbox_cases import CASES, missing, run_case

ALL = os.environ.get("STENO_TOOLBOX") == "all"
REPLAYS = 3 if ALL else 2


def _timeless(out: str) -> str:
    out = re.sub(r"\d+(\.\d+)?m?s\b", "T", out)
    out = re.sub(r"0x[0-9a-f]+", "0xADDR", out)  # addresses differ run to run natively too
    return re.sub(r"/tmp/\S+", "/tmp/X", out)


@pytest.mark.parametrize("case", [c for c in CASES if ALL or c.quick], ids=lambda c: c.name)
def test_a_tool_replays_bit_for_bit(tmp_path: Path, case) -> None:  # type: ignore[no-untyped-def]
    why = missing(case)
    if why:
        pytest.skip(why)
    o = run_case(case, tmp_path, REPLAYS)
    native, recorded = o.outputs
    assert _timeless(recorded) == _timeless(native), (o.status, o.record_err)
    if case.known:  # not yet: every replay says so, none differs silently
        assert o.identical + o.reported == o.replays == REPLAYS, o.reason
        return
    assert o.identical == o.replays == REPLAYS, o.reason
