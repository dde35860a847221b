"""Many agent processes, one host: durable appends through the host recorder against the
same processes each committing to SQLite, and against DBOS steps on PostgreSQL.

What is measured, per process count (1, 16, 64, 256 by default):

* **host recorder**: N separate Python processes, each a ``RemoteStore`` of one store
  served by ``stenograph serve STORE`` (its own trajectory, as a recording is), each
  appending durable events (``append(..., durable=True)``: the answer comes after the
  fdatasync that covers it). One group commit covers every process's events.
* **sqlite**: the same N processes, each with its own connection to one database file,
  ``journal_mode=WAL``, ``synchronous=FULL``, one ``BEGIN IMMEDIATE; INSERT; COMMIT``
  per event (a ``busy_timeout`` lets writers queue for the lock, as real ones do).
* **dbos** (when ``dbos`` is installed and PostgreSQL 15 is on the machine): N
  processes, each one DBOS workflow running steps in a loop, its system database on a
  private PostgreSQL cluster started here (``fsync=on``, ``synchronous_commit=on``).
  A step's checkpoint is DBOS's durable write, the nearest thing to an intent. Up to 64
  processes: each DBOS process holds ~100 MB and a connection pool.

The body of every event is ~1.3 KiB (the size of a tool call's intent with its
arguments). Each process first does one untimed append (connects, creates its
trajectory or row), says it is ready, and waits; all are told to go at once and run
for a fixed time. Throughput is events over the wall time; latency is per call, p50
and p99 over all calls of all processes.

A benchmark, not a test: it prints figures and the ratios, and asserts nothing about
speed. ``--quick`` runs 1 and 16 processes for 2 s each; ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stenograph.testing import postgres as pg

HERE = Path(__file__).resolve().parent
PY = sys.executable
BODY_CHARS = 1300
DBOS_MAX = 64

PRODUCER = r"""
import json, sys, time
mode, where, i, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
body = {"text": "x" * BODY_CHARS}
def timed(append):  # one untimed call, ready, wait for go; then each call's seconds
    append(0)
    print("ready", flush=True)
    sys.stdin.readline()
    lat, end = [], time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        append(len(lat) + 1)
        lat.append(time.perf_counter() - t0)
    return lat
if mode == "host":
    from stenograph.recorder.hostclient import RemoteStore
    store = RemoteStore(where, traj=f"agent-{i}")
    def append(n):
        store.append(f"agent-{i}", "Note", body)
elif mode == "sqlite":
    import sqlite3, msgpack
    db = sqlite3.connect(where, isolation_level=None, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    packed = msgpack.packb(body)
    def append(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO events(traj, seq, body) VALUES (?, ?, ?)", (i, n, packed))
        db.execute("COMMIT")
else:
    import logging, os
    os.environ["DBOS__VMID"] = f"bench-{i}"  # each process its own executor (no recovery)
    from dbos import DBOS
    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(config={"name": "steno-bench", "application_version": "1",
                 "system_database_url": where, "run_admin_server": False,
                 "log_level": "WARNING"})
    @DBOS.step()
    def note(n):
        return body["text"][:8] + str(n)
    lat = []
    @DBOS.workflow()
    def agent(seconds):
        lat.extend(timed(note))
    DBOS.launch()
    agent(seconds)
    print(json.dumps(lat), flush=True)
    DBOS.destroy()
    sys.exit(0)
print(json.dumps(timed(append)), flush=True)
""".replace("BODY_CHARS", str(BODY_CHARS))


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, round(q * len(xs)) - 1))]


def run_producers(mode: str, where: str, n: int, seconds: float) -> dict[str, float]:
    """N producer processes, released together; their figures, pooled."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    procs = [subprocess.Popen([PY, "-c", PRODUCER, mode, where, str(i), str(seconds)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for i in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{mode} producer did not start: {line!r}")
        t0 = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        lats: list[float] = []
        for p in procs:
            assert p.stdout is not None
            lats += json.loads(p.stdout.readline())
        elapsed = time.perf_counter() - t0
    finally:
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=60)
            if p.poll() is None:
                p.kill()
    lats.sort()
    return {"events_per_s": round(len(lats) / elapsed, 1),
            "p50_ms": round(percentile(lats, 0.5) * 1e3, 3),
            "p99_ms": round(percentile(lats, 0.99) * 1e3, 3)}


