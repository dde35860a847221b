"""Drift at resume: the live continuation of a crashed run talks to the model the
recording did, or says how it does not. The agent is examples/effect_agent.py (the
official ``openai`` SDK, real effects against the loopback service); the model server
is made to serve a new snapshot under the same name between the crash and the resume,
as providers do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from crashes import kill_at_request

from stenograph.recorder.reader import StoreReader
from stenograph.testing.effect_service import Drop, EffectService
from stenograph.testing.model_server import Knobs, ModelServer

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "examples" / "effect_agent.py"
SCRIPT = ROOT / "examples" / "effect_script.json"
CLI = [sys.executable, "-m", "stenograph"]


def _env(svc: EffectService, models: ModelServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
    return {**env, "EFFECT_URL": svc.url, "OPENAI_BASE_URL": models.openai_base_url,
            "OPENAI_API_KEY": "sk-test"}


def _crash_at_model_call(tmp: Path, n: int, svc: EffectService, models: ModelServer,
                         agent: Path = AGENT) -> Path:
    """Record the agent into a store, the whole group killed when model call ``n``
    arrives (the server answers slowly: the kill lands before the reply)."""
    store = tmp / "s"
    p = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t",
                          "--workspace", "none", "-o", str(tmp / "t.steno"), "--",
                          sys.executable, str(agent)], cwd=tmp, env=_env(svc, models),
                         start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    kill_at_request(p, models, n)
    p.communicate(timeout=120)
    assert p.returncode == -9
    return store


def test_a_new_model_snapshot_is_crossed_with_a_drift_event_or_refused(
        tmp_path: Path) -> None:
    with EffectService() as svc, ModelServer(script=SCRIPT, knobs=Knobs(delay_ms=300)
                                             ) as models:
        store = _crash_at_model_call(tmp_path, 2, svc, models)
        models.serve_as = "steno-ops-2026-12-01"
        refuse = subprocess.run([*CLI, "resume", str(store), "t", "--drift", "refuse"],
                                cwd=tmp_path, env=_env(svc, models), capture_output=True,
                                text=True, timeout=120)
        assert refuse.returncode == 6, refuse.stderr
        lines = [ln for ln in refuse.stderr.splitlines() if ln.startswith("stenograph:")]
        assert len(lines) == 1, refuse.stderr  # one line for the person, not two
        assert "answered by steno-ops-2026-12-01" in lines[0], refuse.stderr
        cross = subprocess.run([*CLI, "resume", str(store), "t"], cwd=tmp_path,
                               env=_env(svc, models), capture_output=True, text=True,
                               timeout=120)
        assert cross.returncode == 0, cross.stderr
        assert "hosting is paid" in cross.stdout
        drift = [e.body for e in StoreReader(store).events(traj="t") if e.kind == "Drift"]
        assert drift and drift[-1]["field"] == "served", drift
        assert (drift[-1]["old"], drift[-1]["new"]) == ("steno-ops", "steno-ops-2026-12-01")
        assert svc.stats()["payments"] == 1 and svc.stats()["servers"] == 1


def test_a_changed_schema_of_a_tool_in_doubt_refuses_in_one_line(tmp_path: Path) -> None:
    """The harness's tool schemas changed after the crash (a new version of the code
    that defines them, outside the workspace) while the provision call is in doubt."""
    doc = tmp_path / "provision-doc.txt"
    doc.write_text("Provision a new server.")
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT.read_text().replace(
        '_fn("provision", "Provision a new server.", name="server name")',
        '_fn("provision", open(os.environ["DOC"]).read(), name="server name")'))
    with EffectService() as svc, ModelServer(script=SCRIPT) as models:
        procs: list[int] = []

        def on_effect(path: str, headers: dict[str, str]) -> None:
            if path == "/servers":  # the provision's intent is durable; kill, unapplied
                os.killpg(procs[0], signal.SIGKILL)
                raise Drop()

        svc.on_effect = on_effect
        env = {**_env(svc, models), "DOC": str(doc)}
        p = subprocess.Popen([*CLI, "record", "--store", str(tmp_path / "s"), "--traj", "t",
                              "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                              sys.executable, str(agent)], cwd=tmp_path, env=env,
                             start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append(p.pid)
        p.communicate(timeout=120)
        doc.write_text("Provision a new server, in the cheapest region.")
        res = subprocess.run([*CLI, "resume", str(tmp_path / "s"), "t"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 1, res.stderr
        assert "the tool schemas changed since the crash, and" in res.stderr, res.stderr
        assert "provision" in res.stderr and "has an effect in doubt" in res.stderr
        assert svc.stats()["servers"] == 0  # nothing re-issued


def test_status_names_the_tool_calls_the_model_proposed_and_nothing_made(
        tmp_path: Path) -> None:
    """Killed as the first reply's proposal (find_servers) reaches the service: status
    lists that call as not-sent -- no intent, no result: nothing of it is known to have
    happened -- and resume makes it."""
    from stenograph.recorder.resumes import states

    with EffectService() as svc, ModelServer(script=SCRIPT) as models:
        procs: list[int] = []

        def on_read(path: str) -> None:
            if procs:
                os.killpg(procs.pop(), signal.SIGKILL)
                raise Drop()

        svc.on_read = on_read
        p = subprocess.Popen([*CLI, "record", "--store", str(tmp_path / "s"), "--traj", "t",
                              "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                              sys.executable, str(AGENT)], cwd=tmp_path,
                             env=_env(svc, models), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p.pid)
        p.communicate(timeout=120)
        (st,) = states(tmp_path / "s", "t")
        assert [(e.target, e.state) for e in st.effects] == [
            ("tool call find_servers", "not-sent")], st.effects
        assert st.state == "crashed"
        res = subprocess.run([*CLI, "resume", str(tmp_path / "s"), "t"], cwd=tmp_path,
                             env=_env(svc, models), capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        (st,) = states(tmp_path / "s", "t")
        assert st.state == "ended" and all(e.state == "settled" for e in st.effects)
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 1
