"""The toolbox sweep's table (issue "A coding agent's everyday tools replay"): for each
tool in ``tests/toolbox_cases.py``, its native wall time, record/native, replay/record
(the median of the replays), how many replays were bit-identical, and the reason when
not. The peer each ratio is against is the same command run natively in this process's
machine a moment before. ``STENO_TOOLBOX_REPLAYS`` (default 3), ``--only NAME,...``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pytest
from toolbox_cases import CASES, missing, run_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--json", action="store_true", help="one JSON object per case")
    args = ap.parse_args()
    replays = int(os.environ.get("STENO_TOOLBOX_REPLAYS", "3"))
    only = set(args.only.split(",")) if args.only else None
    print(f"{'tool':26} {'native s':>8} {'rec/nat':>7} {'rep/rec':>7} {'identical':>9}  reason")
    for case in CASES:
        if only and case.name not in only:
            continue
        why = missing(case)
        if why:
            print(f"{case.name:26} {'-':>8} {'-':>7} {'-':>7} {'skipped':>9}  {why}")
            continue
        with tempfile.TemporaryDirectory(prefix="toolbox-") as d:
            try:
                o = run_case(case, Path(d), replays)
            except pytest.skip.Exception as exc:
                print(f"{case.name:26} {'-':>8} {'-':>7} {'-':>7} {'skipped':>9}  {exc}")
                continue
        if args.json:
            print(json.dumps(o.__dict__ | {"outputs": None}))
            continue
        ratio = o.record_s / o.native_s if o.native_s else 0.0
        rr = o.replay_s / o.record_s if o.record_s else 0.0
        print(f"{case.name:26} {o.native_s:8.2f} {ratio:7.2f} {rr:7.2f} "
              f"{o.identical:>4}/{o.replays:<4}  {(case.known or o.reason)[:120]}",
              flush=True)


if __name__ == "__main__":
    main()
