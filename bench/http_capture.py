"""HTTP capture overhead: ms per exchange recorded vs uninstrumented, and replay speed.

Exchanges: a program makes N non-streaming and M streaming ``chat.completions`` calls
with the official ``openai`` package against the loopback ``ModelServer`` (started in
this process) and times them itself with ``time.perf_counter`` (after warm-up calls, so
imports and connection set-up are not counted). It runs uninstrumented and under
``stenograph record``, and under vcrpy (the peer: ``record_mode="all"``, a cassette of
every request, written when the loop ends and never synced); the figures are ms per
exchange in each, and what each adds. A recorded exchange that is not an effect rides
the next sync (an effect's intent, the group commit's next batch, the run's end); one
whose call made an effect is durable before the program sees its response.

Demo agent: ``examples/agent.py`` (4 model turns, 3 tools, one shell subprocess)
run plainly, recorded, and replayed offline with the server stopped; wall times of the
whole commands (CLI start-up included), median of ``--reps`` runs, and the ratio
replay / record.

    python bench/http_capture.py [--json] [-n 200] [-s 50] [--reps 3]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's ``http`` package: run as a script, its
# directory comes first on sys.path and would shadow it (http.server, used below).
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import textwrap
import time
from typing import Any

from stenograph.testing.model_server import ModelServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable  # the virtualenv's interpreter: the SDKs are installed there

PROGRAM = textwrap.dedent("""
    import contextlib, json, sys, time
    from openai import OpenAI

    n, s, warm = int(sys.argv[1]), int(sys.argv[2]), 5
    cassette = sys.argv[3] if len(sys.argv) > 3 else None
    c = OpenAI()
    if cassette:  # the peer: vcrpy records every request of the timed loops
        import vcr
        tape = vcr.VCR(record_mode="all").use_cassette(cassette)
    else:
        tape = contextlib.nullcontext()

    def call(i, stream=False):
        msgs = [{"role": "user", "content": f"question {i}"}]
        if not stream:
            return c.chat.completions.create(model="bench", messages=msgs).id
        return sum(1 for _ in c.chat.completions.create(model="bench", messages=msgs,
                                                        stream=True))

    for i in range(warm):
        call(-i - 1)
        call(-i - 1, stream=True)
    with tape:
        t0 = time.perf_counter()
        for i in range(n):
            call(i)
        t1 = time.perf_counter()
        events = 0
        for i in range(s):
            events += call(i, stream=True)
        t2 = time.perf_counter()
    print(json.dumps({"plain_s": t1 - t0, "stream_s": t2 - t1, "n": n, "s": s,
                      "stream_events": events}))
