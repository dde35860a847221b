"""The agent frameworks people build on, each recorded and replayed several times.

Each agent in ``examples/frameworks/`` is written the way its framework's quick-start
writes it and talks to the loopback ``ModelServer`` through ``OPENAI_BASE_URL``. A test
records it with the real CLI, stops the server (so a replay that reached for the
network would fail; replay refuses networking anyway), then replays the recording:
once recorded, three replays, in `make test`; three recordings of ten replays in
`make soak` (the scheduler differs every time: one replay can be lucky).

A framework that does not replay today keeps its test, marked
``xfail(strict=True)`` with the divergence measured, so the day the shim learns to
replay it the test fails and the mark has to go. A test skips only when its
framework is not installed (``pip install -e '.[frameworks]'``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stenograph.testing.model_server import ModelServer

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "examples" / "frameworks"
CLI = [sys.executable, "-m", "stenograph"]
TIMEOUT = 120
RECORDINGS, REPLAYS = (int(n) for n in os.environ.get("STENO_FRAMEWORK_RUNS", "1x1").split("x"))
"""Recordings per framework, replays per recording: `make test` runs 1x3 (4 runs a
framework); `make soak` runs 3x10, which is what found the one-in-thirty cases."""


@dataclass(frozen=True)
class Framework:
    module: str
    """What must be importable for the test to run (pytest.importorskip)."""
    agent: str
    script: str = "script.json"
    flags: tuple[str, ...] = ()
    """Extra ``stenograph record`` flags (none: the defaults are what users get)."""


def _record_and_replay(fw: Framework, tmp_path: Path, recordings: int = RECORDINGS,
                       replays: int = REPLAYS) -> None:
    for r in range(recordings):
        _one_recording(fw, tmp_path / f"rec{r}", replays)


def _one_recording(fw: Framework, tmp_path: Path, replays: int) -> None:
    pytest.importorskip(fw.module)
    tmp_path.mkdir(parents=True, exist_ok=True)
    steno = tmp_path / "run.steno"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    with ModelServer(script=AGENTS / fw.script) as srv:
        env["OPENAI_BASE_URL"] = srv.openai_base_url
        env["OPENAI_API_KEY"] = "sk-test-frameworks"
        rec = subprocess.run(
            [*CLI, "record", *fw.flags, "-o", str(steno), "--", sys.executable,
             str(AGENTS / fw.agent)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=TIMEOUT,
        )
        served = len(srv.requests)
    assert rec.returncode == 0, rec.stderr.decode(errors="replace")[-3000:]
    assert b"final: " in rec.stdout, rec.stdout.decode(errors="replace")
    assert served >= 2, "a tool call round trip is two model requests"
    del env["OPENAI_API_KEY"]
    for i in range(replays):
        rep = subprocess.run(
            [*CLI, "replay", str(steno)], cwd=ROOT, env=env, capture_output=True, timeout=TIMEOUT
        )
        err = rep.stderr.decode(errors="replace")
        assert rep.returncode == 0, f"replay {i + 1}/{replays}: {err[-3000:]}"
        assert "replay bit-identical" in err, f"replay {i + 1}/{replays}: {err[-3000:]}"
        assert rep.stdout == rec.stdout


@pytest.mark.soak  # (make test records, crashes, resumes and replays langgraph below)
def test_langgraph(tmp_path: Path) -> None:
    _record_and_replay(Framework("langgraph", "langgraph_agent.py"), tmp_path)


def test_openai_agents(tmp_path: Path) -> None:
    _record_and_replay(Framework("agents", "openai_agents_agent.py"), tmp_path)


@pytest.mark.soak  # (make test: langgraph and the Agents SDK; 60 s of a 10-min budget)
def test_pydantic_ai(tmp_path: Path) -> None:
    _record_and_replay(Framework("pydantic_ai", "pydantic_ai_agent.py"), tmp_path)


@pytest.mark.soak  # (make test: langgraph and the Agents SDK; 60 s of a 10-min budget)
def test_litellm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # importorskip imports litellm here too: without this it fetches its price list
    # from GitHub at import (retrying with sleeps, as there is no network)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    _record_and_replay(Framework("litellm", "litellm_agent.py"), tmp_path)


@pytest.mark.soak  # (make test: langgraph and the Agents SDK; 60 s of a 10-min budget)
def test_smolagents(tmp_path: Path) -> None:
    _record_and_replay(
        Framework("smolagents", "smolagents_agent.py", "smolagents_script.json"), tmp_path)


FRAMEWORKS = {
    "langgraph": Framework("langgraph", "langgraph_agent.py"),
    "openai_agents": Framework("agents", "openai_agents_agent.py"),
    "pydantic_ai": Framework("pydantic_ai", "pydantic_ai_agent.py"),
    "litellm": Framework("litellm", "litellm_agent.py"),
    "smolagents": Framework("smolagents", "smolagents_agent.py", "smolagents_script.json"),
}
RESUMED = os.environ.get("STENO_FRAMEWORK_RESUME", "langgraph").split(",")
"""Which frameworks `make test` crashes and resumes (thread pools; the asyncio loop on
the tape); `make soak` does all five."""


@pytest.mark.parametrize("name", [n for n in FRAMEWORKS if n in RESUMED])
def test_a_framework_agent_crashed_mid_run_resumes_and_the_whole_run_replays(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole process group is killed as the agent's second model call arrives (the
    server answers slowly: the kill comes first); resume replays the first turn and makes
    the second live, once; the finished trajectory replays bit for bit as one tape."""
    from crashes import kill_at_request

    from stenograph.testing.model_server import Knobs

    fw = FRAMEWORKS[name]
    pytest.importorskip(fw.module)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    store = tmp_path / "s"
    with ModelServer(script=AGENTS / fw.script, knobs=Knobs(delay_ms=300)) as srv:
        env["OPENAI_BASE_URL"] = srv.openai_base_url
        env["OPENAI_API_KEY"] = "sk-test-frameworks"
        p = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t",
                              "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                              sys.executable, str(AGENTS / fw.agent)], cwd=ROOT, env=env,
                             start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        kill_at_request(p, srv, 2)
        p.communicate(timeout=TIMEOUT)
        assert p.returncode == -9
        before = len(srv.requests)
        res = subprocess.run([*CLI, "resume", str(store), "t"], cwd=ROOT, env=env,
                             capture_output=True, timeout=TIMEOUT)
        err = res.stderr.decode(errors="replace")
        assert res.returncode == 0, err[-3000:]
        assert b"final: " in res.stdout
        assert len(srv.requests) - before == 1, "the crashed call, made once; none replayed"
    exp = subprocess.run([*CLI, "log", "export", str(store), "t", "-o",
                          str(tmp_path / "all.steno")], capture_output=True, env=env)
    assert exp.returncode == 0
    rep = subprocess.run([*CLI, "replay", str(tmp_path / "all.steno")], cwd=ROOT, env=env,
                         capture_output=True, timeout=TIMEOUT)
    err = rep.stderr.decode(errors="replace")
    assert rep.returncode == 0 and "replay bit-identical" in err, err[-3000:]
