"""Durable effects on an agent people write: the official ``openai`` SDK, payments as
plain ``requests.post`` calls, a declared effect tool whose body is an HTTP call, a
payment held for a person above an amount, the program's own idempotency key on one
payee (``tests/programs/payments_agent.py``), against a service that honours keys
(payments) and one that does not (servers).

Everything is real: the recorder and the program under the shim, killed as a process
group with SIGKILL at every boundary of the effect sequence (an effect's request
arriving with its intent durable; applied, before its answer) and at random moments, up
to three times in a row, then resumed until the run ends, approving or denying what it
asks. The service is the ground truth:

* every intended payment is made exactly once, denied ones never, one server;
* before every resume ``stenograph status`` lists every payment the service made and
  calls settled only what it made;
* one request per idempotency key: no key the service saw came with two bodies (a key is
  never sent for another intent), whatever the crashes shifted;
* nothing settled is sent again.

``STENO_PAY_TRIALS`` sets the number of generated trials (``make soak`` runs more).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from crashes import Run, go, service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stenograph.recorder.errors import BadInput
from stenograph.recorder.resumes import states
from stenograph.testing.effect_service import Drop, EffectService
from stenograph.testing.model_server import ModelServer

CLI = [sys.executable, "-m", "stenograph"]
AGENT = Path(__file__).parent / "programs" / "payments_agent.py"
APPROVE_ABOVE = 550
TRIALS = int(os.environ.get("STENO_PAY_TRIALS", "2"))
ALL_BOUNDARIES = os.environ.get("STENO_PAY_BOUNDARIES") == "all"
"""``make soak``: every boundary of every effect; ``make test``: one of each kind of
effect (a plain payment, the declared tool, the program's own key, the approved one)."""

Pay = tuple[int, str]


def _script(turns: list[list[tuple[str, dict[str, str]]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"text": f"step {i}", "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
        for i, calls in enumerate(turns)]
    out.append({"text": "all settled"})
    return out


def _turns(pays: list[Pay], provision_at: int) -> list[list[tuple[str, dict[str, str]]]]:
    """Two calls a turn; the provisioning at its place among the payments."""
    calls: list[tuple[str, dict[str, str]]] = [
        ("pay", {"amount": str(a), "to": t}) for a, t in pays]
    calls.insert(min(provision_at, len(calls)), ("provision", {"name": "web1"}))
    return [calls[i:i + 2] for i in range(0, len(calls), 2)]


def _env(model: ModelServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env.update(OPENAI_BASE_URL=model.openai_base_url, **extra)
    return env


def _go(run: Run, argv: list[str], cwd: Path, env: dict[str, str],
        stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return go(run, argv, cwd, env, stdout)


def _status(store: Path) -> dict[str, Any] | None:
    try:
        (state,) = states(store, "t")
    except BadInput:
        return None
    return state.to_json()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60)


def trial(tmp: Path, pays: list[Pay], provision_at: int, kills: list[tuple[str, Any] | None],
          deny: set[int], **agent_env: str) -> dict[str, Any]:
    """Record the agent (``pays`` and one provisioning, in that script) killed at
    ``kills[0]``, resume killed at ``kills[1]``..., deny the approvals of the payments at
    the indices in ``deny`` and approve the rest, resume until the run ends; check the
    ground truth at every step. Returns what happened."""
    tmp.mkdir(parents=True, exist_ok=True)
    store = tmp / "store"
    current = [Run(None)]
    runs: list[Run] = []
    asked: list[str] = []
    with ModelServer(script=_script(_turns(pays, provision_at))) as model, \
            service(current) as svc:
        env = _env(model, **agent_env)
        for i in range(len(kills) + 12):
            run = Run(kills[i] if i < len(kills) else None)
            state = _status(store) if i else None
            settled: dict[str, int] = {}
            if state is None:  # nothing durable yet: nothing was sent, record (again)
                assert not svc.payments and not svc.servers, (svc.payments, svc.servers)
                argv = [*CLI, "record", "--store", str(store), "--traj", "t",
                        "--workspace", "none", "-o", str(tmp / "t.steno"), "--",
                        sys.executable, str(AGENT), svc.url]
            else:
                if state["state"] == "ended":
                    break
                _agrees(state, svc)
                settled = {e["idempotency_key"]: svc.by_key[e["idempotency_key"]]
                           for e in state["effects"] if e["state"] == "settled"
                           and e["idempotency_key"]}
                for a in state["approvals"]:
                    if a["state"] == "pending":
                        asked.append(a["call"])
                        n = int(a["call"].split()[1])
                        which = "deny" if any(
                            pays[k][0] == n for k in deny) else "approve"
                        done = _cli(which, str(store), "t", a["call_id"], "--by", "ops",
                                    env=env)
                        assert done.returncode == 0, done.stderr
                argv = [*CLI, "resume", str(store), "t"]
            current[0] = run
            runs.append(run)
            done = _go(run, argv, tmp, env)
            if not run.killed.is_set():
                assert done.returncode in (0, 5), (i, done.stderr[-3000:])
                lines = [ln for ln in done.stderr.splitlines() if ln.startswith("stenograph:")]
                if done.returncode == 5:  # one line for the person, naming the call
                    assert len(lines) == 1 and "waits for approval" in lines[0], lines
                    assert "stenograph approve|deny" in lines[0], lines
                else:
                    assert "done: all settled" in done.stdout, (done.stdout, done.stderr)
            resent = {k for k, n in settled.items() if svc.by_key[k] != n}
            assert not resent, f"a resume sent settled effects again: {resent}"
        else:
            raise AssertionError(f"not ended after {len(runs)} runs")
        denied = {pays[k] for k in deny}
        want = Counter(p for p in pays if not (p[0] > APPROVE_ABOVE and p in denied))
        made = Counter((p["amount"], p["to"]) for p in svc.payments)
        assert made == want, f"payments made {made}, intended {want}"
        assert svc.stats()["by_name"] == {"web1": 1}, svc.servers
        assert svc.stats()["keys_reused"] == [], "a key was sent for another intent"
        final = _status(store)
        assert final is not None and final["state"] == "ended"
        assert all(e["state"] == "settled" for e in final["effects"]), final["effects"]
        # the whole run -- the recording and each resume's continuation -- is one tape
        whole = tmp / "whole.steno"
        assert _cli("log", "export", str(store), "t", "-o", str(whole),
                    env=env).returncode == 0
        again = _cli("replay", str(whole), env=env)
        assert again.returncode == 0, again.stderr[-3000:]
        return {"runs": len(runs), "asked": asked}


def _agrees(state: dict[str, Any], svc: EffectService) -> None:
    """What ``status`` says against what the service did: every payment it made is
    listed (settled or in doubt), nothing listed as settled was not made."""
    listed = {e["idempotency_key"]: e["state"] for e in state["effects"]}
    applied = svc.applied()
    missing = applied - set(listed)
    assert not missing, f"the service made payments status does not list: {missing}"
    wrong = {e["idempotency_key"] for e in state["effects"] if e["state"] == "settled"
             and e["target"].endswith("/payments") and e["idempotency_key"] not in applied}
    assert not wrong, f"status says settled what the service never made: {wrong}"
    if svc.servers:
        tools = [e for e in state["effects"] if e["target"] == "tool provision"]
        assert tools and tools[0]["state"] in ("settled", "in-doubt"), state["effects"]


PAYS: list[Pay] = [(101, "acct-A"), (202, "acct-B"), (303, "acct-C"), (404, "acct-K"),
                   (505, "acct-E"), (606, "acct-F")]


def _boundaries(n_effects: int) -> list[tuple[str, int]]:
    return [(kind, n) for n in range(1, n_effects + 1) for kind in ("dispatch", "applied")]


def test_the_agent_crashed_at_every_effect_boundary_resumes_each_effect_once(
        tmp_path: Path) -> None:
    """Six payments (one held above the amount, one with the program's own key) and a
    provisioning inside a declared tool: killed at a boundary of an effect (each boundary
    of each of the seven in soak), then resumed to the end (approving the held one)."""
    seen = []
    every = _boundaries(len(PAYS) + 1)
    picked = every if ALL_BOUNDARIES else [("dispatch", 1), ("applied", 7)]
    for i, b in enumerate(picked):
        seen.append(trial(tmp_path / f"b{i}", PAYS, 2, [b], set()))
    assert all(s["asked"] == ["pay 606 to acct-F"] for s in seen), seen


def test_an_async_agent_with_sync_tools_crashed_twice_resumes_and_replays_whole(
        tmp_path: Path) -> None:
    """``AsyncOpenAI`` in ``asyncio.run``, the tools synchronous: killed in the record and
    again in the first resume. Each resume went live with the loop's tasks taken for
    plumbing (their steps ran untaped), so a second resume never got past its prefix and
    the finished run did not replay."""
    trial(tmp_path / "async", PAYS[:4], 2, [("dispatch", 1), ("dispatch", 3)], set(),
          ASYNC="1")


def test_approve_then_resume_makes_the_approved_payment_once_with_its_own_key(
        tmp_path: Path) -> None:
    """The reported failure: after approve and resume, the approved payment went out
    with an earlier payment's key, the service answered from its key store, and the
    agent printed that payment's receipt as its own."""
    result = trial(tmp_path / "a", PAYS, 2, [], set())
    assert result["asked"] == ["pay 606 to acct-F"]


def test_deny_then_resume_never_makes_the_payment(tmp_path: Path) -> None:
    trial(tmp_path / "d", PAYS, 2, [], {5})


def test_an_approval_that_expired_before_it_was_given_is_denied(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with ModelServer(script=_script(_turns([(606, "acct-F"), (1, "acct-A")], 9))) as model, \
            EffectService() as svc:
        env = _env(model, APPROVE_WITHIN="0.3")
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "-o", str(tmp_path / "t.steno"), "--", sys.executable, str(AGENT), svc.url,
                   env=env)
        assert rec.returncode == 5, rec.stderr
        time.sleep(0.5)
        (a,) = _status(store)["approvals"]  # type: ignore[index]
        assert _cli("approve", str(store), "t", a["call_id"], "--by", "ops",
                    env=env).returncode == 0
        res = _cli("resume", str(store), "t", env=env)
        assert res.returncode == 0, res.stderr
        assert "expired" in res.stdout, res.stdout
        assert [(p["amount"], p["to"]) for p in svc.payments] == [(1, "acct-A")]


@settings(max_examples=TRIALS, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_generated_runs_crashed_and_resumed_send_one_request_per_key(
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """The key property, over generated payment sequences (identical payments repeated
    on purpose: they are two intents, and must get two keys), crash plans (boundaries and
    random moments, up to three crashes in a row) and approve/deny decisions: every
    payment the agent means is made once, and no key comes with two requests."""
    pays = data.draw(st.lists(st.sampled_from(
        [(101, "acct-A"), (101, "acct-A"), (202, "acct-B"), (404, "acct-K"),
         (606, "acct-F"), (707, "acct-G")]), min_size=1, max_size=5), label="payments")
    provision_at = data.draw(st.integers(0, len(pays)), label="provision at")
    n = len(pays) + 1
    kill = st.one_of(st.sampled_from(_boundaries(n)),
                     st.tuples(st.just("timer"), st.floats(0.3, 2.5).map(
                         lambda x: round(x, 2))))
    kills = data.draw(st.lists(kill, min_size=0, max_size=3), label="kills")
    deny = data.draw(st.sets(st.sampled_from(range(len(pays)))), label="deny")
    trial(tmp_path_factory.mktemp("gen"), pays, provision_at, kills, deny)


def test_two_workers_the_first_stopped_past_its_lease_is_fenced(tmp_path: Path) -> None:
    """Record, killed at the second payment; resume A is SIGSTOPped as its first live
    payment reaches the service, past its lease; resume B takes the run over and ends
    it; A, continued, finds it lost the lease: one line, exit 8, and nothing it sends
    is applied (a stale fencing token)."""
    store = tmp_path / "s"
    current = [Run(("dispatch", 2))]
    stop_a = threading.Event()
    with ModelServer(script=_script(_turns(PAYS[:4], 9))) as model, \
            service(current) as svc:
        env = _env(model)
        orig = svc.on_effect

        def on_effect(path: str, headers: dict[str, str]) -> None:
            if stop_a.is_set() and current[0].proc is not None:
                stop_a.clear()
                os.killpg(current[0].proc.pid, signal.SIGSTOP)
                raise Drop()
            orig(path, headers)

        svc.on_effect = on_effect
        rec = _go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t",
                               "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                               sys.executable, str(AGENT), svc.url], tmp_path, env)
        assert current[0].killed.is_set(), rec.stderr
        a = current[0] = Run(None)
        stop_a.set()
        a.proc = subprocess.Popen([*CLI, "resume", str(store), "t", "--lease-ttl", "1"],
                                  cwd=tmp_path, env=env, start_new_session=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while stop_a.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not stop_a.is_set(), "resume A never reached its payment"
            time.sleep(1.5)  # past A's lease
            b = current[0] = Run(None)
            done_b = _go(b, [*CLI, "resume", str(store), "t"], tmp_path, env)
            assert done_b.returncode == 0, done_b.stderr
            assert "done: all settled" in done_b.stdout
            os.killpg(a.proc.pid, signal.SIGCONT)
            _out, err_a = a.proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.proc.pid, signal.SIGKILL)
        assert a.proc.returncode == 8, err_a
        lines = [ln for ln in err_a.splitlines() if ln.startswith("stenograph:")]
        assert len(lines) == 1 and "lost the lease" in lines[0], err_a
        assert "stenograph status" in lines[0]
        made = Counter((p["amount"], p["to"]) for p in svc.payments)
        assert made == Counter(PAYS[:4]), made
        assert svc.stats()["keys_reused"] == []


def test_a_resume_keeps_its_own_output_and_a_persons_files(tmp_path: Path) -> None:
    """The workspace is the working directory (the default). The run writes a ledger;
    it is killed at its third payment. Since the crash a person has added a file, edited
    one the run never wrote, and edited the ledger; the resume's output goes to a file
    in the workspace. After the resume: the person's new and edited files are as they
    left them, the resume's output is whole, the ledger holds each payment once, and the
    person's edit of the ledger (in the way of the run's writes) is set aside and
    listed, not lost."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README").write_text("the project\n")
    store = tmp_path / "s"
    current = [Run(("dispatch", 3))]
    with ModelServer(script=_script(_turns(PAYS[:4], 9))) as model, \
            service(current) as svc:
        env = _env(model, LEDGER=str(ws / "ledger.txt"))
        _go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t",
                         "-o", str(tmp_path / "t.steno"), "--", sys.executable, str(AGENT),
                         svc.url], ws, env)
        assert current[0].killed.is_set()
        assert len((ws / "ledger.txt").read_text().splitlines()) == 2
        (ws / "notes.txt").write_text("a person's notes\n")
        (ws / "README").write_text("the project, edited\n")
        with (ws / "ledger.txt").open("a") as f:
            f.write("checked by a person\n")
        current[0] = Run(None)
        with (ws / "resume.log").open("w") as log:
            done = _go(current[0], [*CLI, "resume", str(store), "t"], ws, env, stdout=log)
        assert done.returncode == 0, done.stderr
        assert (ws / "notes.txt").read_text() == "a person's notes\n"
        assert (ws / "README").read_text() == "the project, edited\n"
        log_text = (ws / "resume.log").read_text()
        assert "done: all settled" in log_text and log_text.count("pay ") == 4, log_text
        ledger = (ws / "ledger.txt").read_text().splitlines()
        assert [ln.split()[1:] for ln in ledger] == [[str(a), t] for a, t in PAYS[:4]], ledger
        set_aside = [ln for ln in done.stderr.splitlines() if "set aside" in ln]
        assert len(set_aside) == 1 and "ledger.txt" in set_aside[0], done.stderr
        kept = list((store / "set-aside").rglob("ledger.txt"))
        assert len(kept) == 1 and "checked by a person" in kept[0].read_text()
        assert Counter((p["amount"], p["to"]) for p in svc.payments) == Counter(PAYS[:4])


def test_an_unsettleable_effect_stops_with_one_line_naming_it(tmp_path: Path) -> None:
    """A declared effect without key or probe, left in doubt: the resume stops for a
    person with one line naming the call, what it sends and the command to run."""
    prog = tmp_path / "p.py"
    prog.write_text(
        "import sys, requests, stenograph\n"
        "@stenograph.tool(effect=True)\n"
        "def provision(name):\n"
        "    return requests.post(sys.argv[1] + '/servers', json={'name': name}).json()\n"
        "print(provision('db1'))\n")
    store = tmp_path / "s"
    current = [Run(("applied", 1))]
    with service(current) as svc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
        _go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t",
                         "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                         sys.executable, str(prog), svc.url], tmp_path, env)
        assert current[0].killed.is_set()
        current[0] = Run(None)
        done = _go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, env)
    assert done.returncode == 4, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("stenograph:")]
    assert len(lines) == 1, done.stderr
    assert "0/tool/0 (tool provision(\"db1\"))" in lines[0], lines[0]
    assert f"stenograph settle {store} t 0/tool/0" in lines[0], lines[0]
