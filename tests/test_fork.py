"""Counterfactual forks on real recordings, under the real shim: the prefix replayed
sealed, the changed turn, the live rest (its model calls to --model-url, its effects to
--effects-url or refused, never to the recorded service), the parent pointer through
export and import, and the fork's own replay."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from planted_agent import CLI, env, record, script

from stenograph.testing.effect_service import EffectService
from stenograph.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parent.parent
EFFECT_SCRIPT = json.loads((REPO / "examples" / "effect_script.json").read_text())


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    return record(tmp_path_factory.mktemp("fork"), "base")


def test_fork_with_a_reply_runs_live_and_points_to_its_parent(
        base: tuple[Path, list], tmp_path: Path) -> None:
    steno, _ = base
    reply = tmp_path / "reply.json"
    reply.write_text(json.dumps({"tool_calls": [
        {"name": "read_file", "arguments": {"path": "agent.py"}}]}))
    out = tmp_path / "fork.steno"
    with ModelServer(script=script()) as srv:
        p = cli("fork", str(steno), "--at", "2", "--reply", str(reply), "--model-url",
                srv.openai_base_url, "-o", str(out), "--json")
        live = [r.json() for r in srv.requests if r.path.endswith("/chat/completions")]
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["turns"] == 3 and doc["live_turns"] == 1
    assert doc["parent"]["turn"] == 2 and doc["parent"]["traj"]
    # one live model call: turn 3, which saw the new reply's tool result (agent.py, no
    # "deploy web1" in it), so the model's branch answered instead of deploying
    assert len(live) == 1
    t3 = json.loads(cli("show", str(out), "--turn", "3", "--json").stdout)
    assert t3["request"]["body"] == live[0]
    assert t3["reply"]["text"] == "Nothing to deploy."
    t2 = json.loads(cli("show", str(out), "--turn", "2", "--json").stdout)
    assert t2["tool_calls"][0]["arguments"] == {"path": "agent.py"}
    assert "MAX_OUTPUT" in t2["tool_results"][0]["content"]
    # the prefix was the parent's, served: the same request at turn 1 and 2
    for n in (1, 2):
        a = json.loads(cli("show", str(steno), "--turn", str(n), "--json").stdout)
        b = json.loads(cli("show", str(out), "--turn", str(n), "--json").stdout)
        assert a["request"]["body"] == b["request"]["body"]
    summary = cli("show", str(out))
    assert f"forked from {steno}" in summary.stdout and "at turn 2" in summary.stdout
    # the fork is a recording: it replays bit for bit, offline
    r = cli("replay", str(out), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    # the pointer survives import into a store and export out of it
    store = tmp_path / "store"
    assert cli("log", "import", str(out), str(store)).returncode == 0
    ls = json.loads(cli("log", "ls", str(store), "--json").stdout)
    (t,) = ls["trajectories"]
    assert t["parent"]["turn"] == 2 and t["parent"]["file"] == str(steno)
    again = tmp_path / "again.steno"
    assert cli("log", "export", str(store), t["traj"], "-o", str(again)).returncode == 0
    assert "at turn 2" in cli("show", str(again)).stdout
    # diff names the replaced reply as the divergence, at the fork's turn
    d = json.loads(cli("diff", str(steno), str(out), "--json").stdout)
    assert d["t_div"] == 2 and d["cause"] == "model" and "fork" in d["differences"][-1]["source"]


def test_fork_of_another_build(base: tuple[Path, list], tmp_path: Path) -> None:
    """Would the new truncation rule have saved it? The agent with tool output cut at 20
    characters, forked at turn 3: its prefix build-replays (the same calls), its turn 3
    request goes live with the shorter tool result, and the model's answer changes."""
    steno, _ = base
    src = (steno.parent / "base" / "agent.py").read_text()
    new = tmp_path / "agent_new.py"
    new.write_text(src.replace("MAX_OUTPUT = 4000\n", "MAX_OUTPUT = 20\n"))
    out = tmp_path / "rule.steno"
    with ModelServer(script=script()) as srv:
        p = cli("fork", str(steno), "--at", "3", "--model-url", srv.openai_base_url,
                "-o", str(out), "--json", "--", sys.executable, str(new), "--workdir", ".")
        live = [r.json() for r in srv.requests if r.path.endswith("/chat/completions")]
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["turns"] == 3 and doc["live_turns"] == 1 and len(live) == 1
    assert live[0]["messages"][-1]["content"] == "release notes: ship "
    assert "harness" in doc["parent"]["change"]
    d = json.loads(cli("diff", str(steno), str(out), "--json").stdout)
    assert d["t_div"] == 3 and d["cause"] == "harness"
    # a build whose prefix makes other calls (another system prompt) is refused
    other = tmp_path / "agent_other.py"
    other.write_text(src.replace("You are a careful agent.", "You are a hasty agent."))
    bad = tmp_path / "bad.steno"
    p = cli("fork", str(steno), "--at", "3", "--model-url", "http://127.0.0.1:9/v1",
            "-o", str(bad), "--", sys.executable, str(other), "--workdir", ".")
    assert p.returncode == 1 and "did not replay" in p.stderr, p.stderr[-2000:]
    assert "turn" in p.stderr and not bad.exists()


