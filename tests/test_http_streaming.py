"""Streamed HTTP bodies through the real CLI: chunks as they arrive, the end, replay.

Programs are written the way users write them (``requests`` with ``stream=True``,
``aiohttp`` ``iter_chunked``, ``httpx.stream``), recorded with ``stenograph record``
against a chunked server started here on 127.0.0.1, and replayed with
``stenograph replay``: the replayed stdout must be the recorded one, byte for byte.

Why each check: a hook that reads the whole body before the program sees it
merges the chunks (the program printed one where it received many) and, for
requests, never delivered the end of the stream (the program hung). The
``/gate`` route makes "as they arrive" observable: the server sends the first
chunk and holds the rest until the program, having received it, asks ``/open``.
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder.trajfile import read_trajectory

CLI = [sys.executable, "-m", "stenograph"]
GATE_WAIT_S = 5.0
LINES = b"alpha\nbeta\n\ngamma delta\nepsilon\n"


def _content(n: int) -> bytes:
    return (LINES * (n // len(LINES) + 1))[:n]


def _split(data: bytes, parts: int) -> list[bytes]:
    if parts <= 1 or len(data) <= 1:
        return [data]
    cuts = sorted({len(data) * i // parts for i in range(1, parts)} - {0})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits: list[str] = []
    gates: dict[str, threading.Event] = {}

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_HEAD(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("content-length", "123")
        self.end_headers()

    def do_GET(self) -> None:
        self.hits.append(self.path)
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path.startswith("/open/"):
            self.gates.setdefault(url.path[6:], threading.Event()).set()
            return self._send([b"opened"], "length", {})
        if url.path.startswith("/gate/"):
            gate = self.gates.setdefault(url.path[6:], threading.Event())

            def gated() -> Iterator[bytes]:
                yield b"first\n"
                yield b"after-open\n" if gate.wait(GATE_WAIT_S) else b"TIMED-OUT\n"
            return self._send(gated(), "chunked", {})
        sizes = [int(s) for s in q.get("sizes", "8,8,8").split(",") if s]
        body = _content(sum(sizes))
        pieces, at = [], 0
        for n in sizes:
            pieces.append(body[at:at + n])
            at += n
        headers = {}
        if q.get("gzip") == "1":
            pieces = _split(gzip.compress(body, mtime=0), len(sizes))
            headers["content-encoding"] = "gzip"
        self._send(pieces, q.get("mode", "chunked"), headers, ms=int(q.get("ms", "0")),
                   cut=q.get("cut") == "1")

    def _send(self, pieces: Iterable[bytes], mode: str, headers: dict[str, str],
              ms: int = 0, cut: bool = False) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        for k, v in headers.items():
            self.send_header(k, v)
        if mode == "chunked":
            self.send_header("transfer-encoding", "chunked")
        elif mode == "length":
            pieces = list(pieces)
            self.send_header("content-length", str(sum(map(len, pieces)) + 10 * cut))
        else:
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.flush()
        for piece in pieces:
            if ms:
                time.sleep(ms / 1000)
            if mode == "chunked":
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            else:
                self.wfile.write(piece)
            self.wfile.flush()
        if cut:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "chunked":
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        elif mode == "close":
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a program that stops reading half way hangs up: routine here


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


REQUESTS = textwrap.dedent("""
    import gc, hashlib, sys
    import requests
    base, q, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    url = base + "/chunks?" + q
    s = requests.Session()
    r = s.get(url, stream=True)
    print("iter_content(None):", [len(c) for c in r.iter_content(chunk_size=None)])
    r = s.get(url, stream=True)
    print("iter_content(7):", [len(c) for c in r.iter_content(chunk_size=7)])
    r = s.get(url, stream=True)
    print("iter_lines:", list(r.iter_lines()))
    r = s.get(url, stream=True)
    sizes = []
    while True:
        b = r.raw.read(5)
        if not b:
            break
        sizes.append(len(b))
    print("raw.read(5):", sizes)
    r = s.get(url, stream=True)
    print("raw.stream(16):", [len(c) for c in r.raw.stream(16)])
    r = s.get(url)
    print("content:", len(r.content), hashlib.sha256(r.content).hexdigest()[:16])
    print("text:", repr(s.get(url).text[:24]))
    print("head:", s.head(base + "/chunks").headers.get("content-length"))
    r = s.get(url, stream=True)
    first = next(r.iter_content(chunk_size=None), b"")
    r.close()
    print("closed half read:", len(first))
    r = s.get(url, stream=True)
    print("collected half read:", len(next(r.iter_content(chunk_size=3), b"")))
    del r
    gc.collect()
    r = s.get(base + "/gate/requests-" + tag, stream=True)
    it = r.iter_content(chunk_size=None)
    got = [next(it)]
    s.get(base + "/open/requests-" + tag)
    got += list(it)
    print("gate:", got)
