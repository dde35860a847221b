"""Intent before effect on a tool's own connection (issue "Intent before effect at every
way out", its first part for HTTP): an HTTP request that changes things, sent by a
program the agent runs (``curl``) or by a client no hook knows (``urllib``), gets a
durable ``ToolIntent`` before its first byte leaves and a ``ToolResult`` when its answer
begins (``shim_c/net.c``). A crash between the two leaves it in doubt: ``status`` says
so, ``resume`` stops for a person (exit 4, one line), and after ``settle`` the resumed
run makes it again only if the person said it did not happen. Read-only requests in
flight at the crash are made again live. The effect service counts what really
happened; nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from crashes import Run, go, service, started

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
TRIALS = int(os.environ.get("STENO_NET_CRASH_TRIALS", "2"))
"""Crash-anywhere trials per tool (``make soak``: 60)."""

pytestmark = pytest.mark.skipif(not shutil.which("curl"), reason="curl is not installed")


AGENT = """
import json, subprocess, sys
url = sys.argv[1]

def curl(*args):
    out = subprocess.run(["curl", "-s", *args], capture_output=True, text=True)
    return out.stdout or f"curl failed ({out.returncode})"

def pay(to):
    body = json.dumps({"amount": 7, "to": to})
    return curl("-X", "POST", "-H", "Content-Type: application/json", "-d", body,
                url + "/payments")

print("paid", pay("acct-A"), flush=True)
print("servers", curl(url + "/servers?name=web"), flush=True)
print("paid", pay("acct-B"), flush=True)
"""
AGENT_URLLIB = """
import json, sys, urllib.request
url = sys.argv[1]

