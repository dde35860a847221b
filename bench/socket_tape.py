"""The socket tape's cost: a 1 MiB download and 1,000 small request/responses.

A loopback HTTP server runs in this process (outside the recorded tree, so its
connections are taped). Two clients, timed by themselves with ``time.perf_counter``
around the work only (interpreter start-up and imports not counted):

* ``download``: ``http.client`` GETs a 1 MiB body, 20 times over one connection;
* ``small``: 1,000 GETs of a 64-byte body over one keep-alive connection (a request, a
  response, in turn: the tape's per-call cost).

Each runs natively (no shim: the peer figure, same machine, same server, same process
of this benchmark), under ``stenograph record``, and as ``stenograph replay`` of that
recording with the server stopped (every byte served from the tape). Printed: ms per
unit in each mode, the ratios record/native and replay/native, and the tape's size.
Whole commands (CLI start-up included) are timed too.

    python bench/socket_tape.py [--json] [--reps 3]

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
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
BIG = bytes(range(256)) * 4096
SMALL = b"x" * 64

PROGRAM = textwrap.dedent("""
    import http.client, json, sys, time
    kind, port = sys.argv[1], int(sys.argv[2])
    c = http.client.HTTPConnection("127.0.0.1", port)
    n, path = (20, "/big") if kind == "download" else (1000, "/small")
    got = 0
    t0 = time.perf_counter()
    for _ in range(n):
        c.request("GET", path)
        got += len(c.getresponse().read())
    dt = time.perf_counter() - t0
    print(json.dumps({"n": n, "bytes": got, "s": dt}))
""")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = BIG if self.path == "/big" else SMALL
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _last_json(out: str) -> dict[str, Any]:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    work = Path(tempfile.mkdtemp(prefix="steno-bench-net-"))
    (work / "client.py").write_text(PROGRAM)
    results: dict[str, Any] = {}
    try:
        for kind in ("download", "small"):
            native, record, replay, walls = [], [], [], {"record": [], "replay": []}
            size = 0
            for rep in range(args.reps):
                srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
                threading.Thread(target=srv.serve_forever, daemon=True).start()
                port = str(srv.server_address[1])
                out = subprocess.run([PY, "client.py", kind, port], cwd=work, env=env,
                                     capture_output=True, text=True, check=True)
                native.append(_last_json(out.stdout)["s"])
                steno = work / f"{kind}{rep}.steno"
                t0 = time.perf_counter()
                out = subprocess.run([*CLI, "record", "-o", str(steno), "--workspace", "none",
                                      "--", PY, "client.py", kind, port], cwd=work, env=env,
                                     capture_output=True, text=True, check=True)
                walls["record"].append(time.perf_counter() - t0)
                record.append(_last_json(out.stdout)["s"])
                srv.shutdown()
                srv.server_close()
                size = steno.stat().st_size
                t0 = time.perf_counter()
                out = subprocess.run([*CLI, "replay", str(steno)], cwd=work, env=env,
                                     capture_output=True, text=True)
                walls["replay"].append(time.perf_counter() - t0)
                if out.returncode != 0:
                    raise SystemExit(f"replay of {kind} failed: {out.stderr[-2000:]}")
                replay.append(_last_json(out.stdout)["s"])
            n = 20 if kind == "download" else 1000
            med = {m: statistics.median(v) for m, v in
                   (("native", native), ("record", record), ("replay", replay))}
            results[kind] = {
                "units": n, "unit": "MiB" if kind == "download" else "request",
                "ms_per_unit": {m: round(v / n * 1000, 4) for m, v in med.items()},
                "record_vs_native": round(med["record"] / med["native"], 2),
                "replay_vs_native": round(med["replay"] / med["native"], 2),
                "steno_bytes": size,
                "command_wall_s": {m: round(statistics.median(v), 3) for m, v in walls.items()},
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for kind, r in results.items():
        ms = r["ms_per_unit"]
        print(f"{kind}: ms per {r['unit']}: native {ms['native']}, record {ms['record']} "
              f"({r['record_vs_native']}x), replay {ms['replay']} ({r['replay_vs_native']}x); "
              f".steno {r['steno_bytes']} bytes; whole commands: record "
              f"{r['command_wall_s']['record']} s, replay {r['command_wall_s']['replay']} s")


if __name__ == "__main__":
    main()
