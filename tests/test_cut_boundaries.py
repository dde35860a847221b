"""A kill at each boundary of a program's own conversation with a service, placed there
on purpose rather than by chance (issue "Resume through other programs", item 4).

The lost payment: a run killed after a connection was made (and synced: the tape's cut)
but before its first byte left. No intent was durable, so the payment was *not sent*;
the resume cut at the connect, the process went live with nothing sent on it, and its
first send was refused as if it had been made already: the tool printed a failure, the
run ended 0, and the payment was never made. A process that goes live before a request
must make it (with its intent first), once.

Each program here connects, says so (a file), waits, then pays: the test kills the whole
tree while it waits. The services are real (an HTTP effect service, a line-protocol
ledger on loopback) and count what they did.
"""

from __future__ import annotations

import os
import socketserver
import sys
import threading
import time
from pathlib import Path

import pytest
from crashes import Run, go, service, started

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)

HTTP_PAY = r"""
import json, socket, sys, time
host, port, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, port))
open(mark, "w").close()  # connected: the test kills the tree here
time.sleep(3)
body = json.dumps({"amount": 7, "to": "acct-B"}).encode()
s.sendall(b"POST /payments HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (host.encode(), port, len(body))
          + body)
got = b""
while chunk := s.recv(65536):
    got += chunk
print("receipt", got.split(b"\r\n\r\n", 1)[-1].decode(), flush=True)
"""

LINE_PAY = r"""
import socket, sys, time
host, port, mark = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, port))
open(mark, "w").close()  # connected: the test kills the tree here
time.sleep(3)
s.sendall(b"PAY 7 acct-B\n")
print("ledger says", s.makefile().readline().strip(), flush=True)
"""


class Ledger(socketserver.ThreadingTCPServer):
    """A service that speaks no HTTP: one ``PAY n to`` line, answered ``OK <id>``."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self) -> None:
        self.paid: list[str] = []
        self.lock = threading.Lock()
        ledger = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode().strip()
                if not line.startswith("PAY "):
                    return
                with ledger.lock:
                    ledger.paid.append(line)
                    n = len(ledger.paid)
                self.wfile.write(f"OK pay_{n}\n".encode())

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _kill_when(run: Run, mark: Path) -> threading.Thread:
    """SIGKILL the run's group once ``mark`` exists (the program is connected, waiting)."""
    import signal

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if mark.exists() and run.proc is not None:
                time.sleep(0.3)  # the connect's sync is long done; the send is 3 s away
                run.killed.set()
                os.killpg(run.proc.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _crash_then_resume(tmp_path: Path, program: str, host: str, port: int) -> str:
    (tmp_path / "agent.py").write_text(program)
    store, mark = tmp_path / "store", tmp_path / "connected"
    run = Run(kill=None)
    watcher = _kill_when(run, mark)
    go(run, [*CLI, "record", "--store", str(store), "--traj", "t", "--workspace", "none",
             "--", PY, "agent.py", host, str(port), str(mark)], tmp_path, _env())
    watcher.join(5)
    assert run.killed.is_set() and started(store)
    mark.unlink()
    res = go(Run(kill=None, resume=True), [*CLI, "resume", str(store), "t"], tmp_path, _env())
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_a_kill_between_a_connect_and_its_first_byte_loses_no_payment(
        tmp_path: Path) -> None:
    current = [Run(kill=None)]
    with service(current) as svc:
        host, port = svc.url.removeprefix("http://").split(":")
        out = _crash_then_resume(tmp_path, HTTP_PAY, host, int(port))
        assert [p["to"] for p in svc.payments] == ["acct-B"], (out, svc.payments)
        assert 'receipt {"id": "pay_1"' in out, out


def test_a_raw_connection_killed_before_its_first_byte_is_made_once(tmp_path: Path) -> None:
    ledger = Ledger()
    try:
        out = _crash_then_resume(tmp_path, LINE_PAY, "127.0.0.1", ledger.server_address[1])
        assert ledger.paid == ["PAY 7 acct-B"], (out, ledger.paid)
        assert "ledger says OK pay_1" in out, out
    finally:
        ledger.shutdown()
        ledger.server_close()


@pytest.mark.parametrize("program", ["http", "line"])
def test_the_kill_lands_after_the_connect_sync(tmp_path: Path, program: str) -> None:
    """The boundary itself: the log holds the connect (a cut) and no intent."""
    from stenograph.recorder.reader import StoreReader

    ledger = Ledger()
    try:
        src = HTTP_PAY if program == "http" else LINE_PAY
        (tmp_path / "agent.py").write_text(src)
        store, mark = tmp_path / "store", tmp_path / "connected"
        run = Run(kill=None)
        _kill_when(run, mark)
        go(run, [*CLI, "record", "--store", str(store), "--traj", "t", "--workspace",
                 "none", "--", PY, "agent.py", "127.0.0.1", str(ledger.server_address[1]),
                 str(mark)], tmp_path, _env())
        kinds = [(e.kind, e.body.get("cut")) for e in StoreReader(store).events(traj="t")]
        assert ("TapeChunk", True) in kinds and not any(k == "ToolIntent" for k, _ in kinds)
    finally:
        ledger.shutdown()
        ledger.server_close()
