"""Durable-append benchmark: stenograph's group-commit log against SQLite.

What is measured, per producer count (1, 8, 64, 256 by default):

* **stenograph**: ``Store.append(traj, "Note", body, durable=True)`` from N
  threads, each producer writing its own trajectory, on a fresh store.
* **sqlite**: the peer a user would otherwise reach for, stdlib ``sqlite3`` with
  ``journal_mode=WAL`` and ``synchronous=FULL``, one transaction per event
  (``BEGIN; INSERT; COMMIT``). Each producer thread has its own connection with
  a ``busy_timeout``: that is how concurrent writers really use SQLite, and it
  lets SQLite wait for its write lock without the GIL.
* **sqlite_shared**: the same, but one connection shared by all producers and
  serialized by a Python lock (the other way applications commonly do it).
* **stenograph_async**: 64 asyncio tasks on one loop, ``await store.append_async``.

Events are ~1.3 KiB: body ``{"text": <1300 characters>}``. Both systems get the
same body and both pay for packing it with msgpack, so neither is spared work
the other does. Every run uses a fresh directory on a real file system; a
tmpfs temp dir is refused in favour of the working directory, because
``fdatasync`` on tmpfs is free and the comparison would mean nothing.

Each configuration runs for a fixed time after all producers are ready (each
has done one untimed append, which also opens its connection or creates its
trajectory); every producer then stops at the deadline. Throughput is events
completed divided by the wall time from start to the last producer's return;
latency is the time of each single call, p50 and p99 over all calls.

This is a benchmark, not a test: it prints figures and asserts nothing about
speed. ``--quick --json`` prints one JSON object and takes well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.group_commit import CommitSettings
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store, StoreSettings

PRODUCERS = (1, 8, 64, 256)
ASYNC_PRODUCERS = 64
BODY: dict[str, Any] = {"text": "x" * 1300}
SYSTEMS = ("stenograph", "sqlite", "sqlite_shared")

Figures = dict[str, float]
AppendFn = Callable[[int], None]
"""One durable append by a producer; the argument is its sequence number."""


# -- where to write ----------------------------------------------------------------


def fs_type(path: Path) -> str:
    """File-system type of ``path`` (longest matching mount point in /proc/mounts)."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mnt = fields[1].replace("\\040", " ")
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


def pick_base(requested: str | None) -> Path:
    """A directory on a real (non-tmpfs) file system to hold the bench stores."""
    if requested:
        base = Path(requested)
    else:
        base = Path(tempfile.gettempdir())
        if fs_type(base) in ("tmpfs", "ramfs"):
            base = Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    return base


# -- the timed loop ------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[k]


def summarize(latencies: list[float], elapsed: float) -> Figures:
    latencies.sort()
    return {
        "events_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.50) * 1e3, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1e3, 3),
    }


def run_threads(producers: list[AppendFn], seconds: float) -> Figures:
    """Run each producer in its own thread for ``seconds``; time every call."""
    start_end = [0.0, 0.0]

    def set_clock() -> None:  # runs once, after everyone arrived, before anyone leaves
        start_end[0] = time.perf_counter()
        start_end[1] = start_end[0] + seconds

    ready = threading.Barrier(len(producers) + 1, action=set_clock)
    results: list[list[float]] = [[] for _ in producers]
    errors: list[BaseException] = []

    def body(i: int, append: AppendFn) -> None:
        lat = results[i]
        clock = time.perf_counter
        try:
            append(0)  # untimed: opens the connection / creates the trajectory
            ready.wait()
            end, n = start_end[1], 1
            while True:
                t0 = clock()
                if t0 >= end:
                    break
                append(n)
                lat.append(clock() - t0)
                n += 1
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [
        threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(producers)
    ]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a producer failed: see below
        ready.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start_end[0]
    if errors:
        raise errors[0]
    return summarize([x for lat in results for x in lat], elapsed)


# -- stenograph ----------------------------------------------------------------------


