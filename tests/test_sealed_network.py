"""Sealed means sealed: a replay opens no connection the recording did not make to a
peer outside the recorded tree, loopback included, whatever the client (issue "Replay
touches nothing", its second part; recorded connections are served by the socket tape,
tests/test_socket_tape.py).

An agent's ``pay`` tool as people write it -- ``curl``, the standard library's
``urllib``, a Node ``fetch`` -- against a real loopback payment service that counts
what reaches it: recorded (one payment), then replayed as an edited program that pays a
second time. The recorded payment is served; the new one is refused (nothing reaches
the service), the replay fails, and the report lists the refused connection.
``--allow-network`` is the one way through, and says so. A server the program starts
itself (TCP on a port it picked, an AF_UNIX socket) is inside the tree: both ends replay
live, bit-identical, under the mount namespace and under path mapping. A resume after a
crash at a curl payment never pays twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pay_tools import PAY
from steno_cli import why

from stenograph.testing.effect_service import EffectService
from stenograph.testing.tapes import tape_connects

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)



def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


@pytest.mark.parametrize("tool", sorted(PAY))
def test_a_replay_pays_no_one_again(tmp_path: Path, tool: str) -> None:
    if tool in ("curl", "node") and not shutil.which(tool):
        pytest.skip(f"{tool} is not installed")
    (tmp_path / "pay.py").write_text(PAY[tool])
    (tmp_path / "pay2.py").write_text(PAY[tool] + PAY[tool].replace("acct-A", "acct-B"))
    steno = tmp_path / "pay.steno"
    edited = ["--lenient", "--", PY, "pay2.py"]
    with EffectService() as svc:
        rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, "pay.py", svc.url],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=120)
        assert rec.returncode == 0, rec.stderr
        assert '"to": "acct-A"' in rec.stdout or "acct-A" in rec.stdout, rec.stdout
        assert svc.stats()["payments"] == 1
        rep = subprocess.run([*CLI, "replay", "--json", str(steno), *edited, svc.url],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=120)
        assert svc.stats()["payments"] == 1, "the replay paid again"
        report = json.loads(rep.stdout.splitlines()[-1])
        port = svc.url.rsplit(":", 1)[1]
        assert any(f"127.0.0.1:{port}" in r for r in report.get("refused", [])), report
        assert rep.returncode == 1  # it cannot be the recorded run: it was refused
        if tool == "curl":  # the line a person reads (once: it is the same for all)
            said = subprocess.run([*CLI, "replay", str(steno), *edited, svc.url],
                                  cwd=tmp_path, env=_env(), capture_output=True, text=True,
                                  timeout=120)
            notes = [ln for ln in said.stderr.splitlines() if "refused" in ln and "note" in ln]
            assert len(notes) == 1 and "--allow-network" in notes[0], said.stderr
            assert svc.stats()["payments"] == 1
        live = subprocess.run([*CLI, "replay", "--allow-network", str(steno), *edited,
                               svc.url], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=120)
        assert "--allow-network" in live.stderr, live.stderr
        assert svc.stats()["payments"] == 2  # the new one only, the one way through
        assert svc.payments[-1]["to"] == "acct-B", svc.payments


OWN = """
import os, socket, subprocess, sys
tcp = subprocess.Popen([sys.executable, "-c",
    "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); c, _ = s.accept(); "
    "c.sendall(c.recv(100).upper()); c.close()"], stdout=subprocess.PIPE, text=True)
port = int(tcp.stdout.readline())
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"hello")
print("tcp", c.recv(100))
c.close()
tcp.wait()
unix = subprocess.Popen([sys.executable, "-c",
    "import socket; s = socket.socket(socket.AF_UNIX); s.bind('own.sock'); s.listen(); "
    "print('up', flush=True); c, _ = s.accept(); c.sendall(c.recv(100)[::-1]); c.close()"],
    stdout=subprocess.PIPE, text=True)
unix.stdout.readline()
c = socket.socket(socket.AF_UNIX)
c.connect(os.path.abspath("own.sock"))
c.sendall(b"abc")
print("unix", c.recv(10))
unix.wait()
"""


@pytest.mark.parametrize("seal", ["namespace", "path-map"])
def test_a_server_the_program_starts_itself_replays_live_at_both_ends(
        tmp_path: Path, seal: str) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "own.py").write_text(OWN)
    steno = tmp_path / "own.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, "own.py"], cwd=work,
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0 and "unix b'cba'" in rec.stdout, rec.stderr
    assert tape_connects(steno) == []  # the tree's own peers: live, not on the socket tape
    env = {**_env(), **({"STENOGRAPH_SEAL": "path-map"} if seal == "path-map" else {})}
    for _ in range(2):
        rep = subprocess.run([*CLI, "replay", "--json", str(steno)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
        report = json.loads(rep.stdout.splitlines()[-1])
        assert rep.returncode == 0 and report["divergences"] == [], report
        assert all(report["identical"].values()) and "refused" not in report, report


OWN_HTTP = """
import asyncio, socket, subprocess, sys, time
import aiohttp, httpx, requests, urllib.request
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
srv = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", "site",
                        str(port)])
while True:
    with socket.socket() as c:
        if c.connect_ex(("127.0.0.1", port)) == 0:
            break
    time.sleep(0.02)
