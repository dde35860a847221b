"""The socket tape's cost: a 1 MiB download and 1,000 small request/responses.

A loopback HTTP server runs in this process (outside the recorded tree, so its
connections are taped). Two clients, timed by themselves with ``time.perf_counter``
around the work only (interpreter start-up and imports not counted):

* ``download``: ``http.client`` GETs a 1 MiB body, 20 times over one connection;
* ``small``: 1,000 GETs of a 64-byte body over one keep-alive connection (a request, a
  response, in turn: the tape's per-call cost);
* ``connect``: 200 such GETs, each on a new connection (under record each connect is
  synced to the log before it returns, ``MSG_SYNC``: the cost of intent before effect).

Each runs natively (no shim: the peer figure, same machine, same server, same process
of this benchmark), under ``stenograph record``, and as ``stenograph replay`` of that
recording with the server stopped (every byte served from the tape). Native and record
are timed by the client itself; a replay serves the recorded clocks, so it is timed from
outside: the whole replay command, minus the same command replaying a recording of the
client doing no requests (start-up, preparing the tape, the seal). Printed: ms per unit
in each mode, the ratios record/native and replay/native, and the tape's size.

    python bench/socket_tape.py [--json] [--reps 3]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
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
    kind, port, scale = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    c = http.client.HTTPConnection("127.0.0.1", port)
    n, path = {"download": (20, "/big"), "small": (1000, "/small"),
               "connect": (200, "/small")}[kind]
    n *= scale
    got = 0
    t0 = time.perf_counter()
    for _ in range(n):
        if kind == "connect":
            c.close()
            c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", path)
        got += len(c.getresponse().read())
    dt = time.perf_counter() - t0
    print(json.dumps({"n": n, "bytes": got, "s": dt}))
""")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()  # no Nagle: headers and body leave at once, as a real server's do
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

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
        for kind in ("download", "small", "connect"):
            native, record, replay = [], [], []
            size = 0
            for rep in range(args.reps):
                srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
                threading.Thread(target=srv.serve_forever, daemon=True).start()
                port = str(srv.server_address[1])
                out = subprocess.run([PY, "client.py", kind, port, "1"], cwd=work, env=env,
                                     capture_output=True, text=True, check=True)
                native.append(_last_json(out.stdout)["s"])
                walls = []
                for scale in ("1", "0"):
                    steno = work / f"{kind}{rep}-{scale}.steno"
                    out = subprocess.run([*CLI, "record", "-o", str(steno), "--workspace",
                                          "none", "--", PY, "client.py", kind, port, scale],
                                         cwd=work, env=env, capture_output=True, text=True,
                                         check=True)
                    if scale == "1":
                        record.append(_last_json(out.stdout)["s"])
                        size = steno.stat().st_size
                    t0 = time.perf_counter()
                    done = subprocess.run([*CLI, "replay", str(steno)], cwd=work, env=env,
                                          capture_output=True, text=True)
                    walls.append(time.perf_counter() - t0)
                    if done.returncode != 0:
                        raise SystemExit(f"replay of {kind} failed: {done.stderr[-2000:]}")
                srv.shutdown()
                srv.server_close()
                replay.append(max(walls[0] - walls[1], 0.0))
            n = {"download": 20, "small": 1000, "connect": 200}[kind]
            med = {m: statistics.median(v) for m, v in
                   (("native", native), ("record", record), ("replay", replay))}
            results[kind] = {
                "units": n, "unit": {"download": "MiB", "small": "request",
                                     "connect": "connection"}[kind],
                "ms_per_unit": {m: round(v / n * 1000, 4) for m, v in med.items()},
                "record_vs_native": round(med["record"] / med["native"], 2),
                "replay_vs_native": round(med["replay"] / med["native"], 2),
                "steno_bytes": size,
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
              f".steno {r['steno_bytes']} bytes")


if __name__ == "__main__":
    main()
