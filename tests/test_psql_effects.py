"""A connection that does not speak HTTP is an effect by its destination (issue "Intent
before effect at every way out", 1a): ``psql`` into a real PostgreSQL. Each connection
gets a durable ``ToolIntent`` (``connect tcp HOST:PORT``, by the command that made it)
before its first byte leaves and a ``ToolResult`` when it is closed. Killed at a random
moment, the run is resumed until it ends, the test acting as the person who settles each
connection in doubt by asking the database; every payment is then in the table exactly
once, by the database's own count. ``[connections] read_only`` names destinations that
are not effects. Real processes killed as a group with SIGKILL; nothing mocked.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crashes import Run, go, started
from pg_cluster import postgres

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
TRIALS = int(os.environ.get("STENO_PSQL_CRASH_TRIALS", "2"))
"""Crash-anywhere trials (``make soak``: 30)."""

pytestmark = [pytest.mark.skipif(not shutil.which("psql"), reason="psql is not installed")]

AGENT = """
import subprocess, sys
host, port = sys.argv[1], sys.argv[2]

def psql(sql):
    out = subprocess.run(["psql", "-X", "-At", "-h", host, "-p", port, "-U", "postgres",
                          "-c", sql], capture_output=True, text=True)
    return (out.stdout.strip() or out.stderr.strip()[:60]) + f" ({out.returncode})"

def pay(to):  # (committed with the sleep after it: a kill may land before or after)
    return psql(f"INSERT INTO payments(amount, dest) VALUES (7, '{to}') RETURNING dest; "
                "SELECT pg_sleep(0.15)")

print("paid", pay("acct-A"), flush=True)
print("count", psql("SELECT count(*) FROM payments"), flush=True)
print("paid", pay("acct-B"), flush=True)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _effects(store: Path) -> list[dict[str, object]]:
    out = subprocess.run([*CLI, "status", "--json", str(store), "t"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return list(json.loads(out.splitlines()[0])["effects"])


def _settled_in_database(port: int) -> None:
    """What a careful person does first: wait until no statement of the killed run is
    still running in the server (a killed client's transaction commits when its
    statements end, after the kill)."""
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' AND "
           "backend_type = 'client backend' AND pid <> pg_backend_pid()")
    for _ in range(200):
        out = subprocess.run(["psql", "-X", "-At", "-h", "127.0.0.1", "-p", str(port), "-U",
                              "postgres", "-c", sql], capture_output=True, text=True,
                             check=True, timeout=60)
        if out.stdout.strip() == "0":
            return
        time.sleep(0.05)
    raise AssertionError("a statement of the killed run never ended")


def _paid(port: int) -> list[str]:
    out = subprocess.run(["psql", "-X", "-At", "-h", "127.0.0.1", "-p", str(port), "-U",
                          "postgres", "-c", "SELECT dest FROM payments ORDER BY id"],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


def test_every_psql_connection_is_an_effect_and_a_replay_makes_none(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    store = tmp_path / "store"
    with postgres() as (host, port, _):
        rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "-o",
                              str(tmp_path / "r.steno"), "--", PY, "agent.py", host,
                              str(port)], cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=180)
        assert rec.returncode == 0 and rec.stdout.count("INSERT 0 1") == 2, rec.stderr
        effects = _effects(store)
        assert [(e["target"], e["state"]) for e in effects] == \
            [(f"connect tcp 127.0.0.1:{port}", "settled")] * 3, effects
        assert "INSERT" in str(effects[0]["by"]) and "SELECT" in str(effects[1]["by"])
        rep = subprocess.run([*CLI, "replay", str(tmp_path / "r.steno")], cwd=tmp_path,
                             env=_env(), capture_output=True, text=True, timeout=180)
        assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr
        assert _paid(port) == ["acct-A", "acct-B"]
    # read-only by the policy: no effects (the connections are still on the tape)
    (tmp_path / "policy.toml").write_text('[connections]\nread_only = ["tcp 127.0.0.1:*"]\n')
    with postgres() as (host, port, _):
        rec = subprocess.run([*CLI, "record", "--store", str(tmp_path / "s2"), "--traj", "t",
                              "--policy", "policy.toml", "--", PY, "agent.py", host,
                              str(port)], cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=180)
        assert rec.returncode == 0 and rec.stdout.count("INSERT 0 1") == 2, rec.stderr
        assert _effects(tmp_path / "s2") == []


def test_crash_anywhere_then_resume_until_done_every_payment_exactly_once(
        tmp_path: Path) -> None:
    """Killed at a random moment; then the test is the person: for each connection in
    doubt it reads the command that made it, and asks the database whether that payment
    is there (a read is simply not done); settles; resumes, until the run ends."""
    rnd = random.Random(23)
    (tmp_path / "agent.py").write_text(AGENT)
    with postgres() as (host, port, _):  # how long a whole run takes here
        began = time.monotonic()
        go(Run(kill=None), [*CLI, "record", "--store", str(tmp_path / "whole"), "--traj", "t",
                            "--", PY, "agent.py", host, str(port)], tmp_path, _env())
        took = time.monotonic() - began
    doubted = 0
    for trial in range(TRIALS):
        store = tmp_path / f"store{trial}"
        with postgres() as (host, port, _):
            run = Run(kill=("timer", rnd.uniform(0.3, 0.95) * took))
            go(run, [*CLI, "record", "--store", str(store), "--traj", "t", "--", PY,
                     "agent.py", host, str(port)], tmp_path, _env())
            if not started(store):  # killed before the trajectory's first event
                assert _paid(port) == [], run.kill
                continue
            for _ in range(5):
                _settled_in_database(port)
                made = _paid(port)
                for e in _effects(store):
                    if e["state"] != "in-doubt":
                        continue
                    payee = re.search(r"'(acct-[AB])'", str(e.get("by") or ""))
                    done = payee is not None and payee.group(1) in made
                    subprocess.run([*CLI, "settle", str(store), "t", str(e["call_id"]), "--as",
                                    "done" if done else "not-done"], check=True,
                                   capture_output=True, timeout=60)
                res = go(Run(kill=None, resume=True), [*CLI, "resume", str(store), "t"],
                         tmp_path, _env())
                if res.returncode == 0:
                    break
                assert res.returncode == 4, (run.kill, res.stderr)
            assert res.returncode == 0, (run.kill, res.stderr)
            assert sorted(_paid(port)) == ["acct-A", "acct-B"], (run.kill, _paid(port))
            assert all(e["state"] == "settled" for e in _effects(store)), _effects(store)
            doubted += any("@" in str(e["call_id"]) or e.get("decision")
                           for e in _effects(store))
    assert TRIALS < 3 or doubted, "no trial left a connection in doubt"