@contextlib.contextmanager
def host_recorder(base: Path) -> Iterator[Path]:
    from stenograph.recorder.store import init_store

    store = base / "store"
    base.mkdir(parents=True, exist_ok=True)
    init_store(store)
    srv = subprocess.Popen([PY, "-m", "stenograph", "serve", str(store)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if (store / "serve.sock").exists() or srv.poll() is not None:
                break
            time.sleep(0.05)
        if srv.poll() is not None:
            raise RuntimeError(f"stenograph serve ended: {srv.stderr.read() if srv.stderr else ''}")
        yield store
    finally:
        srv.terminate()
        srv.wait(timeout=60)


def sqlite_db(base: Path) -> str:
    import sqlite3
    path = base / "events.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE events(traj INTEGER, seq INTEGER, body BLOB, PRIMARY KEY(traj, seq))")
    db.close()
    return str(path)


@contextlib.contextmanager
def postgres(base: Path) -> Iterator[str | None]:
    """A private, durable PostgreSQL 15 cluster (``None`` if it is not installed)."""
    if not pg.installed():
        yield None
        return
    with pg.cluster(base, options="-c max_connections=800 -c shared_buffers=256MB",
                    stop="fast") as port:
        yield f"postgresql://postgres@127.0.0.1:{port}/dbos_bench"


def dbos_installed() -> bool:
    return subprocess.run([PY, "-c", "import dbos"], capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="1,16,64,256", help="process counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="1 and 16 processes, 2 s each")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    counts = [1, 16] if a.quick else [int(x) for x in a.procs.split(",")]
    seconds = 2.0 if a.quick else a.seconds
    base = Path(tempfile.mkdtemp(prefix="steno-bench-host-", dir=str(HERE.parent)))
    out: dict[str, Any] = {"seconds": seconds, "body_bytes": BODY_CHARS, "runs": {}}
    use_dbos = dbos_installed()
    pg_base = base
    try:
        # its own directory on a disk the postgres user can reach (the base is 0700)
        pg_base = Path(tempfile.mkdtemp(prefix="steno-bench-pg-", dir="/var/tmp"))
        with postgres(pg_base if use_dbos else base) as pg_url:
            for n in counts:
                row: dict[str, Any] = {}
                with host_recorder(base / f"host-{n}") as store:
                    row["host"] = run_producers("host", str(store), n, seconds)
                (base / f"sqlite-{n}").mkdir()
                row["sqlite"] = run_producers("sqlite", sqlite_db(base / f"sqlite-{n}"),
                                              n, seconds)
                if use_dbos and pg_url and n <= DBOS_MAX:
                    subprocess.run(["psql", "-X", "-q", pg_url.rsplit("/", 1)[0] + "/postgres",
                                    "-c", "DROP DATABASE IF EXISTS dbos_bench"],
                                   capture_output=True, timeout=60)
                    row["dbos"] = run_producers("dbos", pg_url, n, seconds)
                out["runs"][n] = row
                if not a.json:
                    show(n, row)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(pg_base, ignore_errors=True)
    if a.json:
        print(json.dumps(out))


def show(n: int, row: dict[str, Any]) -> None:
    h = row["host"]
    print(f"{n:4d} processes  host recorder {h['events_per_s']:9.0f}/s  p50 {h['p50_ms']:6.2f} ms"
          f"  p99 {h['p99_ms']:7.2f} ms")
    for peer in ("sqlite", "dbos"):
        if peer in row:
            f = row[peer]
            ratio = h["events_per_s"] / f["events_per_s"]
            print(f"{'':16}{peer:13} {f['events_per_s']:9.0f}/s  p50 {f['p50_ms']:6.2f} ms"
                  f"  p99 {f['p99_ms']:7.2f} ms   host recorder {ratio:.1f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
