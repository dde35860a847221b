"""Replay touches nothing: every connection a process of the recorded tree makes to a
peer outside it is on the socket tape (CH_NET), and replay serves it (issue "Replay
touches nothing", its first part).

The tools an agent's ``pay`` step really uses -- ``curl``, the standard library's
``urllib``, a Node ``fetch``, ``psql`` against a real PostgreSQL -- each make one payment
against a real peer that counts what reaches it. Recorded once, then replayed with the
peer running (nothing reaches it: its own count) and with the peer stopped: both
replays bit-identical. A program that sends something else at replay diverges, naming
the connection and both sends. A UDP exchange (what a resolver does) and a 1 MiB
download replay with their peer gone. Nothing here is mocked: the peers are real
servers on 127.0.0.1 and the clients are the installed programs.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pay_tools import PAY
from pg_cluster import postgres, rows

from stenograph.testing.effect_service import EffectService
from stenograph.testing.tapes import tape_connects

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
REPLAYS = int(os.environ.get("STENO_SOCKET_REPLAYS", "1"))
"""Replays of each recording with its peer gone (``make soak``: 10)."""


PSQL = """
import subprocess, sys
host, port = sys.argv[1], sys.argv[2]
out = subprocess.run(["psql", "-X", "-h", host, "-p", port, "-U", "postgres", "-d", "postgres",
                      "-c", "INSERT INTO payments(amount, dest) VALUES (7, 'acct-A') "
                            "RETURNING id, amount, dest, now() > '2000-01-01'"],
                     capture_output=True, text=True)
