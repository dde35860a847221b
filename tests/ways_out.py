"""Crash trials through every way an agent's payment leaves the host (issue "Resume
through other programs", item 5), shared by ``test_ways_out.py`` (a few in ``make
test``) and ``make soak`` (``STENO_WAYS_TRIALS``).

The agent is the payments agent (``programs/payments_agent.py``, the official ``openai``
SDK) whose ``pay`` tool is made one way: ``requests`` (hooked), ``curl``, ``urllib``, a
``node`` fetch child, the static Go tool ``paygo``, ``psql`` into a real PostgreSQL --
or the agent written in Node on the ``openai`` npm SDK (``node-agent``). Four payments
(one with the program's own idempotency key) and a provisioning (a declared tool with a
probe; a plain fetch in the Node agent). The whole recorded tree is killed with SIGKILL
up to three times in a row, at a random moment or at a boundary the service sees (a
payment arriving, made, answered); then the test is the person: it reads ``status``,
checks it against the service's own ledger, settles each effect in doubt by what the
ledger says -- with the answer (``--result``), with the command's output
(``--output``), with nothing, or leaves it to the policy's probe -- and resumes, until
the run ends. The service counts every payment: each exactly once, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crashes import Run, go, service

from stenograph.testing.effect_service import EffectService
from stenograph.testing.model_server import ModelServer

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
PROGRAMS = Path(__file__).parent / "programs"
AGENT = PROGRAMS / "payments_agent.py"
NODE_AGENT = PROGRAMS / "payments_agent.cjs"
PAYS: list[tuple[int, str]] = [(101, "acct-A"), (202, "acct-B"), (303, "acct-C"),
                               (404, "acct-K")]
WAYS = ["requests", "curl", "urllib", "node", "go", "psql", "node-agent"]
SETTLE = ["result", "output", "none", "probe"]
"""How the person (or the policy's probe) settles a payment found made."""


def _script() -> list[dict[str, Any]]:
    calls: list[tuple[str, dict[str, str]]] = [
        ("pay", {"amount": str(a), "to": t}) for a, t in PAYS]
    calls.insert(2, ("provision", {"name": "web1"}))
    turns = [calls[i:i + 2] for i in range(0, len(calls), 2)]
    out: list[dict[str, Any]] = [
        {"text": f"step {i}", "tool_calls": [{"name": n, "arguments": a} for n, a in c]}
        for i, c in enumerate(turns)]
    return [*out, {"text": "all settled"}]


def go_tool() -> Path:
    """The static Go tool, built once (``CGO_ENABLED=0``) under the venv."""
    target = Path(sys.prefix) / "paygo" / "pay"
    if target.exists():
        return target
    if not shutil.which("go"):
        pytest.skip("go is not installed (Debian's golang-go)")
    tmp = target.with_name(f"pay.tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(tmp), str(PROGRAMS / "paygo" / "pay.go")],
                   check=True, capture_output=True, timeout=600,
                   env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod",
                        "GOCACHE": str(target.parent / "cache"), "GO111MODULE": "off"})
    tmp.rename(target)
    return target


@dataclass
class World:
    """The services a trial's payments reach, and what they say happened."""

    svc: EffectService
    pg: tuple[str, int] | None = None

    def made(self) -> Counter[tuple[int, str]]:
        if self.pg is None:
            return Counter((int(p["amount"]), str(p["to"])) for p in self.svc.payments)
        out = _psql(self.pg, "SELECT amount, dest FROM payments")
        return Counter((int(a), d) for a, d in (ln.split("|") for ln in out.splitlines()))

    def record(self, amount: int, to: str) -> dict[str, Any]:
        """What the ledger holds for a payment (the answer a person gives the agent)."""
        if self.pg is None:
            return next(p for p in self.svc.payments if p["to"] == to)
        return {"id": _psql(self.pg, f"SELECT id FROM payments WHERE dest = '{to}'"),
                "to": to}

    def output(self, way: str, amount: int, to: str) -> str:
        """What the tool that paid prints for it (a person's ``--output``)."""
        rec = self.record(amount, to)
        return f"{rec['id']}\nINSERT 0 1\n" if way == "psql" else json.dumps(rec) + "\n"


def _psql(pg: tuple[str, int], sql: str) -> str:
    return subprocess.run(["psql", "-X", "-At", "-h", pg[0], "-p", str(pg[1]), "-U",
                           "postgres", "-c", sql], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _idle(pg: tuple[str, int]) -> None:
    """A careful person waits until no statement of the killed run still runs."""
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' AND "
           "backend_type = 'client backend' AND pid <> pg_backend_pid()")
    for _ in range(400):
        if _psql(pg, sql) == "0":
            return
        time.sleep(0.05)


PAYEE = re.compile(r"acct-[A-Z]")
AMOUNT = re.compile(r"\b(101|202|303|404)\b")


