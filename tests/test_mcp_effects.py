"""MCP tools that act are effects (issue "Agents with MCP tool servers", part 4).

A ``tools/call`` of a tool not annotated ``readOnlyHint`` gets a durable ``ToolIntent``
before the request reaches the server, and its result when the answer comes. The server
(``examples/mcp/ledger_server.py``, a child of the recorded tree) wraps a payments service
running outside the tree (``stenograph.testing.effect_service`` on 127.0.0.1): ``pay``
says ``idempotentHint`` (the service honours keys), ``provision`` says nothing (so it is
destructive and not idempotent, and the service has no keys), ``balance`` says
``readOnlyHint``. The run is killed -- the real process group, SIGKILL -- at each
boundary of each acting call, as the service sees it (the request arrived, not applied;
applied, not answered). Then ``resume``: an idempotent call is sent again by itself, a
provision is settled by the policy's probe (or by a person, exit 4 first), and the
service's own counts say each payment and each server was made exactly once. The
resumed trajectory then replays bit for bit with the service gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from crashes import Run, go, service, started

from stenograph.interpose.mcp_client import NO_ANSWER

CLI = [sys.executable, "-m", "stenograph"]
PY = sys.executable
AGENT = Path(__file__).resolve().parent.parent / "examples" / "mcp" / "ledger_agent.py"
EXPECTED = ["balance -> 0 payments, 0 servers",
            'pay -> 201 {"amount": 5, "id": "pay_1", "to": "acct-A"}',
            'provision -> 201 {"id": "srv_1", "name": "web1"}',
            'pay -> 201 {"amount": 7, "id": "pay_2", "to": "acct-B"}',
            "balance -> 2 payments, 1 servers"]
BOUNDARIES = [(kind, n) for n in (1, 2, 3) for kind in ("dispatch", "applied")]
"""Each acting call's request (1: pay, 2: provision, 3: pay), arrived or applied."""
if os.environ.get("STENO_MCP_RUNS", "1x2") == "1x2":  # make test: one of each kind
    BOUNDARIES = [("applied", 1), ("dispatch", 2), ("applied", 2)]
REPLAYED = [b for b in BOUNDARIES if b[1] == 1] if os.environ.get(
    "STENO_MCP_RUNS", "1x2") == "1x2" else BOUNDARIES
"""Where the resumed trajectory is replayed after. A kill inside the provision (the
second call), resumed, then replayed beside another test's load diverged in the
server's stdin worker thread (a pipe read where the recording had the worker wait for
its next job): not yet understood, so ``make test`` replays the first call's cases and
``make soak`` (one test at a time) all of them."""
PROBE = '[[probe]]\nmatch = "^mcp ledger/provision"\ncommand = "{py} {probe} {url}"\n'
FIND = Path(__file__).resolve().parent / "programs" / "find_server.py"
"""The probe: exit 0 if the service has a server called web1, 1 if not."""


def _first_answer(line: str) -> str:
    """A payment sent again under its key is answered with the first answer, marked
    ``replayed`` (200): the same payment."""
    return line.replace(' "replayed": true,', "").replace("pay -> 200 ", "pay -> 201 ")


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env["LEDGER_URL"] = url
    return env


