"""Real agents recorded and replayed through the real CLI, the real shim and real SDKs.

Every recording is made by ``python -m stenograph record`` against the loopback
``ModelServer`` (started in this process on 127.0.0.1). The server is stopped before
any replay, so a replay that touched the network would fail; replay also runs with
networking refused (the default). Recordings are module-scoped and shared: the SDK
imports make each run take seconds.

* ``examples/agents_extra/clients.py``: one section per client (openai and anthropic
  SDKs sync / async / streaming, a retried 500, a timeout, plain httpx, requests,
  aiohttp, a tool run as a Python subprocess that calls HTTP itself).
* ``examples/agent.py``: the demo agent end to end, and a copy whose third request
  differs, to check the divergence report and ``--lenient``.

Programs run with the virtualenv's interpreter (``sys.executable``, not its real
path): the SDKs are installed in the virtualenv, and the base interpreter's own
site-packages would shadow some of them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stenograph.recorder.codec import Event
from stenograph.recorder.trajfile import read_trajectory
from stenograph.testing.model_server import ModelServer, ReceivedRequest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLIENTS = EXAMPLES / "agents_extra" / "clients.py"
CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable

OPENAI_KEY = "sk-test-OPENAI-5f1e2d3c4b5a69788796"
ANTHROPIC_KEY = "sk-ant-test-ANTHROPIC-0a1b2c3d4e5f6071"
COOKIE = "cookie-secret-SESSION-9e8d7c6b5a"

sys.path.insert(0, str(CLIENTS.parent))
from clients import SCRIPT  # noqa: E402

sys.path.remove(str(CLIENTS.parent))


@dataclass
class Run:
    steno: Path
    rec: subprocess.CompletedProcess[bytes]
    rep: subprocess.CompletedProcess[bytes]
    server_requests: list[ReceivedRequest]
    port: int
    record_s: float
    replay_s: float
    events: list[Event] = field(default_factory=list)

    def lines(self, which: str) -> dict[str, str]:
        out = (self.rec if which == "rec" else self.rep).stdout.decode()
        return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)

    def exchanges(self) -> list[dict[str, Any]]:
        return [e.body for e in self.events
                if e.kind == "Exchange" and e.body.get("channel") in ("http", "model")]

    def started(self) -> dict[str, Any]:
        return next(e.body for e in self.events if e.kind == "RunStarted")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STENO_", "OPENAI_", "ANTHROPIC_")) and k != "LD_PRELOAD"}
    env.update(extra)
    return env


def _record(tmp: Path, name: str, argv: list[str], env: dict[str, str],
            cwd: Path) -> tuple[Path, subprocess.CompletedProcess[bytes], float]:
    out = tmp / f"{name}.steno"
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "record", "-o", str(out), "--", *argv], cwd=cwd, env=env,
                       capture_output=True, timeout=120)
    took = time.monotonic() - t0
    assert out.exists(), p.stderr.decode()
    return out, p, took


def _replay(steno: Path, *extra: str, env: dict[str, str] | None = None,
            ) -> tuple[subprocess.CompletedProcess[bytes], float]:
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "replay", str(steno), *extra], env=env or _env(),
                       capture_output=True, timeout=120)
    return p, time.monotonic() - t0


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("clients")
    srv = ModelServer(script=SCRIPT).start()
    port = srv.port
    env = _env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY=OPENAI_KEY,
               ANTHROPIC_BASE_URL=srv.anthropic_base_url, ANTHROPIC_API_KEY=ANTHROPIC_KEY,
               SESSION_COOKIE=COOKIE)
    try:
        steno, rec, rec_s = _record(tmp, "clients", [PY, str(CLIENTS), srv.url,
                                                     str(_free_port())], env, tmp)
    finally:
        srv.stop()
    seen = srv.requests
    rep, rep_s = _replay(steno)  # no key, no cookie, no server
    run = Run(steno, rec, rep, seen, port, rec_s, rep_s,
              list(read_trajectory(steno).events))
    assert len(srv.requests) == len(seen)
    yield run


AGENT_V2_PATCH = (
    "        reply = client.chat.completions.create(",
    "        if step == 3:  # the changed harness: a different prompt at turn 3\n"
    "            messages[1] = {**messages[1], \"content\": task + \" Be brief.\"}\n"
    "        reply = client.chat.completions.create(",
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """examples/agent.py recorded where it lives (its workdir is examples/)."""
    tmp = tmp_path_factory.mktemp("agent")
    srv = ModelServer(script=EXAMPLES / "agent_script.json").start()
    port = srv.port
    env = _env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY=OPENAI_KEY)
    try:
        steno, rec, rec_s = _record(tmp, "agent", [PY, str(EXAMPLES / "agent.py")], env, tmp)
    finally:
        srv.stop()
    rep, rep_s = _replay(steno)
    yield Run(steno, rec, rep, srv.requests, port, rec_s, rep_s,
              list(read_trajectory(steno).events))


@pytest.fixture(scope="module")
def agent_copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A copy of the demo agent recorded in a scratch workdir next to ``agent_v2.py``,
    the same agent with a different prompt at turn 3 (both files exist at record time, so
    the directory listings the two runs see are the same)."""
    tmp = tmp_path_factory.mktemp("agent_copy")
    work = tmp / "work"
    work.mkdir()
    src = (EXAMPLES / "agent.py").read_text()
    assert src.count(AGENT_V2_PATCH[0]) == 1
    (work / "agent.py").write_text(src)
    (work / "agent_v2.py").write_text(src.replace(*AGENT_V2_PATCH))
    shutil.copy(EXAMPLES / "agent_script.json", work / "agent_script.json")
    srv = ModelServer(script=EXAMPLES / "agent_script.json").start()
    env = _env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY=OPENAI_KEY)
    try:
        steno, rec, _ = _record(tmp, "copy", [PY, str(work / "agent.py")], env, tmp)
    finally:
        srv.stop()
    assert rec.returncode == 0, rec.stderr.decode()
    (tmp / "recorded.txt").write_bytes(rec.stdout)
    yield steno, work / "agent_v2.py"


