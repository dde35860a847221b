"""Agents with MCP tool servers over stdio (issue "Agents with MCP tool servers", parts 1, 3):
the official Python SDK's client starts a one-tool server as a child and calls it; the
server's tool reads a clock, a uuid4, random numbers and a listing. Recorded, then
replayed, bit for bit, on mcp 2.x (``MCPServer``, the virtualenv's), mcp 1.x
(``FastMCP``) and the standalone ``fastmcp`` package's server (those two installed once
with ``pip install --target`` under ``.venv/``; skipped when pip cannot get them). Each
``tools/call`` is in the trajectory (``interpose/mcp_client.py``), and ``show`` lists it
under the model's tool call that asked for it.

The server reads its stdin from an anyio worker thread, through a duplicate of fd 0
(``os.dup``: ``fcntl(F_DUPFD_CLOEXEC)``): a blocking read the scheduler saw only once the
pipe's mark followed the fd through ``dup``/``fcntl`` and across ``exec`` (before, every
replay stopped at "threads ran unscheduled").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pip_target import installed, npm_installed
from steno_cli import why

CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable  # the venv: the client and server import mcp
CLIENT = Path(__file__).resolve().parent.parent / "examples" / "mcp" / "stamp_client.py"
RECORDINGS, REPLAYS = (int(n) for n in os.environ.get("STENO_MCP_RUNS", "1x1").split("x"))
"""Recordings per SDK and replays per recording (``make soak``: 3x3)."""
TARGETS = {"mcp1": ("mcp-1", "mcp<2", "mcp"), "fastmcp": ("fastmcp", "fastmcp", "fastmcp")}
"""Installed once with ``pip install --target`` under ``.venv/``: dir, requirement, module."""


def _env(sdk: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    if sdk in TARGETS:
        env["PYTHONPATH"] = str(installed(*TARGETS[sdk]))
    if sdk == "fastmcp":
        env["STAMP_SERVER"] = "fastmcp"
        # its banner's update check writes ~/.local/share/fastmcp/version_cache.json the
        # first time: a file the recording made outside the workspace, which the replay
        # then finds (docs/determinism.md, files created elsewhere)
        env["FASTMCP_CHECK_FOR_UPDATES"] = "off"
    return env


@pytest.mark.parametrize("sdk", ["mcp2", "mcp1", "fastmcp"])
def test_an_mcp_server_over_stdio_replays_bit_for_bit(tmp_path: Path, sdk: str) -> None:
    env = _env(sdk)
    version = subprocess.run([PY, "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
                             env=env, capture_output=True, text=True, timeout=60).stdout
    assert version.startswith("1." if sdk == "mcp1" else "2."), version
    (tmp_path / "a").write_text("listed by the tool\n")
    for r in range(RECORDINGS):
        steno = tmp_path / f"{sdk}-{r}.steno"
        rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(CLIENT), "3"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert rec.returncode == 0, rec.stderr[-2000:]
        assert "stall limit" not in rec.stderr, rec.stderr
        lines = rec.stdout.splitlines()
        assert lines[0] == "tools ['stamp']" and len(lines) == 4, rec.stdout
        assert len({ln.split()[2] for ln in lines[1:]}) == 3, rec.stdout  # fresh uuids
        # each tools/call is in the trajectory: which tool, with what, and its answer
        from stenograph.recorder.trajfile import read_trajectory

        events = read_trajectory(steno).events
        calls = [e.body for e in events if e.kind == "Exchange" and e.body.get("channel") == "mcp"]
        assert [c["request"]["url"] for c in calls] == ["mcp:stamp/stamp"] * 3, calls
        assert [json.loads(c["request"]["body"]) for c in calls] == [{"path": "."}] * 3
        answers = [json.loads(c["result"])["content"][0]["text"] for c in calls]
        assert [a.split()[1] for a in answers] == [ln.split()[2] for ln in lines[1:]]
        # unannotated, the tool acts (the spec's default): each call's intent came first
        intents = [e for e in events if e.kind == "ToolIntent" and e.body["channel"] == "mcp"]
        assert [i.body["target"] for i in intents] == ["mcp stamp/stamp"] * 3
        assert all(i.body["idempotent"] is False for i in intents)
        for _ in range(REPLAYS):
            rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
            assert rep.returncode == 0 and "bit-identical" in rep.stderr, why(rep.stderr)
            assert rep.stdout == rec.stdout


def test_an_agents_sdk_agent_with_an_mcp_server_replays_bit_for_bit(tmp_path: Path) -> None:
    """``examples/mcp/agents_sdk_agent.py``: the OpenAI Agents SDK's ``MCPServerStdio``
    starts the server, lists its tools for the model and calls ``stamp`` when the
    (loopback) model asks."""
    from stenograph.testing.model_server import ModelServer

    agent = CLIENT.with_name("agents_sdk_agent.py")
    with ModelServer(script=CLIENT.with_name("script.json")) as srv:
        env = {k: v for k, v in _env("mcp2").items() if not k.startswith("OPENAI_")}
        env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-test-mcp")
        for r in range(RECORDINGS):
            steno = tmp_path / f"agent-{r}.steno"
            rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(agent)],
                                 cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=180)
            assert rec.returncode == 0, rec.stderr[-2000:]
            assert "tool output:" in rec.stdout and "final: Stamped." in rec.stdout, rec.stdout
            show = subprocess.run([*CLI, "show", str(steno)], capture_output=True, text=True,
                                  timeout=60).stdout.splitlines()
            turn1 = show.index(next(ln for ln in show if ln.strip().startswith("1 ")))
            assert "stamp(path=.)" in show[turn1], show  # the model's tool call, and
            # the MCP call that made it: unannotated, the tool acts (an effect)
            assert show[turn1 + 1].split() == ["effect:", "mcp", "stamp/stamp", '{"path":',
                                               '"."}', "settled"], show
            for _ in range(max(1, REPLAYS - 1)):
                rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=env,
                                     capture_output=True, text=True, timeout=180)
                assert rep.returncode == 0 and "bit-identical" in rep.stderr, \
                    rep.stderr[-3000:]


def test_a_tool_call_made_through_mcp_is_not_listed_as_not_sent() -> None:
    """A run that crashed after the model proposed ``stamp`` and the agent called it over
    MCP: the call was made (its entry is there), so ``status`` must not list it as a
    proposal nothing of which left the host."""
    import json

    from stenograph.recorder.codec import Event
    from stenograph.recorder.effects import fold

    reply = json.dumps({"choices": [{"message": {"tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "stamp", "arguments": "{}"}}]}}]}).encode()
    model = Event(1, "t", 1, None, "Exchange", {
        "proc": "0", "channel": "model", "pos": 0,
        "request": {"method": "POST", "url": "http://m/v1/chat/completions"},
        "response": {"status": 200, "body": reply}})
    mcp = Event(2, "t", 2, 1, "Exchange", {"channel": "mcp", "proc": "0", "pos": 0,
                                           "request": {"method": "CALL",
                                                       "url": "mcp:stamp/stamp"}})
    assert [e.target for e in fold("t", [model]).effects] == ["tool call stamp"]
    assert fold("t", [model, mcp]).effects == []


@pytest.mark.parametrize("sdk", ["mcp2", "mcp1"])
def test_a_server_outside_the_tree_over_streamable_http_is_never_reached_by_a_replay(
        tmp_path: Path, sdk: str) -> None:
    """The server runs on its own (not a child of the recorded run): the client's
    requests are hooked exchanges, its transport's own traffic is no effect, and each
    replay is served from the recording with the server stopped. The session's GET
    stream stayed open until the client closed it; a replay keeps it waiting too."""
    import socket
    import time

    env = _env(sdk)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([PY, str(CLIENT.with_name("stamp_server.py")), "--http",
                               str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    client = CLIENT.with_name("stamp_http_client.py")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        recs = []
        for r in range(RECORDINGS):
            steno = tmp_path / f"http-{sdk}-{r}.steno"
            rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(client), url,
                                  "3"], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=180)
            assert rec.returncode == 0, rec.stderr[-2000:]
            assert rec.stdout.splitlines()[0] == "tools ['stamp']", rec.stdout
            recs.append((steno, rec.stdout))
    finally:
        server.kill()
        server.wait(timeout=60)
    from stenograph.recorder.trajfile import read_trajectory

    for steno, out in recs:
        events = read_trajectory(steno).events
        intents = [e.body["target"] for e in events if e.kind == "ToolIntent"]
        assert intents == ["mcp stamp/stamp"] * 3, intents  # one effect per call, no more
        for _ in range(REPLAYS):
            rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
            assert rep.returncode == 0 and "bit-identical" in rep.stderr, why(rep.stderr)
            assert rep.stdout == out


@pytest.mark.parametrize("sdk", ["mcp2", "mcp1"])
def test_a_server_the_agent_starts_over_streamable_http_replays_at_both_ends(
        tmp_path: Path, sdk: str) -> None:
    """The agent finds a free port, starts the server on it as its child, polls until it
    listens and talks to it in-process: both ends are the recorded tree's. The hooks
    leave the conversation to the socket level (no HTTP exchange is recorded for it), the
    port, the polling and every accept are taped, and a replay runs the server again
    and ends it as the recording did (the agent's SIGTERM, which uvicorn re-raises)."""
    env = _env(sdk)
    agent = CLIENT.with_name("stamp_http_agent.py")
    for r in range(RECORDINGS):
        steno = tmp_path / f"own-{sdk}-{r}.steno"
        rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(agent), "3"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert rec.returncode == 0, rec.stderr[-2000:]
        assert rec.stdout.splitlines()[0] == "tools ['stamp']", rec.stdout
        from stenograph.recorder.trajfile import read_trajectory

        events = read_trajectory(steno).events
        intents = [e.body["target"] for e in events if e.kind == "ToolIntent"]
        assert intents == ["mcp stamp/stamp"] * 3, intents  # the calls, not their transport
        for _ in range(REPLAYS):
            rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
            assert rep.returncode == 0 and "bit-identical" in rep.stderr, why(rep.stderr)
            assert rep.stdout == rec.stdout


def test_the_reference_node_filesystem_server_replays_bit_for_bit(tmp_path: Path) -> None:
    """``@modelcontextprotocol/server-filesystem`` from the npm registry, started with
    ``node`` by the official Python client. V8's background threads (concurrent
    compilation, parallel GC) finish at moments no blocking call marks: before node ran
    with ``--single-threaded`` under the tape (``shim_c/proc.c``, ``NORMALIZE``), a third
    of the recordings diverged in node's main thread at replay (a lazy compile where the
    recording had found the function compiled)."""
    prefix = npm_installed("npm-mcp-fs", "@modelcontextprotocol/server-filesystem")
    server = prefix / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / \
        "dist" / "index.js"
    client = CLIENT.with_name("fs_client.py")
    env = _env("mcp2")
    (tmp_path / "a.txt").write_text("read by the node server\n")
    for r in range(RECORDINGS + 1):
        steno = tmp_path / f"fs-{r}.steno"
        rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(client),
                              str(server)], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=180)
        assert rec.returncode == 0, rec.stderr[-2000:]
        assert "read by the node server" in rec.stdout, rec.stdout
        for _ in range(REPLAYS):
            rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
            report = "\n".join(ln for ln in rep.stderr.splitlines() if "where:" not in ln)
            assert rep.returncode == 0 and "bit-identical" in rep.stderr, report[-3000:]
            assert rep.stdout == rec.stdout

