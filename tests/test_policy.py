"""Authorization and budgets, checked by the recorder before every model call and
effect of real programs: a denied effect fails in the program as its HTTP library's own
connection error and never reaches the service; a held one pauses for a person; a spent
budget stops the run (exit 6) and a resume with a larger one finishes it. Also: async
clients' effects (httpx, aiohttp, the asyncio loop on the tape) get their durable
intent and headers like sync ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stenograph.recorder.reader import StoreReader
from stenograph.recorder.resumes import states
from stenograph.testing.effect_service import EffectService
from stenograph.testing.model_server import ModelServer

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import requests, sys
base = sys.argv[1]
print("servers", requests.get(base + "/servers", params={"name": "a"}).json())
try:
    requests.post(base + "/payments", json={"amount": 5, "to": "x"})
    print("paid")
except requests.exceptions.ConnectionError as e:
    print("refused:", e)
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.json()["id"])
"""
POLICY = """
default = "allow"
[[rule]]
match = "^POST .*/payments$"
action = "deny"
[[rule]]
match = "^POST .*/servers$"
action = "hold"
summary = "a new server"
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}


def _cli(*args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd,
                          env=env or _env(), timeout=120)


def test_policy_denies_and_holds_effects_by_target(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PROGRAM)
    (tmp_path / "policy.toml").write_text(POLICY)
    store = tmp_path / "s"
    with EffectService() as svc:
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "--policy", str(tmp_path / "policy.toml"), "-o", str(tmp_path / "t.steno"),
                   "--", sys.executable, str(tmp_path / "p.py"), svc.url, cwd=tmp_path)
        assert rec.returncode == 5, rec.stderr  # held: the new server waits for a person
        assert "refused: stenograph: the run's policy denies POST" in rec.stdout
        assert svc.stats()["payments"] == 0 and svc.stats()["servers"] == 0
        auth = [e.body for e in StoreReader(store).events(traj="t") if e.kind == "Authorized"]
        assert [a["decision"] for a in auth] == ["deny", "hold"]  # the GET is no effect
        assert len({a["policy"] for a in auth}) == 1 and len(auth[0]["policy"]) == 64
        (st,) = states(store, "t")
        (call,) = [a.call_id for a in st.approvals]
        assert _cli("approve", str(store), "t", call, "--by", "ops").returncode == 0
        res = _cli("resume", str(store), "t", "--policy", str(tmp_path / "policy.toml"),
                   cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "server srv_1" in res.stdout and "refused" in res.stdout
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 0


def test_a_bad_policy_is_one_line_and_nothing_is_made(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[[rule]]\nmatch = "("\naction = "allow"\n')
    out = _cli("record", "--store", str(tmp_path / "s"), "--policy",
               str(tmp_path / "bad.toml"), "--", sys.executable, "-c", "print(1)",
               cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "bad regex" in out.stderr
    assert not (tmp_path / "s").exists()
    for text, says in (('[[probe]]\nmatch = "^exec git push"\n', "needs a match pattern"),
                       ('[connections]\nread_only = "tcp *:5432"\n', "list of globs")):
        (tmp_path / "bad.toml").write_text(text)
        out = _cli("record", "--store", str(tmp_path / "s"), "--policy",
                   str(tmp_path / "bad.toml"), "--", sys.executable, "-c", "print(1)",
                   cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert says in out.stderr, out.stderr
        assert not (tmp_path / "s").exists()


def test_a_spent_token_budget_stops_the_run_and_a_larger_one_finishes_it(
        tmp_path: Path) -> None:
    store = tmp_path / "s"
    with EffectService() as svc, ModelServer(script=ROOT / "examples" / "effect_script.json"
                                             ) as models:
        env = {**_env(), "EFFECT_URL": svc.url, "OPENAI_BASE_URL": models.openai_base_url,
               "OPENAI_API_KEY": "sk-test"}
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "--budget-tokens", "1", "-o", str(tmp_path / "t.steno"), "--",
                   sys.executable, str(ROOT / "examples" / "effect_agent.py"), cwd=tmp_path,
                   env=env)
        assert rec.returncode == 6, rec.stderr
        lines = [ln for ln in rec.stderr.splitlines() if ln.startswith("stenograph:")]
        assert len(lines) == 1 and "token budget (1) is spent" in lines[0], rec.stderr
        assert "before 0/model/1 (POST " in lines[0], lines  # the call it stopped before
        assert f"stenograph resume {store} t" in lines[0], lines
        assert len(models.requests) == 1  # stopped before the second model call
        (st,) = states(store, "t")
        assert st.state == "stopped"
        res = _cli("resume", str(store), "t", "--budget-tokens", "100000", cwd=tmp_path,
                   env=env)
        assert res.returncode == 0, res.stderr
        assert "hosting is paid" in res.stdout
        assert svc.stats()["payments"] == 1 and svc.stats()["servers"] == 1
        auth = [e.body for e in StoreReader(store).events(traj="t") if e.kind == "Authorized"]
        used = [a["tokens_used"] for a in auth]
        assert used == sorted(used) and used[-1] > 1 and auth[-1]["tokens_left"] > 0


ASYNC = """
import asyncio, sys
import aiohttp, httpx
base = sys.argv[1]
async def main():
    async with httpx.AsyncClient() as c:
        r = await c.post(base + "/payments", json={"amount": 1, "to": "httpx"})
        print("httpx", r.json()["id"])
    async with aiohttp.ClientSession() as s:
        async with s.post(base + "/payments", json={"amount": 2, "to": "aiohttp"}) as r:
            print("aiohttp", (await r.json())["id"])