# --------------------------------------------------------------------------- clients

SECTIONS = {
    "openai_sync": r"chatcmpl-\w+ tool_calls 'I will fetch it\.' fetch",
    "openai_async": r"chatcmpl-\w+ 'I will fetch it\.'",
    "openai_stream": r"[2-9]\d* pieces 'I will fetch it\.'",
    "anthropic_sync": r"msg_\w+ tool_use \['text', 'tool_use'\]",
    "anthropic_async": r"msg_\w+ 'I will fetch it\.'",
    "anthropic_stream": r"[2-9]\d* pieces 'I will fetch it\.' \d+",
    "httpx": r"4 chunks b'chunk 0\\nchunk 1\\nchunk 2\\nchunk 3\\n' timeout httpx\.ReadTimeout",
    "requests": r"200 POST /echo cookie-sent=True refused requests\.exceptions\.ConnectionError",
    "aiohttp": r"POST /echo b'chunk 0\\nchunk 1\\nchunk 2\\n'",
}


def test_clients_recorded_and_replayed_bit_identical(clients: Run) -> None:
    assert clients.rec.returncode == 0, clients.rec.stderr.decode()
    assert b"0 exchanges" not in clients.rec.stderr
    assert clients.rep.returncode == 0, clients.rep.stderr.decode()
    assert clients.rep.stdout == clients.rec.stdout
    assert b"replay bit-identical" in clients.rep.stderr, clients.rep.stderr.decode()
    # what the real network path imported (off the tape) is on the tape, for replay to import
    first = clients.exchanges()[0]
    assert "encodings.idna" in (first.get("imports") or []), first.get("imports")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_each_client_section(clients: Run, section: str) -> None:
    rec, rep = clients.lines("rec"), clients.lines("rep")
    assert re.fullmatch(SECTIONS[section], rec.get(section, "<missing>")), rec.get(section)
    assert rep.get(section) == rec[section]


def _model_calls(run: Run, model: str) -> list[dict[str, Any]]:
    out = []
    for x in run.exchanges():
        body = x["request"]["body"]
        if x["channel"] == "model" and isinstance(body, bytes) and \
                json.loads(body).get("model") == model:
            out.append(x)
    return out


def test_streaming_is_recorded_chunk_by_chunk(clients: Run) -> None:
    for model in ("m-stream", "claude-stream"):
        (x,) = _model_calls(clients, model)
        assert json.loads(x["request"]["body"])["stream"] is True
        assert len(x["response"]["chunks"]) >= 4, x["response"]["chunks"]


def test_async_clients_are_on_the_model_channel(clients: Run) -> None:
    for model in ("m-async", "claude-async"):
        (x,) = _model_calls(clients, model)
        assert x["response"]["status"] == 200


def test_a_retry_is_recorded_and_replayed_as_500_then_200(clients: Run) -> None:
    calls = _model_calls(clients, "m-retry")
    assert [c["response"]["status"] for c in calls] == [500, 200]
    assert calls[0]["fingerprint"] == calls[1]["fingerprint"]
    assert [(r.attempt, r.status) for r in clients.server_requests
            if r.body and b'"m-retry"' in r.body] == [(1, 500), (2, 200)]
    assert clients.lines("rec")["openai_retry"].startswith("retries_taken=1 status=200")
    assert clients.lines("rep")["openai_retry"] == clients.lines("rec")["openai_retry"]


def test_timeouts_and_refused_connections_replay_as_the_same_exception(clients: Run) -> None:
    errors = {(x["request"]["url"].split("/", 3)[-1], x["error"]["type"])
              for x in clients.exchanges() if x.get("response") is None}
    assert errors == {("v1/chat/completions", "ReadTimeout"), ("slow?ms=2500", "ReadTimeout"),
                      ("nothing", "ConnectionError")}
    line = clients.lines("rec")["openai_timeout"]
    assert line == "raised openai.APITimeoutError cause httpx2.ReadTimeout"
    assert clients.lines("rep")["openai_timeout"] == line