""")


def _env(srv: ModelServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STENO_", "OPENAI_")) and k != "LD_PRELOAD"}
    env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-bench-not-a-key-0000")
    return env


def _last_json(out: bytes) -> dict[str, Any]:
    return json.loads(out.decode().strip().splitlines()[-1])


def _run(argv: list[str], env: dict[str, str] | None, cwd: Path) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=600)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench: {argv[:4]} failed ({p.returncode}):\n"
                         f"{p.stderr.decode()[-2000:]}")
    return took, p.stdout


def exchanges(tmp: Path, n: int, s: int) -> dict[str, Any]:
    prog = tmp / "exchanges.py"
    prog.write_text(PROGRAM)
    with ModelServer(seed=7) as srv:
        env = _env(srv)
        _, out = _run([PY, str(prog), str(n), str(s)], env, tmp)
        plain = _last_json(out)
        steno = tmp / "exchanges.steno"
        _, out = _run([*CLI, "record", "-o", str(steno), "--", PY, str(prog), str(n), str(s)],
                      env, tmp)
        rec = _last_json(out)
        try:
            import vcr  # noqa: F401  (the peer, installed by `make bench`)
        except ImportError:
            vcr_run = None
        else:
            _, out = _run([PY, str(prog), str(n), str(s), str(tmp / "cassette.yaml")], env, tmp)
            vcr_run = _last_json(out)
    ms = {
        "plain_ms": 1000 * plain["plain_s"] / n,
        "record_ms": 1000 * rec["plain_s"] / n,
        "stream_plain_ms": 1000 * plain["stream_s"] / s,
        "stream_record_ms": 1000 * rec["stream_s"] / s,
    }
    if vcr_run is not None:
        ms["vcr_ms"] = 1000 * vcr_run["plain_s"] / n
        ms["stream_vcr_ms"] = 1000 * vcr_run["stream_s"] / s
    return {
        "n": n, "stream_n": s,
        "stream_events_per_call": rec["stream_events"] / s,
        **ms,
        "overhead_ms": ms["record_ms"] - ms["plain_ms"],
        "ratio": ms["record_ms"] / ms["plain_ms"],
        "stream_overhead_ms": ms["stream_record_ms"] - ms["stream_plain_ms"],
        "stream_ratio": ms["stream_record_ms"] / ms["stream_plain_ms"],
        "steno_bytes": steno.stat().st_size,
    }


def demo_agent(tmp: Path, reps: int) -> dict[str, Any]:
    plain, rec, rep = [], [], []
    identical = True
    for i in range(reps):
        steno = tmp / f"agent{i}.steno"
        with ModelServer(script=EXAMPLES / "agent_script.json") as srv:
            env = _env(srv)
            t, _ = _run([PY, str(EXAMPLES / "agent.py")], env, tmp)
            plain.append(t)
            t, rec_out = _run([*CLI, "record", "-o", str(steno), "--", PY,
                               str(EXAMPLES / "agent.py")], env, tmp)
            rec.append(t)
        # the server is stopped: replay is offline (and networking is refused)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
        t, rep_out = _run([*CLI, "replay", str(steno)], env, tmp)
        rep.append(t)
        identical = identical and rep_out == rec_out
    med = {"plain_s": statistics.median(plain), "record_s": statistics.median(rec),
           "replay_s": statistics.median(rep)}
    return {
        "reps": reps,
        **med,
        "record_vs_plain": med["record_s"] / med["plain_s"],
        "replay_vs_record": med["replay_s"] / med["record_s"],
        "stdout_identical": identical,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("-n", type=int, default=200, help="non-streaming calls")
    ap.add_argument("-s", type=int, default=50, help="streaming calls")
    ap.add_argument("--reps", type=int, default=3, help="demo agent runs (median)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="steno-bench-http-"))
    try:
        result = {"exchanges": exchanges(tmp, a.n, a.s), "demo_agent": demo_agent(tmp, a.reps),
                  "cpus": os.cpu_count()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    x, d = result["exchanges"], result["demo_agent"]
    t = Table(title=f"HTTP capture: openai chat.completions against the loopback server "
                    f"({os.cpu_count()} cpus)")
    vcr = "vcr_ms" in x
    for col in ("", "uninstrumented ms", "recorded ms", "overhead ms", "ratio",
                *(("vcrpy ms", "vcrpy overhead ms", "overhead vs vcrpy") if vcr else ())):
        t.add_column(col, justify="right")

    def peer(key: str, plain: float, ours: float) -> tuple[str, ...]:
        if not vcr:
            return ()
        added = x[key] - plain
        return (f"{x[key]:.2f}", f"{added:+.2f}",
                f"{(ours - plain) / added:.2f}x" if added > 0 else "-")

    t.add_row(f"non-streaming (N={x['n']})", f"{x['plain_ms']:.2f}", f"{x['record_ms']:.2f}",
              f"{x['overhead_ms']:+.2f}", f"{x['ratio']:.2f}x",
              *peer("vcr_ms", x["plain_ms"], x["record_ms"]))
    t.add_row(f"streaming (N={x['stream_n']}, {x['stream_events_per_call']:.0f} events)",
              f"{x['stream_plain_ms']:.2f}", f"{x['stream_record_ms']:.2f}",
              f"{x['stream_overhead_ms']:+.2f}", f"{x['stream_ratio']:.2f}x",
              *peer("stream_vcr_ms", x["stream_plain_ms"], x["stream_record_ms"]))
    u = Table(title=f"examples/agent.py, whole commands, median of {d['reps']}")
    for col in ("plain s", "record s", "replay s", "record/plain", "replay/record",
                "stdout identical"):
        u.add_column(col, justify="right")
    u.add_row(f"{d['plain_s']:.2f}", f"{d['record_s']:.2f}", f"{d['replay_s']:.2f}",
              f"{d['record_vs_plain']:.2f}x", f"{d['replay_vs_record']:.2f}x",
              str(d["stdout_identical"]))
    console = Console(width=max(Console().width, 100))
    console.print(t)
    console.print(u)
    return 0


if __name__ == "__main__":
    sys.exit(main())