""")

AIOHTTP = textwrap.dedent("""
    import asyncio, sys
    import aiohttp
    base, q, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    url = base + "/chunks?" + q

    async def main():
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as r:
                print("iter_any:", [len(c) async for c in r.content.iter_any()])
            async with s.get(url) as r:
                print("iter_chunked(7):", [len(c) async for c in r.content.iter_chunked(7)])
            async with s.get(url) as r:
                print("async for line:", [line async for line in r.content])
            async with s.get(url) as r:
                print("readline:", await r.content.readline(), await r.content.readline())
            async with s.get(url) as r:
                print("read:", len(await r.read()))
            async with s.get(url) as r:
                print("text:", repr((await r.text())[:24]))
            async with s.get(url) as r:
                print("half read:", len(await r.content.readany()))
            async with s.get(base + "/gate/aiohttp-" + tag) as r:
                got = [await r.content.readany()]
                async with s.get(base + "/open/aiohttp-" + tag) as o:
                    await o.read()
                got += [c async for c in r.content.iter_any()]
                print("gate:", got)

    asyncio.run(main())
""")

HTTPX = textwrap.dedent("""
    import sys
    import httpx
    base, q, tag = sys.argv[1], sys.argv[2], sys.argv[3]
    url = base + "/chunks?" + q
    with httpx.Client() as c:
        with c.stream("GET", url) as r:
            print("iter_raw:", [len(x) for x in r.iter_raw()])
        with c.stream("GET", url) as r:
            print("iter_bytes:", [len(x) for x in r.iter_bytes()])
        with c.stream("GET", url) as r:
            print("iter_lines:", list(r.iter_lines()))
        print("read:", len(c.get(url).content))
        with c.stream("GET", base + "/gate/httpx-" + tag) as r:
            it = r.iter_raw()
            got = [next(it)]
            c.get(base + "/open/httpx-" + tag)
            got += list(it)
            print("gate:", got)