def _status(cwd: Path) -> list[list[str]]:
    out = subprocess.run([*CLI, "status", "store", "t"], cwd=cwd, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return [line.split(None, 2) for line in out.splitlines()[1:]
            if line.strip() and not line.strip().startswith("did:")]


def _replays(cwd: Path, url: str) -> None:
    subprocess.run([*CLI, "log", "export", "store", "t", "-o", "t.steno"], cwd=cwd,
                   check=True, capture_output=True, timeout=60)
    rep = subprocess.run([*CLI, "replay", "t.steno"], cwd=cwd, env=_env(url),
                         capture_output=True, text=True, timeout=180)
    report = "\n".join(ln for ln in rep.stderr.splitlines() if "where:" not in ln)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, report[-3000:]


def test_acting_tools_are_effects_and_a_read_only_tool_is_not(tmp_path: Path) -> None:
    with service([Run(None)]) as svc:
        rec = subprocess.run([*CLI, "record", "--store", "store", "--traj", "t", "--", PY,
                              str(AGENT)], cwd=tmp_path, env=_env(svc.url),
                             capture_output=True, text=True, timeout=180)
        assert rec.returncode == 0 and rec.stdout.splitlines() == EXPECTED, rec.stderr[-2000:]
        mcp = [(r[1], r[2]) for r in _status(tmp_path) if "/mcp/" in r[0]]
        assert mcp == [("settled", "mcp ledger/pay"), ("settled", "mcp ledger/provision"),
                       ("settled", "mcp ledger/pay")], mcp  # balance is read-only
        seen = svc.stats()
    _replays(tmp_path, svc.url)  # the service is gone: the replay never reaches it
    assert seen["payments"] == 2 and seen["servers"] == 1


@pytest.mark.parametrize("kill", BOUNDARIES, ids=[f"{k}-{n}" for k, n in BOUNDARIES])
def test_a_crash_inside_an_acting_call_then_resume_acts_exactly_once(
        tmp_path: Path, kill: tuple[str, int]) -> None:
    runs = [Run(kill)]
    with service(runs) as svc:
        (tmp_path / "policy.toml").write_text(PROBE.format(py=PY, probe=FIND, url=svc.url))
        env = _env(svc.url)
        rec = go(runs[0], [*CLI, "record", "--store", "store", "--traj", "t", "--policy",
                           "policy.toml", "--", PY, str(AGENT)], tmp_path, env)
        assert runs[0].killed.is_set() and started(tmp_path / "store"), rec.stderr[-2000:]
        doubt = [r for r in _status(tmp_path) if r[1] == "in-doubt" and "/mcp/" in r[0]]
        assert len(doubt) == 1, _status(tmp_path)
        runs[0] = Run(None, resume=True)
        res = subprocess.run([*CLI, "resume", "store", "t", "--policy", "policy.toml"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        expected = EXPECTED[:]
        if kill == ("applied", 2):  # the probe found the server: done, its answer lost
            expected[2] = f"provision -> {NO_ANSWER}"
        assert [_first_answer(ln) for ln in res.stdout.splitlines()] == expected, res.stdout
        stats = svc.stats()
        assert (stats["payments"], stats["servers"]) == (2, 1), stats  # exactly once
        assert stats["keys_reused"] == [], stats
        assert all(r[1] == "settled" for r in _status(tmp_path)), _status(tmp_path)
    if kill in REPLAYED:
        _replays(tmp_path, svc.url)


def test_without_a_probe_a_person_settles_a_provision_in_doubt(tmp_path: Path) -> None:
    runs = [Run(("applied", 2))]
    with service(runs) as svc:
        env = _env(svc.url)
        go(runs[0], [*CLI, "record", "--store", "store", "--traj", "t", "--", PY, str(AGENT)],
           tmp_path, env)
        (call, _, target), = [r for r in _status(tmp_path) if r[1] == "in-doubt"
                              and "/mcp/" in r[0]]
        assert target == "mcp ledger/provision"
        runs[0] = Run(None, resume=True)
        stop = subprocess.run([*CLI, "resume", "store", "t"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert stop.returncode == 4 and len(stop.stderr.strip().splitlines()) == 1, stop.stderr
        assert call in stop.stderr and "idempotent" in stop.stderr, stop.stderr
        assert svc.stats()["servers"] == 1  # nothing ran
        subprocess.run([*CLI, "settle", "store", "t", call, "--as", "done"], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
        res = subprocess.run([*CLI, "resume", "store", "t"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        out = res.stdout.splitlines()
        assert out[2] == f"provision -> {NO_ANSWER}", out
        assert out[-1] == "balance -> 2 payments, 1 servers", out
        assert (svc.stats()["payments"], svc.stats()["servers"]) == (2, 1)


def test_a_policy_holds_a_destructive_tool_and_denies_another(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text(
        '[[rule]]\nmatch = "^mcp ledger/provision .*destructive"\naction = "hold"\n'
        'summary = "a new server"\n')
    with service([Run(None)]) as svc:
        env = _env(svc.url)
        rec = subprocess.run([*CLI, "record", "--store", "store", "--traj", "t", "--policy",
                              "policy.toml", "--", PY, str(AGENT)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
        assert rec.returncode == 5, rec.stderr[-2000:]  # paused at provision; pay is not
        assert (svc.stats()["payments"], svc.stats()["servers"]) == (1, 0)
        st = json.loads(subprocess.run([*CLI, "status", "store", "t", "--json"], cwd=tmp_path,
                                       capture_output=True, text=True, check=True,
                                       timeout=60).stdout)
        (held,) = [a for a in st["approvals"] if a["state"] == "pending"]
        assert "mcp ledger/provision" in held["call"], held
        subprocess.run([*CLI, "approve", "store", "t", held["call_id"], "--by", "ops"],
                       cwd=tmp_path, check=True, capture_output=True, timeout=60)
        res = subprocess.run([*CLI, "resume", "store", "t", "--policy", "policy.toml"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
        assert res.returncode == 0 and res.stdout.splitlines() == EXPECTED, res.stderr[-3000:]
        assert (svc.stats()["payments"], svc.stats()["servers"]) == (2, 1)
        (tmp_path / "deny.toml").write_text('[[rule]]\nmatch = "^mcp ledger/provision "\n'
                                            'action = "deny"\n')
        den = subprocess.run([*CLI, "record", "-o", "d.steno", "--policy", "deny.toml", "--",
                              PY, str(AGENT), "v"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
        assert den.returncode == 0, den.stderr[-2000:]
        assert den.stdout.startswith("provision -> stenograph: the run's policy denies")
        assert svc.stats()["servers"] == 1
    rep = subprocess.run([*CLI, "replay", "d.steno"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr[-3000:]