asyncio.run(main())
"""


def test_async_clients_effects_are_durable_before_they_are_sent(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(ASYNC)
    store, seen = tmp_path / "s", []

    def at_dispatch(path: str, headers: dict[str, str]) -> None:
        key = headers.get("Idempotency-Key")
        intents = [e for e in StoreReader(store).events(traj="t")
                   if e.kind == "ToolIntent" and e.body.get("idempotency_key") == key]
        seen.append((key, len(intents), headers.get("Stenograph-Fencing-Token")))

    with EffectService() as svc:
        svc.on_effect = at_dispatch
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "-o", str(tmp_path / "t.steno"), "--", sys.executable,
                   str(tmp_path / "a.py"), svc.url, cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert len(seen) == 2
    for key, n, fence in seen:
        assert key and n == 1 and fence == "t:0", seen
    rep = _cli("replay", str(tmp_path / "t.steno"), cwd=tmp_path)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr


def test_usage_and_prices_from_each_reply_format() -> None:
    import json

    from stenograph.recorder.policy import Budget, price_of, usage_of

    chat = json.dumps({"model": "gpt-4o-2024-08-06", "usage": {
        "prompt_tokens": 1000, "completion_tokens": 200}}).encode()
    assert usage_of(chat) == ("gpt-4o-2024-08-06", 1000, 200)
    sse = (b'data: {"model":"gpt-4o-mini","choices":[]}\n\n'
           b'data: {"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":7,'
           b'"completion_tokens":3}}\n\ndata: [DONE]\n\n')
    assert usage_of(sse) == ("gpt-4o-mini", 7, 3)
    anth = (b'event: message_start\ndata: {"type":"message_start","message":{"model":'
            b'"claude-sonnet-4-20250514","usage":{"input_tokens":50,"output_tokens":1}}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","usage":'
            b'{"output_tokens":40}}\n\n')
    assert usage_of(anth) == ("claude-sonnet-4-20250514", 50, 40)
    responses = json.dumps({"type": "response.completed", "response": {
        "model": "gpt-4.1", "usage": {"input_tokens": 9, "output_tokens": 4}}}).encode()
    assert usage_of(b"data: " + responses + b"\n\n") == ("gpt-4.1", 9, 4)
    prices = {"gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6)}
    assert price_of(prices, "gpt-4o-mini-2024-07-18") == (0.15, 0.6)  # the longest prefix
    assert price_of(prices, "o3") is None
    b = Budget(usd=0.004, prices=prices)
    b.spend("gpt-4o-2024-08-06", 1000, 200)  # 0.0025 + 0.002
    assert b.exhausted() is not None and "$0.004" in b.exhausted()
    b2 = Budget(tokens=10, prices=prices)
    b2.spend("o3", 5, 4)
    assert b2.exhausted() is None and b2.unpriced == {"o3"}
    b2.spend("o3", 1, 0)
    assert "token budget (10)" in (b2.exhausted() or "")