url = f"http://127.0.0.1:{port}/index.html"
print("requests", requests.get(url, timeout=10).text.strip(), flush=True)
print("httpx", httpx.get(url).text.strip(), flush=True)
with httpx.Client() as c:
    print("httpx client", [c.get(url).status_code for _ in range(3)], flush=True)
async def fetch():
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()
print("aiohttp", asyncio.run(fetch()).strip(), flush=True)
print("urllib", urllib.request.urlopen(url).read().decode().strip(), flush=True)
srv.terminate()
srv.wait()
"""


def test_hooked_http_to_a_server_the_program_starts_is_left_to_the_socket_level(
        tmp_path: Path) -> None:
    """requests, httpx, aiohttp and urllib against ``python -m http.server`` started by
    the program on a port it found with a bind to port 0, polled until it listens (its
    access log on stderr): no HTTP exchange is recorded for the tree's own server, and a
    replay runs both ends, the port, the polling and the log as recorded."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("hello page\n")
    (tmp_path / "own_http.py").write_text(OWN_HTTP)
    steno = tmp_path / "own_http.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, "own_http.py"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert rec.returncode == 0 and "aiohttp hello page" in rec.stdout, rec.stderr
    assert rec.stderr.count('"GET /index.html HTTP/1.1" 200') == 7, rec.stderr
    from stenograph.recorder.trajfile import read_trajectory

    hooked = [e.body.get("fingerprint") for e in read_trajectory(steno).events
              if e.kind == "Exchange" and e.body.get("channel") != "await"]
    assert hooked == [], hooked  # the tree's own server: not an HTTP exchange
    for _ in range(2):
        rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert rep.returncode == 0 and "bit-identical" in rep.stderr, why(rep.stderr)


CURL_AGENT = """
import json, subprocess, sys
import requests
body = json.dumps({"amount": 7, "to": "acct-A"})
out = subprocess.run(["curl", "-s", "-X", "POST", "-H", "Content-Type: application/json",
                      "-d", body, sys.argv[1] + "/payments"], capture_output=True, text=True)
print("receipt", out.stdout, flush=True)
for _ in range(2):  # the agent's next steps: hooked HTTP (exchanges on the tape)
    print("servers", requests.get(sys.argv[1] + "/servers?name=web", timeout=10).json())
"""


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
@pytest.mark.parametrize("kill", [("read", 2), ("applied", 1)], ids=["after-curl", "inside-curl"])
def test_a_resume_after_a_crash_at_a_curl_payment_pays_no_one_again(
        tmp_path: Path, kill: tuple[str, int]) -> None:
    """Killed (the whole group) as the agent's second read arrives, its curl payment and
    one read done: the resumed prefix serves curl its recorded exchange from the socket
    tape, so the agent sees the same receipt and the service no second payment. Killed
    inside curl itself (the payment made, its answer not yet read): the payment's intent
    is durable and its result is not, so the resume stops for a person (exit 4) rather
    than send it again (tests/test_net_effects.py goes on from there)."""
    from crashes import Run, go, service

    (tmp_path / "agent.py").write_text(CURL_AGENT)
    store = tmp_path / "store"
    current = [Run(kill=kill)]
    with service(current) as svc:
        rec = go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--",
                              PY, "agent.py", svc.url], tmp_path, _env())
        assert current[0].killed.is_set(), rec.stderr
        assert svc.stats()["payments"] == 1
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert svc.stats()["payments"] == 1, "the resume paid again"
    if kill[0] == "applied":  # its intent is durable, its answer is not: a person says
        assert res.returncode == 4 and "settle" in res.stderr, res.stderr
        return
    assert res.returncode == 0, res.stderr
    assert "receipt" in res.stdout and "pay_1" in res.stdout, res.stdout
    assert res.stdout.count("servers {") == 2, res.stdout


NODE_FILES = """
import subprocess
js = ("const fs = require('fs'); fs.writeFileSync('out.txt', 'hi'); "
      "fs.readFile(process.cwd() + '/data.txt', 'utf8', (e, d) => "
      "console.log(d.trim(), fs.readdirSync('.').sort().join(','), process.cwd()))")
print(subprocess.run(["node", "-e", js], capture_output=True, text=True).stdout)
"""


@pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
def test_node_reads_and_writes_its_workspace_under_path_mapping(tmp_path: Path) -> None:
    """Node's thread pool opens files from its own threads, each starting under the
    path trap: the handler runs there on a thread's stack, and the shim's own tape files
    pass untrapped (a worker died of SIGSEGV in the handler, node printed nothing)."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "data.txt").write_text("recorded\n")
    (work / "n.py").write_text(NODE_FILES)
    steno = tmp_path / "n.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, "n.py"], cwd=work,
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0 and "recorded data.txt,n.py,out.txt" in rec.stdout, rec.stderr
    (work / "out.txt").unlink()
    (work / "data.txt").write_text("changed since\n")
    rep = subprocess.run([*CLI, "replay", "--json", str(steno)], cwd=work,
                         env={**_env(), "STENOGRAPH_SEAL": "path-map"}, capture_output=True,
                         text=True, timeout=120)
    report = json.loads(rep.stdout.splitlines()[-1])
    assert rep.returncode == 0 and all(report["identical"].values()), report
    assert sorted(os.listdir(work)) == ["data.txt", "n.py"]
    assert (work / "data.txt").read_text() == "changed since\n"