def bench_stenograph(
    base: Path, n: int, seconds: float, settings: StoreSettings
) -> tuple[Figures, int]:
    """Threads appending durably; returns figures and the number of events written."""
    path = base / f"steno-{n}"
    store = Store(path, settings=settings)
    try:
        producers: list[AppendFn] = []
        for i in range(n):
            traj = f"producer-{i}"
            producers.append(lambda _seq, traj=traj: store.append(traj, "Note", BODY))
        figures = run_threads(producers, seconds)
        written = store.synced_lsn
    finally:
        store.close()
    return figures, written


def bench_stenograph_async(
    base: Path, n: int, seconds: float, settings: StoreSettings
) -> tuple[Figures, int]:
    """asyncio tasks on one loop awaiting ``append_async``."""
    path = base / f"steno-async-{n}"

    async def main(store: Store) -> Figures:
        results: list[list[float]] = [[] for _ in range(n)]
        for i in range(n):  # untimed first append per trajectory
            await store.append_async(f"task-{i}", "Note", BODY)
        clock = time.perf_counter
        start = clock()
        end = start + seconds

        async def task(i: int) -> None:
            traj, lat = f"task-{i}", results[i]
            while True:
                t0 = clock()
                if t0 >= end:
                    return
                await store.append_async(traj, "Note", BODY)
                lat.append(clock() - t0)

        await asyncio.gather(*(task(i) for i in range(n)))
        return summarize([x for lat in results for x in lat], clock() - start)

    store = Store(path, settings=settings)
    try:
        figures = asyncio.run(main(store))
        written = store.synced_lsn
    finally:
        store.close()
    return figures, written


# -- sqlite --------------------------------------------------------------------------

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events ("
    "lsn INTEGER PRIMARY KEY, traj TEXT NOT NULL, seq INTEGER NOT NULL, "
    "kind TEXT NOT NULL, body BLOB NOT NULL)"
)
_INSERT = "INSERT INTO events (traj, seq, kind, body) VALUES (?, ?, 'Note', ?)"


def sqlite_connect(path: Path) -> sqlite3.Connection:
    """A connection as a durable writer would open one (autocommit; explicit txns)."""
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA synchronous = FULL")  # per connection, not stored in the file
    return conn


def sqlite_init(path: Path) -> None:
    conn = sqlite_connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(_SCHEMA)
    conn.close()


def sqlite_txn(conn: sqlite3.Connection, traj: str, seq: int) -> None:
    conn.execute("BEGIN")
    try:
        conn.execute(_INSERT, (traj, seq, msgpack.packb(BODY, use_bin_type=True)))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def bench_sqlite(base: Path, n: int, seconds: float, *, shared: bool) -> Figures:
    path = base / f"sqlite-{'shared' if shared else 'own'}-{n}.db"
    sqlite_init(path)
    conns: list[sqlite3.Connection] = []
    producers: list[AppendFn] = []
    if shared:
        conn = sqlite_connect(path)
        conns.append(conn)
        lock = threading.Lock()

        def shared_append(seq: int, traj: str) -> None:
            with lock:
                sqlite_txn(conn, traj, seq)

        for i in range(n):
            producers.append(lambda seq, traj=f"producer-{i}": shared_append(seq, traj))
    else:
        for i in range(n):
            c = sqlite_connect(path)
            conns.append(c)
            producers.append(lambda seq, c=c, traj=f"producer-{i}": sqlite_txn(c, traj, seq))
    try:
        return run_threads(producers, seconds)
    finally:
        for c in conns:
            c.close()


# -- driver --------------------------------------------------------------------------