print("receipt", out.stdout, out.stderr, out.returncode)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _record(steno: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", *argv], cwd=cwd,
                         env=_env(), capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0, rec.stderr
    return rec


def _replay(steno: Path, cwd: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    rep = subprocess.run([*CLI, "replay", "--json", str(steno), *extra], cwd=cwd, env=_env(),
                         capture_output=True, text=True, timeout=180)
    return rep.returncode, json.loads(rep.stdout.splitlines()[-1])


def _identical(code: int, report: dict[str, Any]) -> None:
    assert code == 0 and report["divergences"] == [], report
    assert all(report["identical"].values()) and "refused" not in report, report


def _all_identical(steno: Path, cwd: Path) -> None:
    """REPLAYS replays, each bit-identical."""
    for _ in range(REPLAYS):
        _identical(*_replay(steno, cwd))


@pytest.mark.parametrize("tool", sorted(PAY))
def test_a_replay_serves_the_payment_with_the_peer_running_and_stopped(
        tmp_path: Path, tool: str) -> None:
    if tool in ("curl", "node") and not shutil.which(tool):
        pytest.skip(f"{tool} is not installed")
    (tmp_path / "pay.py").write_text(PAY[tool])
    steno = tmp_path / "pay.steno"
    svc = EffectService().start()
    try:
        rec = _record(steno, [PY, "pay.py", svc.url], tmp_path)
        assert "acct-A" in rec.stdout and "pay_1" in rec.stdout, rec.stdout
        assert svc.stats()["payments"] == 1
        _identical(*_replay(steno, tmp_path))
        assert svc.stats()["payments"] == 1, "the replay reached the payment service"
        assert svc.stats()["requests"] == 1
    finally:
        svc.stop()
    _all_identical(steno, tmp_path)  # the peer is gone: served all the same


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
def test_a_different_send_is_a_divergence_naming_the_connection(tmp_path: Path) -> None:
    (tmp_path / "pay.py").write_text(PAY["curl"])
    (tmp_path / "pay2.py").write_text(PAY["curl"].replace('"amount": 7', '"amount": 9'))
    steno = tmp_path / "pay.steno"
    with EffectService() as svc:
        _record(steno, [PY, "pay.py", svc.url], tmp_path)
        rep = subprocess.run([*CLI, "replay", str(steno), "--", PY, "pay2.py", svc.url],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=180)
        assert svc.stats()["payments"] == 1
    assert rep.returncode == 1, rep.stderr
    port = svc.url.rsplit(":", 1)[1]
    line = next(ln for ln in rep.stderr.splitlines() if "recorded:" in ln)
    assert f"tcp 127.0.0.1:{port}" in line and '\\"amount\\": 7' not in line, rep.stderr
    assert "POST /payments" in line, rep.stderr
    asked = next(ln for ln in rep.stderr.splitlines() if "asked:" in ln)
    assert "a send of" in asked and "POST /payments" in asked, rep.stderr


@pytest.mark.skipif(not shutil.which("psql"), reason="psql is not installed")
def test_psql_against_a_real_postgres_replays_with_the_server_running_and_stopped(
        tmp_path: Path) -> None:
    (tmp_path / "pay.py").write_text(PSQL)
    tcp, unix = tmp_path / "tcp.steno", tmp_path / "unix.steno"
    with postgres() as (host, port, sockdir):
        rec = _record(tcp, [PY, "pay.py", host, str(port)], tmp_path)
        assert "acct-A" in rec.stdout and "INSERT 0 1" in rec.stdout, rec.stdout
        _record(unix, [PY, "pay.py", str(sockdir), str(port)], tmp_path)  # libpq's unix socket
        assert rows(port) == 2
        _identical(*_replay(tcp, tmp_path))
        _identical(*_replay(unix, tmp_path))
        assert rows(port) == 2, "the replay inserted a row"
    _all_identical(tcp, tmp_path)  # the cluster is gone
    _all_identical(unix, tmp_path)


UDP = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect(("127.0.0.1", int(sys.argv[1])))
for q in (b"pay.example A?", b"pay.example AAAA?"):
    s.send(q)
    print(q.decode(), "->", s.recv(512).decode())
"""


def test_a_udp_exchange_replays_with_its_peer_gone(tmp_path: Path) -> None:
    """What a stub resolver does (a connected datagram socket, a query, a timed wait, an
    answer): served from the tape after the peer is gone."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    seen: list[bytes] = []

    def answer() -> None:
        while True:
            try:
                data, peer = srv.recvfrom(512)
            except OSError:
                return
            seen.append(data)
            srv.sendto(data.upper().replace(b"?", b" 127.0.0." + str(len(seen)).encode()), peer)

    threading.Thread(target=answer, daemon=True).start()
    (tmp_path / "q.py").write_text(UDP)
    steno = tmp_path / "q.steno"
    rec = _record(steno, [PY, "q.py", str(port)], tmp_path)
    assert "127.0.0.2" in rec.stdout and len(seen) == 2, rec.stdout
    srv.close()
    _all_identical(steno, tmp_path)
    assert len(seen) == 2


class _Blob(BaseHTTPRequestHandler):
    body = bytes(range(256)) * 4096  # 1 MiB

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
def test_a_mebibyte_download_replays_byte_for_byte_with_the_server_gone(tmp_path: Path) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Blob)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/blob"
    steno = tmp_path / "get.steno"
    rec = _record(steno, ["sh", "-c", f"curl -s {url} | sha256sum"], tmp_path)
    srv.shutdown()
    srv.server_close()
    assert hashlib.sha256(_Blob.body).hexdigest() in rec.stdout
    _all_identical(steno, tmp_path)


@pytest.mark.skipif(not shutil.which("redis-server") or not shutil.which("redis-cli"),
                    reason="redis is not installed (make test installs it)")
def test_redis_cli_replays_with_the_server_running_and_stopped(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
    try:
        for _ in range(200):
            if subprocess.run([*cli, "PING"], capture_output=True, text=True).stdout == "PONG\n":
                break
            time.sleep(0.05)
        steno = tmp_path / "r.steno"
        rec = _record(steno, ["sh", "-c", " ".join(cli) + " INCR payments; "
                              + " ".join(cli) + " LPUSH paid acct-A"], tmp_path)
        assert rec.stdout.split() == ["1", "1"], rec.stdout
        _identical(*_replay(steno, tmp_path))
        got = subprocess.run([*cli, "GET", "payments"], capture_output=True, text=True)
        assert got.stdout.strip() == "1", "the replay reached redis"
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    _all_identical(steno, tmp_path)


TLS_CLIENT = """
import ssl, subprocess, sys, urllib.request
url = sys.argv[1]
print(subprocess.run(["curl", "-sk", "-X", "POST", url, "-d", "amount=3"],
                     capture_output=True, text=True).stdout)
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
print(urllib.request.urlopen(urllib.request.Request(url, data=b"amount=4"), context=ctx).read())
"""


class _Pay(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"paid " + self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.skipif(not shutil.which("curl") or not shutil.which("openssl"),
                    reason="curl or openssl is not installed")
def test_tls_needs_nothing_special(tmp_path: Path) -> None:
    """curl (OpenSSL) and urllib (Python's ssl) over https: the handshake's randomness
    and clocks are on the tape already, so the bytes sent repeat and the replay is
    served with the server gone."""
    import ssl

    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(certs / "k.pem"), "-out", str(certs / "c.pem"), "-days", "2",
                    "-subj", "/CN=127.0.0.1"], check=True, capture_output=True, timeout=60)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Pay)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "c.pem", certs / "k.pem")
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    work = tmp_path / "w"
    work.mkdir()
    (work / "tls.py").write_text(TLS_CLIENT)
    steno = tmp_path / "tls.steno"
    rec = _record(steno, [PY, "tls.py", f"https://127.0.0.1:{srv.server_address[1]}/pay"],
                  work)
    srv.shutdown()
    srv.server_close()
    assert "paid amount=3" in rec.stdout and "paid amount=4" in rec.stdout, rec.stdout
    _all_identical(steno, work)


@pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")
def test_git_clone_over_http_replays_with_the_server_gone(tmp_path: Path) -> None:
    """git's http helper (a child of git, on libcurl) fetching a repository from a
    plain web server (git's "dumb" protocol)."""
    site = tmp_path / "site"
    env = {**_env(), "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}
    src = tmp_path / "src"
    for argv in (["git", "init", "-q", "--bare", str(site / "repo.git")],
                 ["git", "init", "-q", str(src)]):
        subprocess.run(argv, check=True, env=env, timeout=60)
    (src / "README").write_text("deployed by the agent\n")
    for argv in (["git", "add", "README"], ["git", "commit", "-qm", "first"],
                 ["git", "push", "-q", str(site / "repo.git"), "HEAD:master"]):
        subprocess.run(argv, cwd=src, check=True, env=env, timeout=60)
    subprocess.run(["git", "update-server-info"], cwd=site / "repo.git", check=True, timeout=60)

    class Static(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=str(site), **k)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Static)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    work = tmp_path / "w"
    work.mkdir()
    url = f"http://127.0.0.1:{srv.server_address[1]}/repo.git"
    steno = tmp_path / "git.steno"
    rec = _record(steno, ["sh", "-c", f"git clone -q {url} c && cat c/README && "
                          "git -C c log --format=%s"], work)
    srv.shutdown()
    srv.server_close()
    assert rec.stdout == "deployed by the agent\nfirst\n", rec.stdout
    _all_identical(steno, work)


MIXED = """
import sys, urllib.request
import httpx, requests
url = sys.argv[1] + "/payments"
body = b'{"amount": 7, "to": "acct-A"}'
h = {"Content-Type": "application/json"}
print(requests.post(url, data=body, headers=h, timeout=10).json()["id"])
print(httpx.post(url, content=body, headers=h, timeout=10).json()["id"])
req = urllib.request.Request(url, data=body, headers=h)
print(urllib.request.urlopen(req, timeout=10).read().decode())
"""


def test_hooked_http_is_not_taped_twice(tmp_path: Path) -> None:
    """requests and httpx are recorded as exchanges (their hooks run the real call with
    the tape paused); urllib beside them, which no hook knows, is on the socket tape."""
    (tmp_path / "mixed.py").write_text(MIXED)
    steno = tmp_path / "mixed.steno"
    with EffectService() as svc:
        rec = _record(steno, [sys.executable, "mixed.py", svc.url], tmp_path)
        assert rec.stdout.splitlines()[:2] == ["pay_1", "pay_2"], rec.stdout
        assert "2 exchanges" in rec.stderr, rec.stderr
        assert tape_connects(steno) == [f"127.0.0.1:{svc.url.rsplit(':', 1)[1]}"]
    _all_identical(steno, tmp_path)


@pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")
def test_a_build_replay_serves_recorded_connections_and_fails_on_a_new_one(
        tmp_path: Path) -> None:
    """The build under test is the user's code: its recorded curl payment is served from
    the socket tape; a payment the recording never made is refused (nothing reaches the
    service) and fails the build as an unrecorded call."""
    (tmp_path / "pay.py").write_text(PAY["curl"])
    steno = tmp_path / "pay.steno"
    with EffectService() as svc:
        _record(steno, [PY, "pay.py", svc.url], tmp_path)
        same = subprocess.run([*CLI, "replay", "--build", "--json", str(steno)], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=180)
        assert same.returncode == 0, same.stdout[-3000:]
        (tmp_path / "pay.py").write_text(PAY["curl"] + PAY["curl"].replace("acct-A", "acct-B"))
        more = subprocess.run([*CLI, "replay", "--build", str(steno)], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=180)
        assert svc.stats()["payments"] == 1
    port = svc.url.rsplit(":", 1)[1]
    assert more.returncode == 1, more.stderr
    assert f"net: connect tcp 127.0.0.1:{port} (not in the recording)" in more.stderr, more.stderr