def pay(to):
    req = urllib.request.Request(url + "/payments", method="POST",
                                 data=json.dumps({"amount": 7, "to": to}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except OSError as e:
        return f"failed ({type(e).__name__})"

print("paid", pay("acct-A"), flush=True)
print("servers", urllib.request.urlopen(url + "/servers?name=web", timeout=10).read().decode(),
      flush=True)
print("paid", pay("acct-B"), flush=True)
"""

AGENT_NODE = AGENT.replace(
    """def pay(to):
    body = json.dumps({"amount": 7, "to": to})
    return curl("-X", "POST", "-H", "Content-Type: application/json", "-d", body,
                url + "/payments")""",
    """def pay(to):
    js = ("fetch(process.argv[1] + '/payments', {method: 'POST', headers: {'Content-Type': "
          "'application/json'}, body: JSON.stringify({amount: 7, to: process.argv[2]})})"
          ".then(r => r.text()).then(t => console.log(t), e => console.log('failed'))")
    out = subprocess.run(["node", "-e", js, url, to], capture_output=True, text=True)
    return out.stdout.strip() or f"node failed ({out.returncode})\"""")
AGENTS = {"curl": AGENT, "urllib": AGENT_URLLIB, "node": AGENT_NODE}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _status(store: Path) -> list[tuple[str, str, str]]:
    out = subprocess.run([*CLI, "status", str(store), "t"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] != "did:":  # (what an effect in doubt did)
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def _payee(store: Path, call: str) -> str:
    """Whom an intent pays: what its request sent, when its first send held the body
    (curl, node); else its place among the payment intents (urllib sends the body on
    its own: the first payment pays acct-A)."""
    from stenograph.recorder.reader import StoreReader

    intents = [ev.body for ev in StoreReader(store).events(traj="t")
               if ev.kind == "ToolIntent" and "@" not in str(ev.body.get("call_id"))]
    for i, body in enumerate(intents):
        if body.get("call_id") == call:
            args = str(body.get("arguments") or "")
            return ("acct-A" if "acct-A" in args else "acct-B" if "acct-B" in args
                    else ("acct-A", "acct-B")[i])
    raise AssertionError(f"no intent {call}")


def _settle(store: Path, call: str, decision: str) -> None:
    subprocess.run([*CLI, "settle", str(store), "t", call, "--as", decision], check=True,
                   capture_output=True, text=True, timeout=60)


def test_a_payment_in_doubt_stops_for_a_person_and_is_made_once(tmp_path: Path) -> None:
    """Killed as the first payment reaches the service (dropped there: not made)."""
    (tmp_path / "agent.py").write_text(AGENT)
    store = tmp_path / "store"
    current = [Run(kill=("dispatch", 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        assert current[0].killed.is_set() and svc.stats()["payments"] == 0
        rows = _status(store)
        assert [(c, s) for c, s, _ in rows] == [("0.1/net/0.1", "in-doubt")], rows
        call, _, target = rows[0]
        assert target.startswith(f"POST {svc.url}/payments  by curl -s -X POST "), rows
        current[0] = Run(kill=None, resume=True)
        stop = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert stop.returncode == 4, stop.stderr
        line = stop.stderr.strip().splitlines()[-1]
        assert call in line and '"to": "acct-A"' in line and "settle" in line, stop.stderr
        assert svc.stats()["payments"] == 0
        _settle(store, call, "not-done")  # the person asked the service: nothing arrived
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]
        assert '"to": "acct-A"' in res.stdout and "servers" in res.stdout, res.stdout
    rows = _status(store)  # the one in doubt (settled: not done), its redo, the second
    assert [s for _, s, _ in rows] == ["settled"] * 3, rows
    assert rows[1][0].startswith(f"{call}@"), rows


def test_a_payment_settled_as_done_is_not_made_again(tmp_path: Path) -> None:
    """Killed after the service made the first payment, before its answer: settled as
    done with no answer, the resumed run does not send it again (curl sees its send
    fail, as a lost connection: the line `settle` prints says so, and `status` marks it)
    and goes on to the second."""
    (tmp_path / "agent.py").write_text(AGENT)
    store = tmp_path / "store"
    current = [Run(kill=("applied", 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        assert svc.stats()["payments"] == 1
        (call, state, _), = _status(store)
        assert state == "in-doubt"
        said = subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done"],
                              capture_output=True, text=True, timeout=60)
        assert said.returncode == 0 and "lost connection" in said.stderr, said.stderr
        assert "(done, no answer)" in subprocess.run(
            [*CLI, "status", str(store), "t"], capture_output=True, text=True).stdout
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]
        assert "paid curl failed" in res.stdout, res.stdout


def _whole_replays(store: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.steno"
    subprocess.run([*CLI, "log", "export", str(store), "t", "-o", str(whole)], check=True,
                   capture_output=True, timeout=60)
    rep = subprocess.run([*CLI, "replay", str(whole)], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr[-3000:]


@pytest.mark.parametrize("tool", sorted(AGENTS))
def test_settled_done_with_its_answer_the_program_reads_it_on_its_own_socket(
        tmp_path: Path, tool: str) -> None:
    """Killed once the first payment is made, before its answer: the person finds it in
    the ledger and gives its answer (`settle --as done --result`). The resumed curl,
    urllib or node child reads it as if the service had sent it -- no payment made
    twice, none told it failed -- and the finished run replays as one tape."""
    if tool == "node" and not shutil.which("node"):
        pytest.skip("node is not installed")
    (tmp_path / "agent.py").write_text(AGENTS[tool])
    store = tmp_path / "store"
    current = [Run(kill=("applied", 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        (call, state, _), = _status(store)
        assert state == "in-doubt" and svc.stats()["payments"] == 1
        (tmp_path / "answer.json").write_text(json.dumps({**svc.payments[0], "from": "ops"}))
        subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done", "--result",
                        str(tmp_path / "answer.json")], check=True, capture_output=True,
                       timeout=60)
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]
        first = res.stdout.splitlines()[0]
        assert '"id": "pay_1"' in first and '"from": "ops"' in first, res.stdout
        _whole_replays(store, tmp_path)
    assert "(done, answer given)" in subprocess.run(
        [*CLI, "status", str(store), "t"], capture_output=True, text=True).stdout


def test_settled_done_with_the_commands_output_it_is_not_run_again(tmp_path: Path) -> None:
    """The same payment settled with the output of the command that made it (`--output
    FILE --exit N`): curl is not started again; the agent reads FILE as curl's stdout."""
    (tmp_path / "agent.py").write_text(AGENT)
    store = tmp_path / "store"
    current = [Run(kill=("applied", 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        (call, _, _), = _status(store)
        (tmp_path / "out.txt").write_text('{"id": "pay_1", "seen": "in the ledger"}')
        bad = subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "not-done",
                              "--output", str(tmp_path / "out.txt")], capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 2 and "not-done" in bad.stderr, bad.stderr
        subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done", "--output",
                        str(tmp_path / "out.txt"), "--exit", "0"], check=True,
                       capture_output=True, timeout=60)
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]
        assert res.stdout.startswith('paid {"id": "pay_1", "seen": "in the ledger"}'), \
            res.stdout
        _whole_replays(store, tmp_path)


@pytest.mark.parametrize("tool", sorted(AGENTS))
def test_an_effect_in_doubt_shows_what_it_did(tmp_path: Path, tool: str) -> None:
    """Which of the payments is it? `status` (text and --json), the exit-4 line and
    `view` show the process, the request's method, URL and body start -- urllib and
    Node's fetch send the body apart from the head, and it is still there."""
    if tool == "node" and not shutil.which("node"):
        pytest.skip("node is not installed")
    (tmp_path / "agent.py").write_text(AGENTS[tool])
    store = tmp_path / "store"
    current = [Run(kill=("dispatch", 2))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        doc = json.loads(subprocess.run([*CLI, "status", "--json", str(store), "t"],
                                        capture_output=True, text=True, check=True).stdout)
        (eff,) = [e for e in doc["effects"] if e["state"] == "in-doubt"]
        did = eff["did"]
        assert did["request"]["method"] == "POST", did
        assert did["request"]["url"] == f"{svc.url}/payments", did
        assert "acct-B" in did["request"]["body"] and "7" in did["request"]["body"], did
        assert did["process"] and did["command"], did
        text = subprocess.run([*CLI, "status", str(store), "t"], capture_output=True,
                              text=True).stdout
        assert "did: POST" in text and "acct-B" in text, text
        current[0] = Run(kill=None, resume=True)
        stop = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert stop.returncode == 4
        line = stop.stderr.strip().splitlines()[-1]
        assert "acct-B" in line and "--result" in line and "--output" in line, line
        page = tmp_path / "run.html"
        subprocess.run([*CLI, "log", "export", str(store), "t", "-o", str(tmp_path / "x.steno")],
                       check=True, capture_output=True)
        subprocess.run([*CLI, "view", str(tmp_path / "x.steno"), "-o", str(page)], check=True,
                       capture_output=True)
        assert "did: POST" in page.read_text() and "acct-B" in page.read_text()


def test_a_read_in_flight_at_the_crash_is_made_again_live(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    store = tmp_path / "store"
    current = [Run(kill=("read", 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        assert [s for _, s, _ in _status(store)] == ["settled"]  # the first payment's answer
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert 'servers {"servers": []}' in res.stdout, res.stdout  # asked again, answered
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]


@pytest.mark.parametrize("tool", sorted(AGENTS))
def test_crash_anywhere_then_resume_until_done_every_payment_exactly_once(
        tmp_path: Path, tool: str) -> None:
    """Killed at a random moment (or at a service boundary), then: the test is the
    person -- for each effect in doubt it reads whom the request paid and asks the
    service whether that payment happened, and settles accordingly -- and resumes, until
    the run ends. Each payment exactly once by the service's own count; no effect the
    service made is ever listed as anything but in doubt or settled."""
    if tool == "node" and not shutil.which("node"):
        pytest.skip("node is not installed")
    rnd = random.Random(22)
    (tmp_path / "agent.py").write_text(AGENTS[tool])
    points: list[tuple[str, object]] = [("dispatch", 1), ("applied", 1), ("read", 1),
                                        ("dispatch", 2), ("applied", 2)]
    for trial in range(TRIALS):
        kill = points[trial] if trial < len(points) else ("timer", rnd.uniform(0.6, 3.0))
        store = tmp_path / f"store{trial}"
        current = [Run(kill=kill)]
        with service(current) as svc:
            go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                            "agent.py", svc.url], tmp_path, _env())
            if not started(store):  # killed before the trajectory began: nothing ran
                assert svc.stats()["payments"] == 0, kill
                continue
            for _ in range(4):
                rows = _status(store)
                made = {p["to"] for p in svc.payments}
                for call, state, _target in rows:
                    assert state in ("in-doubt", "settled"), (kill, rows)
                    if state == "in-doubt":
                        payee = _payee(store, call)
                        _settle(store, call, "done" if payee in made else "not-done")
                current[0] = Run(kill=None, resume=True)
                res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
                if res.returncode == 0 and "already ended" not in res.stderr:
                    break
                assert res.returncode in (0, 4), (kill, res.stderr)
            assert sorted(p["to"] for p in svc.payments) == ["acct-A", "acct-B"], (
                kill, svc.payments)


AGENT_KEYED = AGENT.replace(
    '''    return curl("-X", "POST", "-H", "Content-Type: application/json", "-d", body,
                url + "/payments")''',
    '''    return curl("-X", "POST", "-H", "Content-Type: application/json",
                "-H", f"Idempotency-Key: pay-{to}-1", "-d", body, url + "/payments")''')


@pytest.mark.parametrize("boundary", ["dispatch", "applied"])
def test_a_request_with_an_idempotency_key_is_sent_again_by_the_resume_itself(
        tmp_path: Path, boundary: str) -> None:
    """Killed as the first payment arrives (not made) or once it is made (its answer
    lost): the request carried an ``Idempotency-Key``, so the resume sends it again
    without asking anyone, and the service's key store makes it exactly once."""
    assert AGENT_KEYED != AGENT
    (tmp_path / "agent.py").write_text(AGENT_KEYED)
    store = tmp_path / "store"
    current = [Run(kill=(boundary, 1))]
    with service(current) as svc:
        go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                        "agent.py", svc.url], tmp_path, _env())
        assert current[0].killed.is_set()
        (call, state, target), = _status(store)
        assert state == "in-doubt" and "key pay-acct-A-1" in target, target
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"], svc.payments
        assert res.stdout.count('"to": "acct-A"') == 1, res.stdout
    rows = _status(store)
    assert [s for _, s, _ in rows] == ["settled"] * 3, rows
    assert rows[1][0].startswith(f"{call}@") and "key pay-acct-A-1" in rows[1][2], rows
