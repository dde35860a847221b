"""An MCP session of N tool calls over stdio: native, recorded, replayed; and what an MCP
call's intent costs beside an HTTP effect's.

The client (the official SDK) starts a server (the SDK's ``MCPServer``) as a child and
calls one tool N times, timing its loop with ``time.perf_counter`` (start-up and the
handshake not counted); whole commands are timed from outside too. The tool is
``peek`` (annotated ``readOnlyHint``: each call is taped as an entry, no intent) or
``poke`` (not annotated: each call is an effect, its ``ToolIntent`` durable before the
request -- a drain of every ring and an fdatasync). The peer for the intent is a
program's own HTTP effect: N hooked ``httpx`` POSTs to a loopback service, natively and
recorded (each with its intent and its exchange). Replay serves the whole session with
both ends replayed.

    python bench/mcp_session.py [--json] [-n 200] [--reps 3]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable  # the virtualenv: the client and server import mcp

SERVER = textwrap.dedent("""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    mcp = MCPServer("bench")

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def peek(i: int) -> str:
        return f"peek {i}"

    @mcp.tool()
    def poke(i: int) -> str:
        return f"poke {i}"

    mcp.run()
""")

CLIENT = textwrap.dedent("""
    import asyncio, json, os, sys, time
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def main(tool, n):
        params = StdioServerParameters(command=sys.executable, args=["server.py"],
                                       env=dict(os.environ))
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.list_tools()
            t0 = time.perf_counter()
            for i in range(n):
                await s.call_tool(tool, {"i": i})
            print(json.dumps({"s": time.perf_counter() - t0}), flush=True)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
""")

HTTP = textwrap.dedent("""
    import json, sys, time
    import httpx
    url, n = sys.argv[1], int(sys.argv[2])
    with httpx.Client() as c:
        t0 = time.perf_counter()
        for i in range(n):
            c.post(f"{url}/payments", json={"to": "a", "amount": i})
        print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
""")


def _json_line(out: str) -> dict[str, Any]:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(the program's own loop time, the whole command's wall time)."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr[-2000:]}")
    return _json_line(out.stdout)["s"], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from stenograph.testing.effect_service import EffectService

    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    work = Path(tempfile.mkdtemp(prefix="steno-bench-mcp-"))
    loops: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    try:
        (work / "server.py").write_text(SERVER)
        (work / "client.py").write_text(CLIENT)
        (work / "posts.py").write_text(HTTP)
        with EffectService() as svc:
            for rep in range(args.reps):
                for tool in ("peek", "poke"):
                    base = [PY, "client.py", tool, str(args.n)]
                    steno = work / f"{tool}{rep}.steno"
                    for mode, argv in (
                            ("native", base),
                            ("record", [*CLI, "record", "-o", str(steno), "--workspace",
                                        "none", "--", *base]),
                            ("replay", [*CLI, "replay", str(steno)])):
                        loop, wall = _run(argv, work, env)
                        loops.setdefault(f"{tool}_{mode}", []).append(loop)
                        walls.setdefault(f"{tool}_{mode}", []).append(wall)
                base = [PY, "posts.py", svc.url, str(args.n)]
                for mode, argv in (("native", base),
                                   ("record", [*CLI, "record", "-o", str(work / f"h{rep}.steno"),
                                               "--workspace", "none", "--", *base])):
                    loop, wall = _run(argv, work, env)
                    loops.setdefault(f"http_{mode}", []).append(loop)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ms = {k: statistics.median(v) / args.n * 1000 for k, v in loops.items()}
    w = {k: statistics.median(v) for k, v in walls.items()}
    intent_mcp = ms["poke_record"] - ms["peek_record"]
    effect_http = ms["http_record"] - ms["http_native"]
    results = {
        "calls": args.n,
        "ms_per_call": {k: round(v, 3) for k, v in ms.items()},
        "session_wall_s": {k: round(v, 3) for k, v in w.items()},
        "read_only_record_vs_native": round(ms["peek_record"] / ms["peek_native"], 2),
        "acting_record_vs_native": round(ms["poke_record"] / ms["poke_native"], 2),
        "replay_vs_native_wall": round(w["poke_replay"] / w["poke_native"], 2),
        "mcp_intent_ms": round(intent_mcp, 3),
        "http_effect_overhead_ms": round(effect_http, 3),
        "mcp_intent_vs_http_effect": round(intent_mcp / effect_http, 2) if effect_http else None,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    m = results["ms_per_call"]
    print(f"{args.n} MCP calls over stdio, ms each: read-only native {m['peek_native']}, "
          f"recorded {m['peek_record']} ({results['read_only_record_vs_native']}x); acting "
          f"native {m['poke_native']}, recorded {m['poke_record']} "
          f"({results['acting_record_vs_native']}x)")
    print(f"whole session (acting), s: native {w['poke_native']:.2f}, recorded "
          f"{w['poke_record']:.2f}, replayed {w['poke_replay']:.2f} "
          f"({results['replay_vs_native_wall']}x native)")
    print(f"an MCP call's intent: {results['mcp_intent_ms']} ms; a hooked HTTP effect's "
          f"whole overhead (intent and exchange): {results['http_effect_overhead_ms']} ms "
          f"(ratio {results['mcp_intent_vs_http_effect']})")


if __name__ == "__main__":
    main()