def payment_of(effect: dict[str, Any]) -> tuple[int, str] | None:
    """Which payment an effect in doubt is, from what it did (its request's body, its
    command line) -- as a person reads it off ``status --json``."""
    text = json.dumps(effect.get("did") or {}) + " " + str(effect.get("target"))
    payee, amount = PAYEE.search(text), AMOUNT.search(text)
    return (int(amount.group(1)), payee.group(0)) if payee and amount else None


PROBE = r"""
import json, os, re, subprocess, sys, urllib.request
text = " ".join(os.environ.get(k, "") for k in
                ("STENO_PROBE_ARGUMENTS", "STENO_PROBE_BY", "STENO_PROBE_TARGET"))
to, amount = re.search(r"acct-[A-Z]", text), re.search(r"\b(101|202|303|404)\b", text)
if "/servers" in text or "web1" in text:
    found = json.load(urllib.request.urlopen(sys.argv[1] + "/servers?name=web1"))["servers"]
elif not (to and amount):
    sys.exit(2)  # cannot tell: a person
elif len(sys.argv) > 2:  # PostgreSQL
    host, port = sys.argv[2].split(":")
    ids = subprocess.run(["psql", "-X", "-At", "-h", host, "-p", port, "-U", "postgres", "-c",
                          f"SELECT id FROM payments WHERE dest = '{to.group(0)}'"],
                         capture_output=True, text=True).stdout.split()
    if ids:
        print(f"{ids[0]}\nINSERT 0 1")
    sys.exit(0 if ids else 1)
else:
    found = json.load(urllib.request.urlopen(
        f"{sys.argv[1]}/payments?to={to.group(0)}&amount={amount.group(1)}"))["payments"]
if found:
    print(json.dumps(found[0]))
sys.exit(0 if found else 1)
"""


@dataclass
class Trial:
    way: str
    kills: list[tuple[Any, ...] | None]
    settle: str
    runs: int = 0
    settled: list[str] = field(default_factory=list)


def _kill(rnd: random.Random, way: str, took: float, first: bool) -> tuple[Any, ...]:
    kinds = ["timer"] if way == "psql" or not first else ["timer", "dispatch", "applied",
                                                          "answered"]
    kind = rnd.choice(kinds)
    if kind == "timer":
        return ("timer", rnd.uniform(0.05, 1.0) * took)
    n = rnd.randint(1, len(PAYS))
    return (kind, n, rnd.uniform(0.0, 0.05)) if kind == "answered" else (kind, n)


def plan_trials(way: str, n: int, seed: int, took: float) -> list[Trial]:
    rnd = random.Random(f"{way}-{seed}")
    out = []
    for i in range(n):
        crashes = rnd.choice([1, 1, 2, 3])
        kills: list[tuple[Any, ...] | None] = [_kill(rnd, way, took, j == 0)
                                              for j in range(crashes)]
        out.append(Trial(way, kills, SETTLE[(i + WAYS.index(way)) % len(SETTLE)]))
    return out


@contextlib.contextmanager
def world(way: str, current: list[Run]) -> Iterator[World]:
    with service(current) as svc:
        if way != "psql":
            yield World(svc)
            return
        from pg_cluster import postgres
        with postgres() as (host, port, _):
            yield World(svc, (host, port))


def argv_env(way: str, w: World, model: ModelServer) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env["OPENAI_BASE_URL"] = model.openai_base_url
    if way == "node-agent":
        from pip_target import npm_installed

        env["NODE_PATH"] = str(npm_installed("npm-openai", "openai") / "node_modules")
        return ["node", str(NODE_AGENT), w.svc.url], env
    env["PAY_VIA"] = way
    if way == "go":
        env["PAY_GO"] = str(go_tool())
    if w.pg is not None:
        env["PAY_PG"] = f"{w.pg[0]}:{w.pg[1]}"
    return [PY, str(AGENT), w.svc.url], env


def _status(store: Path, env: dict[str, str]) -> dict[str, Any] | None:
    p = subprocess.run([*CLI, "status", "--json", str(store), "t"], capture_output=True,
                       text=True, env=env, timeout=60)
    if p.returncode != 0:
        return None
    return dict(json.loads(p.stdout))


def _agrees(state: dict[str, Any], w: World) -> None:
    """Before every resume: every payment the ledger holds is listed (settled or in
    doubt), and nothing is settled-as-made that the ledger lacks."""
    made = w.made()
    listed: Counter[tuple[int, str]] = Counter()
    for e in state["effects"]:
        pay = payment_of(e)
        if pay is None:
            continue
        listed[pay] += 1
        made_it = made.get(pay, 0) > 0
        if e["state"] == "settled" and not e.get("decision") and "@" not in e["call_id"]:
            assert made_it or e["target"].startswith("connect "), (
                f"status says {e['call_id']} ({pay}) was answered; the ledger has no such "
                f"payment", state["effects"])
    missing = [p for p in made if not listed.get(p)]
    assert not missing, f"the ledger holds payments status does not list: {missing}"


