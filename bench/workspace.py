"""Workspace checkpoints: what a snapshot per turn costs, incremental vs full vs a copy.

A workspace of ``--files`` small files (1-4 KiB of random bytes, in 10 x 10 directories)
goes through ``--turns`` turns; each turn rewrites ``--churn`` of its files (new bytes,
the same sizes) and then takes a checkpoint three ways:

* ``incremental``: one ``Snapshotter`` across the turns (what the recorder does): stats
  every path, reads only files whose size/mtime/inode changed, writes their blobs and a
  delta manifest (a full one every ``MAX_DEPTH + 1`` snapshots);
* ``full``: a new ``Snapshotter`` each turn over the same blob directory: reads and
  hashes every file again (``put_file`` hashes first and copies only what the store
  lacks) and writes a full manifest;
* ``copytree``: ``shutil.copytree`` of the whole tree to a fresh directory, then one
  ``syncfs`` so it is as durable as a snapshot (the naive peer: no dedup, no manifest);
* ``times``: ``Snapshotter.times`` -- the metadata walk a turn without a checkpoint
  costs (its changed mtimes, nothing read or stored).

Per checkpoint: seconds, and bytes written (``wchar`` of ``/proc/self/io``: every byte
given to ``write``/``sendfile``, temporary copies included) and bytes stored (growth of
the blob directory or the copy). Write amplification = bytes written per checkpoint /
bytes the turn changed. The first (full) snapshot of each way is reported apart.
Times are wall clock on a shared machine and include the ``syncfs`` a snapshot makes
(each measurement starts after an ``os.sync``, so none pays for another's dirty pages).

    python bench/workspace.py [--json] [--files 10000] [--turns 20] [--churn 0.01]
                              [--dir DIR] [--replay-files 1000]

Then the start-up a sealed replay adds: ``/bin/true`` recorded in a workspace of
``--replay-files`` files, replayed sealed (the start snapshot restored into the tape
directory, overlays mounted) and ``--unsealed``, through the real CLI: median of 5 each.

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.snapshots import MAX_DEPTH, Snapshotter


def wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def du(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def make_tree(root: Path, n: int, rng: random.Random) -> list[Path]:
    files = []
    for i in range(n):
        d = root / f"pkg{i % 10}" / f"mod{(i // 10) % 10}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"file{i:05d}.txt"
        p.write_bytes(rng.randbytes(rng.randint(1024, 4096)))
        files.append(p)
    return files


def churn(files: list[Path], k: int, rng: random.Random) -> int:
    """Rewrite ``k`` files with new bytes of the same size; the bytes changed."""
    changed = 0
    for p in rng.sample(files, k):
        size = p.stat().st_size
        p.write_bytes(rng.randbytes(size))
        changed += size
    return changed


def measure(fn: Any, stored_dir: Path) -> dict[str, float]:
    os.sync()  # no way pays for the dirty pages the one before it left (syncfs flushes all)
    w0, s0, t0 = wchar(), du(stored_dir), time.perf_counter()
    extra = fn()
    t = time.perf_counter() - t0
    out = {"seconds": t, "written": wchar() - w0, "stored": du(stored_dir) - s0}
    if extra:
        out.update(extra)
    return out


def run(files_n: int, turns: int, frac: float, base: Path) -> dict[str, Any]:
    rng = random.Random(1234)
    work = base / "work"
    files = make_tree(work, files_n, rng)
    tree_bytes = du(work)
    k = max(1, round(files_n * frac))
    inc_blobs, full_blobs = BlobStore(base / "inc" / "blobs"), BlobStore(base / "full" / "blobs")
    copies = base / "copies"
    copies.mkdir()
    inc = Snapshotter(inc_blobs, [str(work)])

    def take_inc() -> dict[str, float]:
        t = inc.take()
        return {"manifest": t.manifest_bytes, "full": float(t.full)}

    def take_full() -> dict[str, float]:
        t = Snapshotter(full_blobs, [str(work)]).take()
        return {"manifest": t.manifest_bytes, "full": float(t.full)}

    times_of = Snapshotter(BlobStore(base / "times" / "blobs"), [str(work)])
    times_of.take()

    def take_times() -> dict[str, float]:
        return {"entries": float(sum(len(d) for d in times_of.times().values()))}

    def copy(i: int) -> Any:
        def run() -> None:
            shutil.copytree(work, copies / f"turn{i}")
            BlobStore(copies).sync()  # durable, as a snapshot is (one syncfs)
        return run

    first = {"incremental": measure(take_inc, inc_blobs.root),
             "full": measure(take_full, full_blobs.root),
             "copytree": measure(copy(0), copies)}
    per: dict[str, list[dict[str, float]]] = {"incremental": [], "full": [], "copytree": [],
                                              "times": []}
    changed: list[int] = []
    for turn in range(1, turns + 1):
        changed.append(churn(files, k, rng))
        per["incremental"].append(measure(take_inc, inc_blobs.root))
        per["full"].append(measure(take_full, full_blobs.root))
        per["copytree"].append(measure(copy(turn), copies))
        per["times"].append(measure(take_times, base / "times"))
    mean_changed = statistics.mean(changed)
    summary: dict[str, Any] = {}
    for way, rows in per.items():
        written = statistics.mean(r["written"] for r in rows)
        summary[way] = {
            "seconds_median": statistics.median(r["seconds"] for r in rows),
            "seconds_mean": statistics.mean(r["seconds"] for r in rows),
            "seconds_max": max(r["seconds"] for r in rows),
            "written_mean": written,
            "stored_mean": statistics.mean(r["stored"] for r in rows),
            "write_amplification": written / mean_changed,  # (times: its event is apart)
            "stored_amplification": statistics.mean(r["stored"] for r in rows) / mean_changed,
        }
        if "manifest" in rows[0]:
            summary[way]["manifest_mean"] = statistics.mean(r["manifest"] for r in rows)
            summary[way]["full_manifests"] = int(sum(r["full"] for r in rows))
    return {"files": files_n, "tree_bytes": tree_bytes, "turns": turns,
            "changed_files_per_turn": k, "changed_bytes_per_turn": mean_changed,
            "max_depth": MAX_DEPTH, "first": first, "per_turn": summary,
            "turns_detail": per}


def replay_startup(base: Path, n: int, repeat: int = 5) -> dict[str, float]:
    work = base / "replay-ws"
    make_tree(work, n, random.Random(3))
    steno = base / "true.steno"
    cli = [sys.executable, "-m", "stenograph"]
    subprocess.run([*cli, "record", "-o", str(steno), "--", "/bin/true"], cwd=work,
                   check=True, capture_output=True)
    out: dict[str, float] = {}
    for name, flags in (("sealed", []), ("unsealed", ["--unsealed"])):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run([*cli, "replay", *flags, str(steno)], cwd=work, check=True,
                           capture_output=True)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    out["ratio"] = out["sealed"] / out["unsealed"]
    return out


def _b(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--churn", type=float, default=0.01, help="fraction of files per turn")
    ap.add_argument("--dir", help="where to build the workspace (default: a temp dir)")
    ap.add_argument("--replay-files", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="steno-ws-", dir=a.dir))
    try:
        r = run(a.files, a.turns, a.churn, base)
        r["replay_startup"] = replay_startup(base, a.replay_files)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps(r))
        return
    print(f"workspace: {r['files']} files, {_b(r['tree_bytes'])}; {r['turns']} turns, "
          f"{r['changed_files_per_turn']} files ({_b(r['changed_bytes_per_turn'])}) "
          "rewritten per turn")
    print("first checkpoint (full in every way):")
    for way, f in r["first"].items():
        print(f"  {way:<11} {f['seconds'] * 1e3:8.1f} ms  written {_b(f['written']):>10}  "
              f"stored {_b(f['stored']):>10}")
    print("per turn after it (median / max ms; mean bytes; amplification = bytes written "
          "/ bytes changed):")
    inc = r["per_turn"]["incremental"]
    for way, f in r["per_turn"].items():
        extra = ""
        if "manifest_mean" in f:
            extra = (f"  manifest {_b(f['manifest_mean'])}"
                     f" ({f['full_manifests']} full of {r['turns']})")
        print(f"  {way:<11} {f['seconds_median'] * 1e3:8.1f} / {f['seconds_max'] * 1e3:7.1f} ms"
              f"  written {_b(f['written_mean']):>10} (x{f['write_amplification']:.2f})"
              f"  stored {_b(f['stored_mean']):>10} (x{f['stored_amplification']:.2f}){extra}")
    for way in ("full", "copytree"):
        f = r["per_turn"][way]
        print(f"  incremental vs {way}: {f['seconds_median'] / inc['seconds_median']:.1f}x "
              f"faster, {f['written_mean'] / inc['written_mean']:.1f}x fewer bytes written")
    t = r["per_turn"]["times"]
    print(f"  times (a turn without a checkpoint) vs incremental: "
          f"{t['seconds_median'] / inc['seconds_median']:.2f}x the time")
    rs = r["replay_startup"]
    print(f"replay of /bin/true in a {a.replay_files}-file workspace: sealed "
          f"{rs['sealed'] * 1e3:.0f} ms, unsealed {rs['unsealed'] * 1e3:.0f} ms "
          f"({rs['ratio']:.2f}x)")


if __name__ == "__main__":
    main()