def check_readback(path: Path, expected: int) -> None:
    """Reopen a store written by the benchmark and count its events."""
    got = sum(1 for _ in StoreReader(path).events())
    if got != expected:
        raise SystemExit(f"bench: store {path} read back {got} events, expected {expected}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    settings = StoreSettings()
    if args.window_ms is not None:
        settings = StoreSettings(commit=CommitSettings(window_s=args.window_ms / 1e3))
    systems = SYSTEMS[:1] if args.stenograph_only else SYSTEMS
    base = pick_base(args.dir)
    work = Path(tempfile.mkdtemp(prefix="stenograph-bench-", dir=base))
    out: dict[str, Any] = {name: {} for name in systems}
    say = (lambda *_: None) if args.json else (lambda msg: print(msg, file=sys.stderr))
    try:
        for n in args.producers:
            key = str(n)
            say(f"  stenograph    {n:>4} producers ...")
            figures, written = bench_stenograph(work, n, seconds, settings)
            check_readback(work / f"steno-{n}", written)
            shutil.rmtree(work / f"steno-{n}")
            out["stenograph"][key] = figures
            if "sqlite" in systems:
                say(f"  sqlite        {n:>4} producers ...")
                out["sqlite"][key] = bench_sqlite(work, n, seconds, shared=False)
                say(f"  sqlite_shared {n:>4} producers ...")
                out["sqlite_shared"][key] = bench_sqlite(work, n, seconds, shared=True)
        if not args.no_async:
            say(f"  stenograph_async {ASYNC_PRODUCERS} tasks ...")
            figures, written = bench_stenograph_async(work, ASYNC_PRODUCERS, seconds, settings)
            check_readback(work / f"steno-async-{ASYNC_PRODUCERS}", written)
            out["stenograph_async"] = {str(ASYNC_PRODUCERS): figures}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for peer, key in (("sqlite", "ratio"), ("sqlite_shared", "ratio_shared")):
        if peer in out:
            out[key] = {
                k: round(out["stenograph"][k]["events_per_s"] / out[peer][k]["events_per_s"], 2)
                for k in out["stenograph"]
            }
    out["meta"] = {
        "seconds_per_run": seconds,
        "event_bytes": len(msgpack.packb(BODY, use_bin_type=True)),
        "window_ms": settings.commit.window_s * 1e3,
        "dir": str(base),
        "fs": fs_type(base),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
    }
    return out


def print_table(out: dict[str, Any]) -> None:
    """One row per (producers, system); the ratio is stenograph's events/s over the row's."""
    from rich.console import Console
    from rich.table import Table

    meta = out["meta"]
    table = Table(
        title=(
            f"Durable appends: ~{meta['event_bytes']} B events, {meta['seconds_per_run']:g} s "
            f"per run, {meta['fs']}, {meta['cpus']} CPUs, Python {meta['python']}, "
            f"SQLite {meta['sqlite']}"
        )
    )
    for name, justify in (
        ("producers", "right"), ("system", "left"), ("events/s", "right"),
        ("p50 ms", "right"), ("p99 ms", "right"), ("stenograph x", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows = [(name, key) for key in out["stenograph"] for name in SYSTEMS if name in out]
    rows += [("stenograph_async", key) for key in out.get("stenograph_async", {})]
    rows.sort(key=lambda r: int(r[1]))
    last_key = None
    for name, key in rows:
        f = out[name][key]
        peer = out[name][key]["events_per_s"]
        steno = out["stenograph"].get(key, {}).get("events_per_s")
        ratio = ""
        if name.startswith("sqlite") and steno:
            ratio = f"{steno / peer:.1f}"
        if key != last_key and last_key is not None:
            table.add_section()
        last_key = key
        table.add_row(
            key, name, f"{f['events_per_s']:,.0f}", f"{f['p50_ms']:.2f}", f"{f['p99_ms']:.2f}",
            ratio, style="bold" if name == "sqlite" else None,
        )
    Console().print(table)
    print(
        "sqlite: one connection per producer thread (busy_timeout); sqlite_shared: one "
        "connection behind a Python lock. Both WAL, synchronous=FULL, BEGIN; INSERT; COMMIT "
        "per event. stenograph x: stenograph threads' events/s over that row's (the target "
        "ratio uses the sqlite row). stenograph_async: asyncio tasks on one loop."
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short runs (under a minute in all)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--seconds", type=float, help="seconds per configuration")
    p.add_argument(
        "--producers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(PRODUCERS),
        help="comma-separated producer counts (default 1,8,64,256)",
    )
    p.add_argument("--no-async", action="store_true", help="skip the asyncio variant")
    p.add_argument(
        "--stenograph-only", action="store_true", help="skip SQLite (no ratios; for tuning)"
    )
    p.add_argument(
        "--window-ms", type=float, help="override CommitSettings.window_s (milliseconds)"
    )
    p.add_argument("--dir", help="where to create the bench stores (not tmpfs)")
    args = p.parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out))
    else:
        print_table(out)


if __name__ == "__main__":
    main()