""")

BROKEN = {
    "requests": '''
import sys, requests
try:
    r = requests.get(sys.argv[1] + "/chunks?" + sys.argv[2], stream=True)
    for c in r.iter_content(chunk_size=None):
        print("got:", len(c))
except Exception as e:
    print("raised:", type(e).__module__, type(e).__name__, e)
''',
    "aiohttp": '''
import asyncio, sys, aiohttp
async def main():
    async with aiohttp.ClientSession() as s:
        try:
            async with s.get(sys.argv[1] + "/chunks?" + sys.argv[2]) as r:
                async for c in r.content.iter_chunked(6):
                    print("got:", len(c))
        except Exception as e:
            print("raised:", type(e).__module__, type(e).__name__, e)
asyncio.run(main())
''',
    "httpx": '''
import sys, httpx
try:
    with httpx.stream("GET", sys.argv[1] + "/chunks?" + sys.argv[2]) as r:
        for c in r.iter_bytes():
            print("got:", len(c))
except Exception as e:
    print("raised:", type(e).__module__, type(e).__name__, e)
''',
}

PROGRAMS = {"requests": REQUESTS, "aiohttp": AIOHTTP, "httpx": HTTPX,
            **{f"{k}-broken": v for k, v in BROKEN.items()}}


def _run(cmd: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run`` in its own process group, all of which is killed on a timeout:
    a hung recording must not leave the recorded program behind."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, **kwargs)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("STENO_") and k != "LD_PRELOAD"}


def _plain(tmp: Path, lib: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    prog = tmp / f"{lib}_prog.py"
    prog.write_text(PROGRAMS[lib])
    return _run([sys.executable, str(prog), *args], env=_env(), cwd=tmp, timeout=60)


def record_replay(tmp: Path, lib: str, *args: str, flags: tuple[str, ...] = ()
                  ) -> tuple[subprocess.CompletedProcess[bytes],
                             subprocess.CompletedProcess[bytes], Path]:
    """``stenograph record [FLAGS]`` then ``stenograph replay`` of the ``lib`` program."""
    tmp.mkdir(parents=True, exist_ok=True)
    prog = tmp / f"{lib}_prog.py"
    prog.write_text(PROGRAMS[lib])
    out = tmp / f"{lib}.steno"
    rec = _run([*CLI, "record", *flags, "-o", str(out), "--", sys.executable, str(prog), *args],
               env=_env(), cwd=tmp, timeout=90)
    assert out.exists(), rec.stderr.decode()
    rep = _run([*CLI, "replay", str(out)], env=_env(), timeout=90)
    return rec, rep, out


def _lines(p: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in p.stdout.decode().splitlines())


def _exchanges(steno: Path) -> list[dict[str, object]]:
    return [e.body for e in read_trajectory(steno).events
            if e.kind == "Exchange" and e.body.get("channel") in ("http", "model")]


SIZES = "5,17,3,40,1,9"


@pytest.mark.parametrize("lib", sorted(BROKEN))
@pytest.mark.parametrize("mode", ["chunked", "length"])
def test_a_body_cut_mid_stream_replays_as_the_same_error(tmp_path: Path, server: str, lib: str,
                                                         mode: str) -> None:
    rec, rep, steno = record_replay(tmp_path, f"{lib}-broken", server,
                                    f"sizes=5,17,3&ms=15&mode={mode}&cut=1")
    assert rec.returncode == 0, rec.stderr.decode()
    out = rec.stdout.decode()
    assert "raised: " in out, out
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout == rec.stdout
    (x,) = _exchanges(steno)
    assert x["response"]["complete"] is False and x["error"], x  # type: ignore[index]


def test_aiohttp_program_replays_with_the_loop_on_the_tape(tmp_path: Path, server: str) -> None:
    """Every way of reading an aiohttp body, a half-read response whose connection is
    closed and a new one opened after it: with ``--asyncio`` the connection's release
    and close are the library's work, off the tape, and the loop's ticks replay."""
    for r in range(2):
        rec, rep, _ = record_replay(tmp_path / f"r{r}", "aiohttp", server,
                                    f"sizes={SIZES}&ms=15", f"{tmp_path.name}-{r}",
                                    flags=("--asyncio",))
        assert rec.returncode == 0, rec.stderr.decode()
        assert rep.returncode == 0, rep.stderr.decode()[-3000:]
        assert rep.stdout == rec.stdout
        assert b"replay bit-identical" in rep.stderr, rep.stderr.decode()


@pytest.mark.parametrize("lib", ["aiohttp", "httpx", "requests"])
@pytest.mark.parametrize("query", [f"sizes={SIZES}&ms=15", f"sizes={SIZES}&ms=5&gzip=1",
                                   f"sizes={SIZES}&ms=5&mode=length"])
def test_streamed_program_replays_byte_for_byte(tmp_path: Path, server: str, lib: str,
                                                query: str) -> None:
    rec, rep, steno = record_replay(tmp_path, lib, server, query, tmp_path.name)
    assert rec.returncode == 0, rec.stderr.decode()
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout == rec.stdout
    assert b"replay bit-identical" in rep.stderr, rep.stderr.decode()
    got = _lines(rec)
    assert "TIMED-OUT" not in got["gate"], got["gate"]
    assert "after-open" in got["gate"]
    plain = _lines(_plain(tmp_path, lib, server, query, tmp_path.name + "-plain"))
    if lib == "requests":
        # urllib3 reads chunked bodies HTTP chunk by HTTP chunk, and fills fixed-size reads
        # otherwise: what it prints does not depend on timing, so record must be plain.
        assert got == {k: v.replace("-plain", "") for k, v in plain.items()}
        if "gzip" not in query and "length" not in query:
            assert got["iter_content(None)"] == str([int(n) for n in SIZES.split(",")])
    else:
        first_key = "iter_any" if lib == "aiohttp" else "iter_raw"
        assert got["iter_lines" if lib == "httpx" else "async for line"] == \
            plain["iter_lines" if lib == "httpx" else "async for line"]
        if "gzip" not in query and "length" not in query:
            assert len(eval(got[first_key])) > 1  # many chunks, not one
    if "mode" not in query and "gzip" not in query:
        # bodies the program stopped reading half way (closed, collected, or left behind
        # by readline / one readany) are committed, marked incomplete
        halves = [x for x in _exchanges(steno) if x["response"] and
                  not x["response"]["complete"]]  # type: ignore[index]
        assert len(halves) == {"requests": 2, "aiohttp": 2, "httpx": 0}[lib]


def test_requests_iter_content_none_used_to_hang(tmp_path: Path, server: str) -> None:
    """The user's report: stream=True, iter_content(None) over SSE printed one chunk under
    record, and never saw the end of the stream."""
    prog = tmp_path / "sse.py"
    prog.write_text(textwrap.dedent("""
        import sys, requests
        r = requests.get(sys.argv[1] + "/chunks?sizes=8,8,8,8,8&ms=20", stream=True)
        for c in r.iter_content(chunk_size=None):
            print(len(c), flush=True)
        print("end of stream")
    """))
    out = tmp_path / "sse.steno"
    rec = _run([*CLI, "record", "-o", str(out), "--", sys.executable, str(prog), server],
               env=_env(), cwd=tmp_path, timeout=30)
    assert rec.returncode == 0, rec.stderr.decode()
    assert rec.stdout == b"8\n8\n8\n8\n8\nend of stream\n"
    rep = _run([*CLI, "replay", str(out)], env=_env(), timeout=30)
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout == rec.stdout
    (x,) = _exchanges(out)
    assert x["response"]["chunks"] == [8, 8, 8, 8, 8]  # type: ignore[index]
    assert x["response"]["complete"] is True  # type: ignore[index]


@settings(max_examples=examples(9, least=2), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
       ms=st.sampled_from([0, 0, 3, 12]), gz=st.booleans(),
       mode=st.sampled_from(["chunked", "chunked", "length", "close"]))
def test_generated_chunkings_replay_identically(scratch: object, server: str, sizes: list[int],
                                                ms: int, gz: bool, mode: str) -> None:
    """Whatever the chunk sizes and the pauses between them, each library's recorded
    program and its replay print the same chunk lists."""
    query = f"sizes={','.join(map(str, sizes))}&ms={ms}&mode={mode}&gzip={int(gz)}"
    tmp = scratch()  # type: ignore[operator]
    for lib in ("requests", "aiohttp", "httpx"):
        rec, rep, _ = record_replay(tmp / lib, lib, server, query, tmp.name)
        assert rec.returncode == 0, rec.stderr.decode()
        assert rep.returncode == 0, (query, rep.stderr.decode())
        assert rep.stdout == rec.stdout, query


SSE_PROGRAM = textwrap.dedent("""
    import json, sys
    import requests
    r = requests.post(sys.argv[1] + "/chat/completions", stream=True,
                      headers={"Authorization": "Bearer sk-test", "x-steno-test":
                               "chunk_delay_ms=10"},
                      json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]})
    for c in r.iter_content(chunk_size=None):
        print("chunk", len(c), flush=True)
    r = requests.post(sys.argv[1] + "/chat/completions", stream=True,
                      headers={"Authorization": "Bearer sk-test"},
                      json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]})
    text = ""
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    print("text", repr(text))
""")


def test_requests_sse_from_the_model_server_replays_chunk_by_chunk(tmp_path: Path) -> None:
    """The user's program: a streamed chat completion read with ``stream=True`` and
    ``iter_content(chunk_size=None)``, against the loopback model server (stopped before
    the replay)."""
    from stenograph.testing.model_server import ModelServer

    prog = tmp_path / "sse_chat.py"
    prog.write_text(SSE_PROGRAM)
    out = tmp_path / "sse_chat.steno"
    srv = ModelServer(script=[{"text": "one two three four five"}]).start()
    try:
        rec = _run([*CLI, "record", "-o", str(out), "--", sys.executable, str(prog),
                    srv.openai_base_url], env=_env(), cwd=tmp_path, timeout=60)
    finally:
        srv.stop()
    assert rec.returncode == 0, rec.stderr.decode()
    chunks = [line for line in rec.stdout.decode().splitlines() if line.startswith("chunk")]
    assert len(chunks) >= 6, rec.stdout.decode()  # one per SSE event, not the whole body
    assert "text 'one two three four five'" in rec.stdout.decode()
    x = _exchanges(out)[0]
    assert len(x["response"]["chunks"]) == len(chunks)  # type: ignore[index]
    rep = _run([*CLI, "replay", str(out)], env=_env(), timeout=60)
    assert rep.returncode == 0, rep.stderr.decode()
    assert rep.stdout == rec.stdout
