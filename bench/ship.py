"""Shipping into the warm tier: events/s from a store into PostgreSQL, and the lag behind
agents recording.

A store of N events (its own writer, durable) is shipped into a private PostgreSQL 15
cluster (fsync on, as a warm tier runs) by ``Shipper`` in this process: COPY into a
staging table and ``INSERT ... ON CONFLICT DO NOTHING`` per batch, the cursor in the same
transaction. The peer, in the same process against the same server: the same rows into a
table with the same columns, key and index, by psycopg's ``executemany`` of an ``INSERT
... ON CONFLICT DO NOTHING`` (pipelined), a transaction per batch: what a hand-written
shipper does. Then the lag: K agent processes append to the store through
its host recorder while ``serve --ship`` ships, sampled every 0.2 s (events committed in
the store and not yet in PostgreSQL).

    python bench/ship.py [--json] [-n 20000] [--agents 16]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.testing.postgres import cluster
from stenograph.warm import schema
from stenograph.warm.ship import Shipper, row

CLI = [sys.executable, "-m", "stenograph"]

APPENDER = """
import sys, time
from stenograph.recorder.hostclient import RemoteStore
store, traj, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with RemoteStore(store, traj=traj) as rs:
    rs.append(traj, "RunStarted", {"argv": ["bench"], "started": time.time()})
    for i in range(n):
        rs.append(traj, "Note", {"i": i, "text": "x" * 200}, durable=(i % 10 == 0))
    rs.append(traj, "RunEnded", {"status": 0})
"""


def _store(path: Path, n: int) -> None:
    with Store(path) as s:
        for t in range(8):
            s.append(f"t{t}", "RunStarted", {"argv": ["bench"], "started": 1.7e9 + t},
                     durable=False)
        for i in range(n - 8):
            s.append(f"t{i % 8}", "Note", {"i": i, "text": "x" * 300}, durable=False)
        s.flush()


def _peer(url: str, store: Path, batch: int) -> float:
    """The same rows (``warm.ship.row``) into a table with the same columns, key and index
    (not partitioned), ``executemany`` of one INSERT ... ON CONFLICT DO NOTHING each, a
    transaction per ``batch``, the cursor updated in it."""
    import datetime as dt

    import psycopg

    cols = ", ".join(schema.STAGE_COLUMNS)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE peer_events (LIKE steno_events INCLUDING DEFAULTS "
                     "INCLUDING INDEXES)")
        conn.execute("CREATE TABLE peer_cursor (id int PRIMARY KEY, lsn bigint)")
        conn.execute("INSERT INTO peer_cursor VALUES (1, 0)")
        started = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        t0 = time.perf_counter()
        rows: list[tuple[Any, ...]] = []

        def flush() -> None:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(f"INSERT INTO peer_events ({cols}) VALUES "
                                f"({', '.join(['%s'] * 6)}, %s::jsonb, %s, %s, %s) "
                                "ON CONFLICT DO NOTHING", rows)
                cur.execute("UPDATE peer_cursor SET lsn = %s WHERE id = 1", (rows[-1][3],))
            rows.clear()

        for ev in StoreReader(store).events():
            rows.append(row(ev, started, "peer"))
            if len(rows) >= batch:
                flush()
        if rows:
            flush()
        return time.perf_counter() - t0


def _lag(url: str, work: Path, agents: int, each: int) -> dict[str, Any]:
    import psycopg

    store = work / "live"
    with Store(store) as s:
        s.append("seed", "Note", {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    serve = subprocess.Popen([*CLI, "serve", str(store), "--ship", url], env=env,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    samples: list[int] = []
    try:
        while not (store / "serve.sock").exists():
            time.sleep(0.05)
        (work / "appender.py").write_text(APPENDER)
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, str(work / "appender.py"), str(store),
                                   f"a{i}", str(each)], env=env) for i in range(agents)]
        with psycopg.connect(url, autocommit=True) as conn:
            while any(p.poll() is None for p in procs):
                time.sleep(0.2)
                shipped = conn.execute("SELECT coalesce(max(lsn), 0) FROM steno_cursors "
                                       "WHERE path = %s", (str(store.resolve()),)).fetchone()
                committed = sum(1 for _ in StoreReader(store).events())
                samples.append(max(0, committed - int(shipped[0] if shipped else 0)))
            took = time.perf_counter() - t0
            total = agents * (each + 2) + 1
            while True:
                row = conn.execute("SELECT count(*) FROM steno_events").fetchone()
                if row and int(row[0]) >= total:
                    break
                time.sleep(0.05)
            caught_up = time.perf_counter() - t0 - took
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
    return {"agents": agents, "events": agents * (each + 2), "record_s": round(took, 3),
            "events_per_s": round(agents * (each + 2) / took),
            "lag_median": statistics.median(samples) if samples else 0,
            "lag_max": max(samples) if samples else 0,
            "caught_up_after_s": round(caught_up, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=20000, help="events in the shipped store")
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--each", type=int, default=500, help="events each agent appends")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steno-bench-ship-"))
    pg = Path(tempfile.mkdtemp(prefix="steno-bench-pg-"))
    try:
        store = work / "store"
        _store(store, args.n)
        with cluster(pg) as port:
            url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            with Shipper(store, url, batch=2000) as sh:
                t0 = time.perf_counter()
                got = sh.ship()
                ours = time.perf_counter() - t0
            peer = _peer(url, store, 2000)
            lag = _lag(url, work, args.agents, args.each)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pg, ignore_errors=True)
    result = {"events": got.events, "ship_s": round(ours, 3),
              "ship_events_per_s": round(got.events / ours),
              "peer_s": round(peer, 3), "peer_events_per_s": round(got.events / peer),
              "vs_peer": round(peer / ours, 2), "lag": lag}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"ship {got.events} events: {result['ship_events_per_s']}/s (COPY + ON CONFLICT) "
          f"against {result['peer_events_per_s']}/s executemany INSERT ON CONFLICT: "
          f"{result['vs_peer']}x the peer")
    print(f"{lag['agents']} agents appending {lag['events']} events through the host "
          f"recorder ({lag['events_per_s']}/s) with serve --ship: lag median "
          f"{lag['lag_median']} events, max {lag['lag_max']}; all shipped "
          f"{lag['caught_up_after_s']} s after the last agent ended")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
