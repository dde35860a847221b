"""The cold tier: bytes per event, archive throughput, and a question asked of 10,000 runs.

N agent-shaped runs (``stenograph.testing.runs``: model turns on the OpenAI wire format,
tool exchanges, intents, labels) are written into a store, which is copied; then:

1. Bytes: the store's frame bytes per event, against the archive's Parquet bytes per
   event (zstd; the derived columns included).
2. Archive: ``cold.archive.archive`` of every run (blobs, Parquet, read back and checked,
   committed, the store compacted): trajectories per second.
3. The question "every run where the model called `deploy` and a tool failed", asked
   of the archive's ``events`` with DuckDB, against the peer that answers it from the
   store copy: every event read back (``StoreReader``), each run's turns derived as
   ``show`` derives them. Both answers are compared.

    python bench/archive.py [--json] [--runs 10000]

A benchmark prints figures; it asserts nothing (but says if the two answers differ).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from stenograph.cold.archive import StoreSource, archive
from stenograph.cold.location import open_location
from stenograph.cold.query import run_query
from stenograph.recorder.codec import Event
from stenograph.recorder.reader import StoreReader
from stenograph.testing.runs import DEPLOY_AND_FAILED, deploy_and_failed, write_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="steno-bench-archive-"))
    try:
        store, peer = base / "store", base / "peer"
        t0 = time.perf_counter()
        events = write_runs(store, args.runs, seed=1)
        made = time.perf_counter() - t0
        frame_bytes = sum(size for _s, _o, size, item in StoreReader(store).frames()
                          if isinstance(item, Event))
        shutil.copytree(store, peer)
        loc = open_location(str(base / "archive"), create=True)
        src = StoreSource(store)
        t0 = time.perf_counter()
        try:
            r = archive(src, loc, older_than=0)
        finally:
            src.close()
        took = time.perf_counter() - t0
        run_query(loc, "SELECT 1")  # (DuckDB's import and first connection: not the scan)
        t0 = time.perf_counter()
        ans = run_query(loc, DEPLOY_AND_FAILED)
        duck = time.perf_counter() - t0
        t0 = time.perf_counter()
        want = deploy_and_failed(peer)
        scan = time.perf_counter() - t0
        got = [row[0] for row in ans.rows]
        doc: dict[str, Any] = {
            "runs": args.runs, "events": events, "made_s": round(made, 2),
            "store_bytes_per_event": round(frame_bytes / events, 1),
            "parquet_bytes_per_event": round(r.parquet_bytes / r.events, 1),
            "bytes_ratio": round(frame_bytes / r.parquet_bytes, 2),
            "archive_s": round(took, 2), "archive_runs_per_s": round(args.runs / took, 1),
            "query_duckdb_s": round(duck, 3), "query_store_scan_s": round(scan, 3),
            "query_speedup": round(scan / duck, 1), "answer_rows": len(got),
            "answers_agree": got == want,
        }
        if args.json:
            print(json.dumps(doc))
            return
        print(f"{args.runs} runs, {events} events (written in {made:.1f} s)")
        print(f"bytes/event: store {doc['store_bytes_per_event']}, Parquet "
              f"{doc['parquet_bytes_per_event']} ({doc['bytes_ratio']}x smaller)")
        print(f"archive: {took:.2f} s, {doc['archive_runs_per_s']} runs/s "
              f"({r.events / took:.0f} events/s), {len(r.batches)} batches")
        print(f"'called deploy and a tool failed' ({len(got)} runs): DuckDB over the "
              f"archive {duck * 1000:.0f} ms, the store read and derived {scan * 1000:.0f} "
              f"ms ({doc['query_speedup']}x); answers agree: {got == want}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