def test_tool_subprocess_exchanges_are_on_its_own_process_path(clients: Run) -> None:
    child = [x for x in clients.exchanges() if x["proc"] != "0"]
    assert len(child) == 1, child
    (x,) = child
    assert re.fullmatch(r"0\.\d+", x["proc"])
    assert x["channel"] == "http" and x["request"]["url"].endswith("/echo")
    assert json.loads(x["request"]["body"]) == {"from": "child"}
    assert x["proc"] in [str(p) for p in
                         next(e.body for e in clients.events if e.kind == "RunEnded")["processes"]]
    rec = clients.lines("rec")["subprocess_tool"]
    assert re.fullmatch(r"tool said '200 POST /echo fetch pid \d+' rc=0 final 'fetched it'", rec)
    assert clients.lines("rep")["subprocess_tool"] == rec


def test_replay_ran_with_the_server_down(clients: Run) -> None:
    assert _refused(clients.port)
    assert clients.rep.returncode == 0
    # the recording did reach the server: 18 exchanges, 17 requests (one was refused)
    assert len(clients.exchanges()) == 18
    assert len(clients.server_requests) == 17


def test_secrets_never_reach_the_file(clients: Run) -> None:
    raw = clients.steno.read_bytes()
    for secret in (OPENAI_KEY, ANTHROPIC_KEY, COOKIE):
        assert secret.encode() not in raw, secret
    env = clients.started()["env"]
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "<redacted>"
    assert env["SESSION_COOKIE"] == "<redacted>"
    assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
    sent = {k.lower(): v for x in clients.exchanges() for k, v in x["request"]["headers"]}
    assert sent["authorization"] == sent["cookie"] == "<redacted>"
    echo = next(x for x in clients.exchanges() if x["request"]["url"].endswith("/echo")
                and x["proc"] == "0" and b"requests" in x["request"]["body"])
    # the server echoed the cookie back: scrubbed from the body, and the length fixed
    assert b'"cookie": "<redacted>"' in echo["response"]["body"]
    length = {k.lower(): v for k, v in echo["response"]["headers"]}["content-length"]
    assert int(length) == len(echo["response"]["body"]) == sum(echo["response"]["chunks"])


# --------------------------------------------------------------------------- demo agent

def test_demo_agent_replays_bit_identical_offline(agent: Run) -> None:
    assert agent.rec.returncode == 0, agent.rec.stderr.decode()
    out = agent.rec.stdout.decode()
    assert "step 3: run(" in out and "final answer: This directory holds" in out
    assert len(_model_calls(agent, "steno-demo")) == 4
    assert _refused(agent.port)
    assert agent.rep.returncode == 0, agent.rep.stderr.decode()
    assert agent.rep.stdout == agent.rec.stdout
    assert (b"stenograph: replay bit-identical: stdout identical, stderr identical, "
            b"exit_status identical") in agent.rep.stderr


def test_demo_agent_json_report_says_identical(agent: Run) -> None:
    p, _ = _replay(agent.steno, "--json")
    assert p.returncode == 0, p.stderr.decode()
    report = json.loads(p.stdout.decode().splitlines()[-1])
    assert report["divergences"] == []
    assert report["identical"] == {"stdout": True, "stderr": True, "exit_status": True}
    assert report["exit_status"] == {"recorded": 0, "replayed": 0}


def test_demo_agent_key_is_redacted(agent: Run) -> None:
    assert OPENAI_KEY.encode() not in agent.steno.read_bytes()
    assert agent.started()["env"]["OPENAI_API_KEY"] == "<redacted>"
    for x in agent.exchanges():
        hdrs = {k.lower(): v for k, v in x["request"]["headers"]}
        assert hdrs["authorization"] == "<redacted>"


def test_changed_prompt_at_turn_3_stops_the_replay_there(agent_copy: tuple[Path, Path]) -> None:
    steno, v2 = agent_copy
    p, _ = _replay(steno, "--", PY, str(v2))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "stenograph: divergence: process 0 channel model position 2" in err
    assert "model call #2 in process 0: request differs" in err
    assert re.search(r"body \$\.messages\[1\]\.content: recorded \"Look around.*\"", err), err
    assert re.search(r"asked +\"Look around .* Be brief\.\"", err), err
    assert "position 3" not in err  # it stopped at turn 3
    recorded = (steno.parent / "recorded.txt").read_bytes()
    head = recorded[:recorded.index(b"step 3:")]
    assert p.stdout == head  # turns 1 and 2 replayed exactly, nothing after


def test_lenient_replay_lists_the_changed_prompt_and_goes_on(
        agent_copy: tuple[Path, Path]) -> None:
    steno, v2 = agent_copy
    p, _ = _replay(steno, "--lenient", "--", PY, str(v2))
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "channel model position 2" in err and "channel model position 3" in err
    assert "$.messages[1].content" in err
    out = p.stdout.decode()
    assert "step 3: run(" in out
    assert "final answer: This directory holds" in out
    assert "finished after 4 model calls" in out