def _record_effect_agent(root: Path, svc: EffectService) -> Path:
    ws = root / "eff"
    ws.mkdir()
    out = root / "effect.steno"
    with ModelServer(script=EFFECT_SCRIPT) as srv:
        p = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable,
                            str(REPO / "examples" / "effect_agent.py")], cwd=ws,
                           capture_output=True, text=True, timeout=180,
                           env=env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-x",
                                   EFFECT_URL=svc.url))
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_fork_effects_go_to_the_effects_url_or_nowhere(tmp_path: Path) -> None:
    with EffectService() as recorded_svc:
        steno = _record_effect_agent(tmp_path, recorded_svc)
        before = recorded_svc.stats()
        assert before["payments"] == 1
        reply = tmp_path / "reply.json"
        reply.write_text(json.dumps({"tool_calls": [
            {"name": "pay", "arguments": {"amount": "999", "to": "elsewhere"}}]}))
        with ModelServer(script=EFFECT_SCRIPT) as srv:
            refused = cli("fork", str(steno), "--at", "3", "--reply", str(reply),
                          "--model-url", srv.openai_base_url, "-o",
                          str(tmp_path / "refused.steno"))
            with EffectService() as test_svc:
                sent = cli("fork", str(steno), "--at", "3", "--reply", str(reply),
                           "--model-url", srv.openai_base_url, "--effects-url", test_svc.url,
                           "-o", str(tmp_path / "sent.steno"))
                test_stats = test_svc.stats()
        # the recorded service saw nothing of either fork
        assert recorded_svc.stats() == before
    # refused: the program got its HTTP library's connection error (and failed on it)
    assert refused.returncode != 0
    assert "a fork sends effects only to --effects-url" in refused.stdout + refused.stderr
    assert (tmp_path / "refused.steno").exists()
    # sent: to the test service, with an idempotency key and the fork's fencing token
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert test_stats["payments"] == 1 and test_stats["servers"] == 0
    shown = cli("show", str(tmp_path / "sent.steno"))
    assert "effect: POST" in shown.stdout and "settled" in shown.stdout
    shutil.rmtree(tmp_path / "eff", ignore_errors=True)


def test_fork_bad_input_is_one_line_and_writes_nothing(base: tuple[Path, list],
                                                      tmp_path: Path) -> None:
    steno, _ = base
    out = tmp_path / "x.steno"
    cases = [
        ["--at", "2", "-o", str(out)],  # nothing changes
        ["--at", "9", "--model-url", "http://127.0.0.1:9/v1", "-o", str(out)],
        ["--at", "2", "--model-url", "ftp://x", "-o", str(out)],
        ["--at", "2", "--reply", str(tmp_path / "missing.json"), "-o", str(out)],
        ["--at", "2", "--model-url", "http://127.0.0.1:9/v1", "-o",
         str(tmp_path / "no" / "x.steno")],
        ["--at", "2", "--model-url", "http://127.0.0.1:9/v1", "-o", str(steno)],
    ]
    size = steno.stat().st_size
    for args in cases:
        p = cli("fork", str(steno), *args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.count("\n") == 1, p.stderr
        assert not out.exists()
    assert steno.stat().st_size == size