def _settle_all(trial: Trial, store: Path, state: dict[str, Any], w: World,
                env: dict[str, str], tmp: Path) -> None:
    """The person: each effect in doubt settled by what the ledger says."""
    made = w.made()
    for e in state["effects"]:
        if e["state"] != "in-doubt":
            continue
        call = e["call_id"]
        pay = payment_of(e)
        if pay is None:  # the provisioning (a fetch in the Node agent)
            done = bool(w.svc.servers)
            given = (["--result", _file(tmp, w.svc.servers[0])] if done
                     and trial.settle in ("result", "output") else [])
        else:
            if w.pg is not None:
                _idle(w.pg)
                made = w.made()
            done = made.get(pay, 0) > 0
            given = _given(trial, e, w, pay, tmp) if done else []
        how = ["--as", "done" if done else "not-done", *given]
        p = subprocess.run([*CLI, "settle", str(store), "t", call, *how, "--by", "test"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, (call, how, p.stderr)
        trial.settled.append(f"{call} {' '.join(how[1:2] + how[2:3])}")


def _given(trial: Trial, e: dict[str, Any], w: World, pay: tuple[int, str],
           tmp: Path) -> list[str]:
    if trial.settle == "none":
        return []
    by_command = e["call_id"].split("/")[0] != "0" or e["call_id"].split("/")[1] == "exec"
    own = trial.way in ("requests", "urllib", "node-agent")
    connection = e["call_id"].endswith(".0") or "/exec/" in e["call_id"]
    if (trial.settle == "output" and by_command and not own) or connection:
        path = tmp / f"out-{len(list(tmp.glob('out-*')))}.txt"
        path.write_text(w.output(trial.way, *pay))
        return ["--output", str(path)]
    return ["--result", _file(tmp, w.record(*pay))]


def _file(tmp: Path, doc: Any) -> str:
    path = tmp / f"result-{len(list(tmp.glob('result-*')))}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def run_trial(tmp: Path, trial: Trial) -> Trial:
    """One trial to the end; asserts the ground truth at every step."""
    tmp.mkdir(parents=True, exist_ok=True)
    store = tmp / "store"
    current = [Run(None)]
    with ModelServer(script=_script()) as model, world(trial.way, current) as w:
        argv, env = argv_env(trial.way, w, model)
        policy: list[str] = []
        if trial.settle == "probe":
            (tmp / "probe.py").write_text(PROBE)
            pg = f" {w.pg[0]}:{w.pg[1]}" if w.pg else ""
            (tmp / "policy.toml").write_text(
                "[[probe]]\nmatch = \".\"\n"
                f"command = \"{PY} {tmp / 'probe.py'} {w.svc.url}{pg}\"\n")
            policy = ["--policy", str(tmp / "policy.toml")]
        for i in range(len(trial.kills) + 10):
            run = Run(trial.kills[i] if i < len(trial.kills) else None, resume=i > 0)
            state = _status(store, env) if i else None
            if state is None:  # nothing durable yet: nothing was sent; record (again)
                assert not w.made() and not w.svc.servers, (trial, w.made())
                cmd = [*CLI, "record", "--store", str(store), "--traj", "t", "--workspace",
                       "none", *policy, "--", *argv]
            else:
                if state["state"] == "ended":
                    break
                _agrees(state, w)
                _settle_all(trial, store, state, w, env, tmp)
                cmd = [*CLI, "resume", str(store), "t", *policy]
            current[0] = run
            trial.runs += 1
            done = go(run, cmd, tmp, env)
            if not run.killed.is_set():
                assert done.returncode in (0, 4), (trial, i, done.stderr[-3000:])
                if done.returncode == 0 and i:
                    assert "done: all settled" in done.stdout, (trial, done.stdout[-2000:])
        else:
            raise AssertionError(f"not ended after {trial.runs} runs: {trial}")
        made = w.made()
        assert made == Counter(PAYS), f"{trial}: payments made {made}, intended {PAYS}"
        assert [s["name"] for s in w.svc.servers] == ["web1"], (trial, w.svc.servers)
        assert w.svc.stats()["keys_reused"] == [], trial
        final = _status(store, env)
        assert final is not None and final["state"] == "ended", final
        assert all(e["state"] == "settled" for e in final["effects"]), final["effects"]
    return trial


def whole_run_time(tmp: Path, way: str) -> float:
    """Seconds a whole recording of ``way`` takes here (the range of random kills)."""
    tmp.mkdir(parents=True, exist_ok=True)
    current = [Run(None)]
    with ModelServer(script=_script()) as model, world(way, current) as w:
        argv, env = argv_env(way, w, model)
        began = time.monotonic()
        done = go(current[0], [*CLI, "record", "--store", str(tmp / "whole"), "--traj", "t",
                               "--workspace", "none", "--", *argv], tmp, env)
        assert done.returncode == 0 and "done: all settled" in done.stdout, done.stderr[-2000:]
        return time.monotonic() - began
