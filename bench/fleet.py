"""Moving a trajectory between hosts, and `status --db` over a fleet's trajectories.

1. Move: a trajectory of N events is shipped into a private PostgreSQL 15 cluster, then
   brought into a fresh store as ``resume --db`` brings it (``warm.fetch``: the rows in
   ``seq`` order, each hash checked, then appended and flushed). The peer, in this
   process against the same server: the same rows' bytes read by ``COPY ... TO STDOUT``
   and written to one file with one ``fsync`` -- the least a move has to do.
2. Status: 10,000 trajectories (a run, an intent and its exchange each) shipped, then
   ``fleet_status`` (what ``status --db`` prints: effects in doubt, approvals waiting,
   the lease) against the peer ``SELECT * FROM steno_trajectories``.

    python bench/fleet.py [--json] [--sizes 1000,10000,50000] [--trajectories 10000]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.store import Store
from stenograph.testing.postgres import cluster
from stenograph.warm.fetch import fetch_trajectory
from stenograph.warm.ship import Shipper
from stenograph.warm.status import fleet_status


def _one(path: Path, traj: str, n: int) -> None:
    with Store(path) as s:
        s.append(traj, "RunStarted", {"argv": ["bench"], "started": 1.7e9}, durable=False)
        for i in range(n - 1):
            s.append(traj, "Note", {"i": i, "text": "x" * 300}, durable=False)
        s.flush()


def _many(path: Path, k: int) -> None:
    with Store(path) as s:
        for t in range(k):
            traj = f"f{t}"
            s.append(traj, "RunStarted", {"argv": ["bench"], "started": 1.7e9 + t},
                     durable=False)
            s.append(traj, "ToolIntent", {"call_id": "0/http/1", "channel": "net",
                                          "target": "POST http://x/pay"}, durable=False)
            if t % 10:  # one in ten left in doubt
                s.append(traj, "Exchange", {"proc": "0", "channel": "http", "pos": 1},
                         durable=False)
        s.flush()


def _peer_move(url: str, traj: str, out: Path) -> float:
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn, open(out, "wb") as f:
        with conn.cursor().copy("COPY (SELECT raw FROM steno_events WHERE trajectory_id = "
                                f"'{traj}' ORDER BY seq) TO STDOUT") as cp:
            for block in cp:
                f.write(block)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--trajectories", type=int, default=10000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="steno-bench-fleet-"))
    pg = Path(tempfile.mkdtemp(prefix="steno-bench-pg-"))
    moves: list[dict[str, Any]] = []
    try:
        with cluster(pg) as port:
            url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            for n in (int(x) for x in args.sizes.split(",")):
                a, b, traj = work / f"a{n}", work / f"b{n}", f"move{n}"
                _one(a, traj, n)
                with Shipper(a, url) as sh:
                    sh.ship()
                t0 = time.perf_counter()
                blobs = BlobStore(b / "blobs")
                got = fetch_trajectory(url, traj, blobs)
                with Store(b) as s:
                    got.write(s, traj, blobs)
                ours = time.perf_counter() - t0
                peer = _peer_move(url, traj, work / f"peer{n}")
                moves.append({"events": n, "bytes": sum(len(d) for _, d in got.events),
                              "move_s": round(ours, 3), "peer_s": round(peer, 3),
                              "vs_peer": round(ours / peer, 2)})
            many = work / "many"
            _many(many, args.trajectories)
            with Shipper(many, url) as sh:
                sh.ship()
            t0 = time.perf_counter()
            rows = fleet_status(url)
            status_s = time.perf_counter() - t0
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                t0 = time.perf_counter()
                conn.execute("SELECT * FROM steno_trajectories").fetchall()
                peer_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pg, ignore_errors=True)
    result = {"moves": moves, "status": {"trajectories": len(rows),
                                         "status_s": round(status_s, 3),
                                         "peer_s": round(peer_s, 4),
                                         "vs_peer": round(status_s / peer_s, 1)}}
    if args.json:
        print(json.dumps(result))
        return 0
    for m in moves:
        print(f"move a trajectory of {m['events']} events ({m['bytes'] >> 10} KiB) from the "
              f"warm tier into a store: {m['move_s']} s; COPY of its rows to one fsynced "
              f"file: {m['peer_s']} s ({m['vs_peer']}x the peer)")
    st = result["status"]
    print(f"status --db over {st['trajectories']} trajectories: {st['status_s']} s; "
          f"SELECT * FROM steno_trajectories: {st['peer_s']} s ({st['vs_peer']}x the peer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
