"""Looking at a long recording: the HTML page of 1,000 turns, and one turn by number.

The recording is real (``bench/thousand_turns.py``: an openai-SDK agent recorded for
1,000 model turns against the loopback model server, cached in /tmp). Printed:

1. ``view``: the page of all 1,000 turns, built in this process from the opened
   trajectory (the median of ``--tries``), its size and pages; the whole ``stenograph
   view`` command's wall time. The peer, in the same process: ``json.dumps`` of the same
   turns as ``show --turn N --json`` gives each (the request body included), the most
   direct way to put every turn in one file.
2. ``show --turn N --json`` at the start, middle and end (N = 1, 500, 1000), each a
   subprocess, the median of ``--tries``. The peer is SQLite (what the project names as
   its reference store): a subprocess that looks up row N of a table holding the same
   1,000 request bodies; also ``json.load`` of a file of those bodies, and a bare
   ``python -c pass`` (the interpreter's start, in every figure).

    python bench/view.py [--tries 3] [--json]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from thousand_turns import make

from stenograph.harness.documents import turn_doc
from stenograph.harness.source import open_recording
from stenograph.harness.viewer import Run, page_count, render
from stenograph.recorder.checkpoints import checkpoints_of

CLI = [sys.executable, "-m", "stenograph"]
SQLITE_LOOKUP = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); sys.stdout.buffer."
                 "write(c.execute('select body from turns where n = ?', (int(sys.argv[2]),))"
                 ".fetchone()[0])")
JSON_LOOKUP = ("import json, sys; d = json.load(open(sys.argv[1])); "
               "sys.stdout.write(d[int(sys.argv[2]) - 1])")


def _median(tries: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(tries):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}...: exit {p.returncode}\n"
                         f"{p.stderr.decode(errors='replace')[-2000:]}")


def bench_view(steno: Path, root: Path, tries: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rec = open_recording(steno)
    tr = rec.trajectory()
    load = time.perf_counter() - t0
    times, html = [], b""
    for _ in range(tries):  # a fresh trajectory each time: nothing cached on its turns
        run = Run(open_recording(steno).trajectory(), str(steno), rec.parent)
        t0 = time.perf_counter()
        html = render(run).encode()
        times.append(time.perf_counter() - t0)
    view_s = statistics.median(times)
    cps = checkpoints_of(rec.events)
    docs = [turn_doc(tr, t, cps) for t in tr.turns]
    dumped: list[str] = []
    dump_s = _median(tries, lambda: dumped.append(json.dumps(docs, ensure_ascii=False,
                                                             default=repr)))
    out = root / "view.html"
    cmd_s = _median(tries, lambda: _run([*CLI, "view", str(steno), "-o", str(out)]))
    return {"turns": len(tr.turns), "log_bytes": steno.stat().st_size,
            "open_s": round(load, 3), "view_s": round(view_s, 3), "page_bytes": len(html),
            "pages": page_count(len(tr.turns), 200), "view_command_s": round(cmd_s, 3),
            "json_dumps_s": round(dump_s, 3), "json_bytes": len(dumped[-1].encode()),
            "view_over_json_dumps": round(view_s / dump_s, 2)}


def bench_show(steno: Path, root: Path, tries: int) -> dict[str, Any]:
    tr = open_recording(steno).trajectory()
    bodies = [t.request_body() for t in tr.turns]
    db, js = root / "turns.sqlite", root / "turns.json"
    with sqlite3.connect(db) as c:
        c.execute("create table turns (n integer primary key, body blob)")
        c.executemany("insert into turns values (?, ?)", enumerate(bodies, 1))
    c.close()
    js.write_text(json.dumps([b.decode() for b in bodies]))
    out: dict[str, Any] = {"python_start_s": round(_median(tries, lambda: _run(
        [sys.executable, "-c", "pass"])), 3)}
    for n in (1, len(bodies) // 2, len(bodies)):
        out[f"show_{n}_s"] = round(_median(tries, lambda n=n: _run(
            [*CLI, "show", str(steno), "--turn", str(n), "--json"])), 3)
        out[f"sqlite_{n}_s"] = round(_median(tries, lambda n=n: _run(
            [sys.executable, "-c", SQLITE_LOOKUP, str(db), str(n)])), 3)
        out[f"json_load_{n}_s"] = round(_median(tries, lambda n=n: _run(
            [sys.executable, "-c", JSON_LOOKUP, str(js), str(n)])), 3)
    out["bodies_bytes"] = sum(map(len, bodies))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="steno-bench-view-") as tmp:
        root = Path(tmp)
        steno = make(root / "thousand.steno")
        out = {"view": bench_view(steno, root, a.tries), "show": bench_show(steno, root, a.tries)}
    if a.json:
        print(json.dumps(out))
        return
    v, s = out["view"], out["show"]
    print(f"1000-turn recording (real: bench/thousand_turns.py): {v['turns']} turns, "
          f"{v['log_bytes']:,} bytes; opened in {v['open_s']:.3f} s")
    print(f"view: page of {v['turns']} turns in {v['view_s']:.3f} s, {v['page_bytes']:,} bytes, "
          f"{v['pages']} page(s); `stenograph view` command {v['view_command_s']:.3f} s")
    print(f"  peer json.dumps of the same turns (show --turn N --json each): "
          f"{v['json_dumps_s']:.3f} s, {v['json_bytes']:,} bytes -> view/json.dumps "
          f"x{v['view_over_json_dumps']}")
    print(f"show --turn N --json (python start alone: {s['python_start_s']:.3f} s):")
    n = v["turns"]
    for k in (1, n // 2, n):
        print(f"  N={k}: show {s[f'show_{k}_s']:.3f} s, peer sqlite3 row {s[f'sqlite_{k}_s']:.3f}"
              f" s (x{s[f'show_{k}_s'] / s[f'sqlite_{k}_s']:.1f}), json.load of the bodies "
              f"{s[f'json_load_{k}_s']:.3f} s")


if __name__ == "__main__":
    main()
