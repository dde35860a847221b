"""HTTP hooks under a real recorder, in real processes (Python-level tape only).

These exercise the hooks, the exchange socket and the replay files without the C
shim, so they isolate the Python layer; the shim tests cover the process tape.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.exchanges import ExchangeServer, prepare_py_tape
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store, StoreSettings
from stenograph.runner.pyenv import hook_env

SECRET = "sk-test-SECRET-0123456789abcdef"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        self._answer(self.rfile.read(n))

    def _answer(self, body: bytes) -> None:
        self.hits.append(self.path)
        if self.path.startswith("/sse"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(5):
                data = f"data: {{\"i\": {i}}}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/flaky") and self.hits.count(self.path) == 1:
            out = b'{"error": "try again"}'
            self.send_response(500)
        else:
            out = json.dumps({"path": self.path, "got": body.decode(),
                              "n": len(self.hits)}).encode()
            self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.send_header("set-cookie", "session=very-secret-cookie")
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture()
def server() -> Iterator[str]:
    _Handler.hits = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


PROGRAM = textwrap.dedent("""
    import asyncio, json, sys
    import httpx, httpx2, requests
    base = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "hello"
    hdr = {"Authorization": "Bearer SECRET", "x-api-key": "SECRET"}
    with httpx2.Client(headers=hdr) as c:
        r = c.post(base + "/v1/chat/completions", json={"prompt": prompt, "k": [1, 2]})
        print("httpx2", r.status_code, r.json())
        with c.stream("GET", base + "/sse") as s:
            print("sse", [chunk for chunk in s.iter_raw()])
    with httpx.Client(headers=hdr) as c:
        echoed = c.get(base + "/plain?api_key=SECRET").json()
        print("httpx", echoed["n"], file=sys.stdout)
        print("echoed", echoed["path"], file=sys.stderr)
    async def main():
        async with httpx2.AsyncClient(headers=hdr) as c:
            r = await c.post(base + "/v1/messages", json={"m": prompt})
            print("async", r.json())
    asyncio.run(main())
    s = requests.Session()
    print("requests", s.get(base + "/flaky", headers=hdr).status_code,
          s.get(base + "/flaky", headers=hdr).json())
    print("requests-post", s.post(base + "/echo", data=b"raw-bytes").json())
    import aiohttp
    async def aio():
        async with aiohttp.ClientSession(headers=hdr) as sess:
            async with sess.post(base + "/aio", json={"q": prompt}) as r:
                print("aiohttp", r.status, await r.json())
            async with sess.get(base + "/sse") as r:
                print("aiohttp-sse", (await r.read()).count(b"data:"))
    asyncio.run(aio())
""").replace("SECRET", SECRET)


def _run(tmp: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    prog = tmp / "prog.py"
    prog.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(prog), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _record(tmp: Path, base: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    store_dir = tmp / "store"
    with Store(store_dir, settings=StoreSettings(segment_bytes=1 << 20)) as st:
        srv = ExchangeServer(st, "run", tmp / "x.sock")
        try:
            res = _run(tmp, hook_env("record", sock=str(tmp / "x.sock"), store=str(store_dir)),
                       base, *args)
        finally:
            srv.close()
        assert not srv.errors, srv.errors
    return res, store_dir


def _replay(tmp: Path, store_dir: Path, base: str, *args: str,
            lenient: bool = False) -> subprocess.CompletedProcess[str]:
    tape = tmp / "tape"
    events = list(StoreReader(store_dir).events(traj="run"))
    prepare_py_tape(events, tape, BlobStore(store_dir / "blobs"))
    return _run(tmp, hook_env("replay", tape=str(tape), lenient=lenient), base, *args)


def test_record_then_replay_offline_is_identical(tmp_path: Path, server: str) -> None:
    rec, store_dir = _record(tmp_path, server)
    assert rec.returncode == 0, rec.stderr
    hits = len(_Handler.hits)
    assert hits == 9  # flaky is asked twice
    kinds = [e.body["channel"] for e in StoreReader(store_dir).events(traj="run")
             if e.kind == "Exchange"]  # (effects have a ToolIntent too)
    assert kinds.count("model") == 2 and kinds.count("http") == 7
    rep = _replay(tmp_path, store_dir, server)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout
    assert len(_Handler.hits) == hits, "replay must not touch the network"
    assert "'i': 4" in rep.stdout or '"i": 4' in rep.stdout


def test_sse_chunk_boundaries_are_kept(tmp_path: Path, server: str) -> None:
    rec, store_dir = _record(tmp_path, server)
    assert rec.returncode == 0, rec.stderr
    sse = next(e for e in StoreReader(store_dir).events(traj="run")
               if e.kind == "Exchange" and e.body["request"]["url"].endswith("/sse"))
    assert len(sse.body["response"]["chunks"]) >= 5


def test_no_secret_byte_reaches_disk(tmp_path: Path, server: str) -> None:
    rec, store_dir = _record(tmp_path, server)
    assert rec.returncode == 0, rec.stderr
    for f in store_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET.encode() not in data, f
            assert b"very-secret-cookie" not in data, f


def test_changed_request_stops_replay_with_a_json_diff(tmp_path: Path, server: str) -> None:
    rec, store_dir = _record(tmp_path, server, "hello")
    assert rec.returncode == 0, rec.stderr
    rep = _replay(tmp_path, store_dir, server, "changed prompt")
    assert rep.returncode == 86
    assert "$.prompt" in rep.stderr and "changed prompt" in rep.stderr
    report = (tmp_path / "tape" / "divergence-py.jsonl").read_text().splitlines()
    first = json.loads(report[0])
    assert first["channel"] == "model" and first["position"] == 0


def test_lenient_replay_lists_divergences_and_goes_on(tmp_path: Path, server: str) -> None:
    rec, store_dir = _record(tmp_path, server, "hello")
    assert rec.returncode == 0, rec.stderr
    rep = _replay(tmp_path, store_dir, server, "other", lenient=True)
    assert rep.returncode == 0, rep.stderr
    report = (tmp_path / "tape" / "divergence-py.jsonl").read_text().splitlines()
    assert len(report) == 3  # the three calls whose body carries the prompt
