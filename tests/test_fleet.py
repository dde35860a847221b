"""A fleet of hosts (issue "A fleet of hosts", its second part): a trajectory's lease is
its row in PostgreSQL, a run crashed on one host resumes on another from the warm tier
and the object store, and the worker it was taken from is fenced.

"Hosts" here are separate stores and process trees on this machine, sharing one real
PostgreSQL 15 cluster (Debian's package, on a free port) and one real S3 server
(SeaweedFS's ``weed mini``); nothing of host A's store is read by host B.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crashes import Run, go, service
from test_approvals import PROGRAM as APPROVAL_PROGRAM
from warm import S3, q

from stenograph.recorder.codec import pack_body
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.resumes import states
from stenograph.testing.effect_service import EffectService
from stenograph.testing.postgres import installed

CLI = [sys.executable, "-m", "stenograph"]
PAYMENTS = 3
PROGRAM = f"""
import requests, sys, time
base = sys.argv[1]
for i in range({PAYMENTS}):
    r = requests.post(base + "/payments", json={{"amount": i, "to": "p"}})
    print("pay", i, r.status_code, r.json()["id"], flush=True)
print("done", time.monotonic() > 0)
"""

pytestmark = pytest.mark.skipif(not installed(), reason="PostgreSQL 15 is not installed")


def _env(**more: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STENO_")}, **more}


def _one_history(store: Path, url: str, traj: str) -> None:
    """The warm tier holds ``traj`` once, event for event what ``store`` holds of it."""
    want = {e.seq: (e.kind, hashlib.sha256(pack_body(e.body)).hexdigest())
            for e in StoreReader(store).events(traj=traj)}
    rows = q(url, f"SELECT seq, kind, raw_sha256 FROM steno_events "
                  f"WHERE trajectory_id = '{traj}' ORDER BY seq")
    got = {int(s): (k, h) for s, k, h in rows}
    assert len(rows) == len(got) and got == want, (sorted(set(got) ^ set(want))[:5])


def _crashed_on_a(run: Run, store: Path, db: str, blobs: str, cwd: Path, url: str,
                  env: dict[str, str], *extra: str) -> None:
    """Host A records ``p.py`` into ``store`` with ``--db --blobs``, killed as ``run``
    says."""
    go(run, [*CLI, "record", "--store", str(store), "--traj", "t", "--db", db, "--blobs",
             blobs, *extra, "-o", str(cwd / "t.steno"), "--", sys.executable, "p.py", url],
       cwd, env)
    assert run.killed.is_set()


def _sidecar(store: Path, db: str, blobs: str | None, env: dict[str, str]) -> None:
    """Host A's sidecar ships what A committed (``serve --ship`` would)."""
    side = subprocess.run([*CLI, "ship", str(store), "--to", db,
                           *(["--blobs", blobs] if blobs else []), "--once"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert side.returncode == 0, side.stderr


def test_a_run_crashed_on_host_a_resumes_on_host_b(tmp_path: Path, db: str, s3: S3) -> None:
    """Host A records with ``--db --blobs`` (its workspace snapshotted) and is killed,
    group and all, with its second payment on the wire (intent durable, not applied).
    Its sidecar ships what A committed. Host B, another store, resumes the trajectory
    from PostgreSQL and the bucket: the lease moves to epoch 1, the payment in doubt is
    reissued with its key, every payment is made once, and the warm tier then holds one
    history, B's."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "p.py").write_text(PROGRAM)
    (work / "notes.txt").write_text("a workspace file\n" * 50)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/move"
    env = _env(**s3.env())
    current = [Run(("dispatch", 2))]
    with service(current) as svc:
        _crashed_on_a(current[0], a_store, db, blobs, work, svc.url, env)
        _sidecar(a_store, db, blobs, env)
        (row,) = q(db, "SELECT epoch, store_id FROM steno_leases WHERE trajectory_id = 't'")
        assert row[0] == "0"
        shutil.rmtree(work)  # host B has no copy of the workspace: the checkpoint's is it
        current[0] = Run(None, resume=True)
        b = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs", blobs],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "done True" in b.stdout
        assert sorted(p["amount"] for p in svc.payments) == list(range(PAYMENTS))
    assert (work / "notes.txt").read_text() == "a workspace file\n" * 50
    (st,) = states(b_store, "t")
    assert st.state == "ended" and st.epoch == 1
    (row,) = q(db, "SELECT epoch, host FROM steno_leases WHERE trajectory_id = 't'")
    assert row[0] == "1"
    _one_history(b_store, db, "t")
    status = subprocess.run([*CLI, "status", "--db", db, "t", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["state"] == "ended" and doc["epoch"] == 1 and doc["lease"]["live"] is False, doc


def test_host_a_paused_past_its_lease_is_fenced_after_host_b_took_over(
        tmp_path: Path, db: str, s3: S3) -> None:
    """Host A (``--lease-ttl 3``) is stopped, group and all, with its second payment on
    the wire; its sidecar ships what it committed. Host B resumes the trajectory from
    the warm tier once A's row has run out, and finishes. A is continued: the service's
    fencing gate refuses its late request, A stops in one line (exit 8), and what A's own
    shipper still had is not shipped over B's history."""
    (tmp_path / "p.py").write_text(PROGRAM)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/fenced"
    env = _env(**s3.env())
    release, stopped = threading.Event(), threading.Event()
    a_proc: list[subprocess.Popen[str]] = []
    with EffectService() as svc:
        posts = [0]

        def on_effect(path: str, headers: dict[str, str]) -> None:
            posts[0] += 1
            if posts[0] == 2:
                os.killpg(a_proc[0].pid, signal.SIGSTOP)
                stopped.set()
                release.wait(60)

        svc.on_effect = on_effect
        a = subprocess.Popen([*CLI, "record", "--store", str(a_store), "--traj", "t",
                              "--workspace", "none", "--lease-ttl", "3", "--db", db,
                              "--blobs", blobs, "-o", str(tmp_path / "t.steno"), "--",
                              sys.executable, str(tmp_path / "p.py"), svc.url], cwd=tmp_path,
                             env=env,
                             start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        a_proc.append(a)
        try:
            assert stopped.wait(60)
            _sidecar(a_store, db, blobs, env)
            held = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs",
                                   blobs], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=60)
            assert held.returncode == 2 and "is held by pid" in held.stderr, held.stderr
            assert not b_store.exists()  # refused before anything was copied
            for _ in range(100):  # A's lease runs out (the database's clock)
                if q(db, "SELECT expires_at < now() FROM steno_leases") == [["t"]]:
                    break
                time.sleep(0.1)
            b = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs",
                                blobs, "--lease-ttl", "5"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
            assert b.returncode == 0, b.stderr[-3000:]
            assert "done True" in b.stdout
        finally:
            release.set()
            os.killpg(a.pid, signal.SIGCONT)
        _out, err = a.communicate(timeout=60)
        assert a.returncode == 8, err
        lines = [ln for ln in err.splitlines() if ln.startswith("stenograph: error")]
        assert len(lines) == 1 and "lease" in lines[0], err
        assert svc.stats()["rejected_stale"] == 1
        assert sorted(p["amount"] for p in svc.payments) == list(range(PAYMENTS))
    late = subprocess.run([*CLI, "ship", str(a_store), "--to", db, "--once", "--json"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert late.returncode == 0, late.stderr
    _one_history(b_store, db, "t")


def test_resume_db_of_a_trajectory_nobody_shipped_is_one_line(tmp_path: Path,
                                                             db: str) -> None:
    store = tmp_path / "b"
    bad = subprocess.run([*CLI, "resume", str(store), "nope", "--db", db], env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "no trajectory 'nope'" in bad.stderr and not store.exists()
    down = subprocess.run([*CLI, "resume", str(store), "nope", "--db",
                           "postgresql://postgres@127.0.0.1:1/x"], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 7 and len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert not store.exists()


APPROVALS = APPROVAL_PROGRAM
"""The approvals test's program (tests/test_approvals.py): asked with ``URL 3600``."""

def _waiting(url: str) -> list[str]:
    return [r[0] for r in q(url, "SELECT call_id FROM steno_approvals WHERE trajectory_id "
                                 "= 't' AND decision IS NULL ORDER BY requested_at")]


def test_a_decision_given_through_the_db_releases_a_run_paused_on_another_host(
        tmp_path: Path, db: str, s3: S3) -> None:
    """Host A's run pauses for an approval (exit 5). A person on a third machine approves
    it with ``approve --db`` (no store there); host B resumes the trajectory, which takes
    the decision into its log, provisions, and pauses at the payment's approval; ``deny
    --db``, and B's next resume ends the run without paying. Wrong calls and second
    decisions are refused in one line."""
    (tmp_path / "p.py").write_text(APPROVALS)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/approvals"
    env = _env(**s3.env())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)

    with EffectService() as svc:
        rec = cli("record", "--store", str(a_store), "--traj", "t", "--workspace", "none",
                  "--db", db, "--blobs", blobs, "-o", str(tmp_path / "t.steno"), "--",
                  sys.executable, "p.py", svc.url, "3600")
        assert rec.returncode == 5, rec.stderr[-2000:]
        (first,) = _waiting(db)
        bad = cli("approve", "--db", db, "t", "0/approval/9", "--by", "ops")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "no approval" in bad.stderr
        ok = cli("approve", "--db", db, "t", first, "--by", "ops", "--note", "go")
        assert ok.returncode == 0, ok.stderr
        again = cli("approve", "--db", db, "t", first, "--by", "ops")
        assert again.returncode == 2 and "already approved" in again.stderr, again.stderr
        nope = cli("settle", "--db", db, "t", "0/net/7", "--as", "done")
        assert nope.returncode == 2 and "no effect" in nope.stderr, nope.stderr

        b = cli("resume", str(b_store), "t", "--db", db, "--blobs", blobs)
        assert b.returncode == 5, b.stderr[-2000:]
        assert "approved by ops go" in b.stdout and "server srv_1" in b.stdout
        (second,) = _waiting(db)
        assert second != first and svc.stats()["servers"] == 1
        no = cli("deny", "--db", db, "t", second, "--by", "cfo", "--note", "over budget")
        assert no.returncode == 0, no.stderr
        end = cli("resume", str(b_store), "t", "--db", db, "--blobs", blobs)
        assert end.returncode == 0, end.stderr[-2000:]
        assert "not paid: tool pay: denied by cfo: over budget" in end.stdout
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 0
    (st,) = states(b_store, "t")
    assert st.state == "ended" and [a.state for a in st.approvals] == ["approved", "denied"]
    assert [a.by for a in st.approvals] == ["ops", "cfo"]
    _one_history(b_store, db, "t")


PROVISION = """
import requests, sys
base = sys.argv[1]
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.status_code, r.json(), flush=True)
"""


@pytest.mark.parametrize("how", ["settle", "deliver"])
def test_an_effect_settled_through_the_db_is_not_made_again_on_another_host(
        tmp_path: Path, db: str, s3: S3, how: str) -> None:
    """Host A is killed after the service made a server and before its answer (a
    request no key makes safe to send again). A person who found the server made says so
    with ``settle --db ... --as done --result`` (or the service's webhook delivers the
    late result: ``deliver --db ... --result``); host B resumes: the program gets that
    answer and no second server is made."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "p.py").write_text(PROVISION)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/settle"
    env = _env(**s3.env())
    current = [Run(("applied", 1))]
    with service(current) as svc:
        _crashed_on_a(current[0], a_store, db, blobs, work, svc.url, env,
                      "--workspace", "none")
        _sidecar(a_store, db, blobs, env)
        (call,) = [r[0] for r in q(db, "SELECT call_id FROM steno_effects WHERE "
                                       "state = 'in-doubt'")]
        (tmp_path / "r.json").write_text(json.dumps({"id": "srv_1", "name": "web1"}))
        word = ["settle", "--db", db, "t", call, "--as", "done"] if how == "settle" else \
            ["deliver", "--db", db, "t", call]
        s = subprocess.run([*CLI, *word, "--result", str(tmp_path / "r.json"), "--by", "ops"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert s.returncode == 0, s.stderr
        current[0] = Run(None, resume=True)
        b = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs", blobs],
                           cwd=work, env=env, capture_output=True, text=True, timeout=180)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "server 200 {'id': 'srv_1', 'name': 'web1'}" in b.stdout
        assert svc.stats()["servers"] == 1
    (row,) = q(db, f"SELECT state, settled_by FROM steno_effects WHERE call_id = '{call}'")
    assert row == ["settled", "Settled" if how == "settle" else "ToolResult"]


def test_a_host_lost_for_good_loses_no_intent(tmp_path: Path, db: str, s3: S3) -> None:
    """Host A is killed with its second payment on the wire and its store is gone with
    it (no sidecar ships anything after). That payment's intent was in PostgreSQL before
    the request left: the warm tier shows it in doubt, host B resumes from there, the
    payment is reissued with its key, and every payment is made once."""
    (tmp_path / "p.py").write_text(PROGRAM)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/lost"
    env = _env(**s3.env())
    current = [Run(("dispatch", 2))]
    with service(current) as svc:
        _crashed_on_a(current[0], a_store, db, blobs, tmp_path, svc.url, env,
                      "--workspace", "none")
        lock = a_store / "serve.lock"  # its host recorder goes with it
        if lock.exists() and lock.read_text().strip().isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(lock.read_text()), signal.SIGKILL)
        shutil.rmtree(a_store)  # the host and its disk, lost for good
        doubt = q(db, "SELECT count(*) FROM steno_effects WHERE trajectory_id = 't' AND "
                      "state = 'in-doubt'")
        assert doubt == [["1"]], doubt
        current[0] = Run(None, resume=True)
        b = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs", blobs],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "done True" in b.stdout
        assert sorted(p["amount"] for p in svc.payments) == list(range(PAYMENTS))
    _one_history(b_store, db, "t")


TURNS = 12
DRAINED = int(os.environ.get("STENO_DRAIN_AGENTS", "4"))
"""Live trajectories drained at once (``make soak``: 8)."""
CHATTY = f"""
import sys, time
from openai import OpenAI
client = OpenAI()
messages = [{{"role": "user", "content": sys.argv[1]}}]
for i in range({TURNS}):
    r = client.chat.completions.create(model="m", messages=messages)
    messages += [{{"role": "assistant", "content": r.choices[0].message.content}},
                 {{"role": "user", "content": f"go on {{i}}"}}]
    print("turn", i, flush=True)
    time.sleep(0.3)
print("done", flush=True)
"""


def test_drain_hands_every_live_run_over_and_resume_any_takes_each_once(
        tmp_path: Path, db: str, s3: S3) -> None:
    """``DRAINED`` agents record on "host A" (one store, ``--db``). ``drain --host`` asks
    them all: each stops at its next model turn, ships, lets its lease go and exits 0.
    ``resume --any`` into another store takes every released trajectory, one worker each,
    and each runs to its end: every trajectory ended, and the model server asked each
    turn exactly once across both hosts."""
    from stenograph.testing.model_server import ModelServer

    (tmp_path / "agent.py").write_text(CHATTY)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/drain"
    host = os.uname().nodename
    with ModelServer() as srv:
        env = _env(**s3.env(), OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-t")
        agents = [subprocess.Popen([*CLI, "record", "--store", str(a_store), "--traj",
                                    f"d{i}", "--workspace", "none", "--db", db, "--blobs",
                                    blobs, "-o", str(tmp_path / f"d{i}.steno"), "--",
                                    sys.executable, "agent.py", f"agent {i}"], cwd=tmp_path,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
                  for i in range(DRAINED)]
        try:
            for _ in range(600):  # every agent has its lease and has talked to the model
                try:
                    live = q(db, "SELECT count(*) FROM steno_leases WHERE expires_at > now()")
                except subprocess.CalledProcessError:  # (no worker has made the tables yet)
                    live = []
                if live == [[str(DRAINED)]] and len(srv.requests) >= 2 * DRAINED:
                    break
                time.sleep(0.1)
            d = subprocess.run([*CLI, "drain", "--db", db, "--host", host, "--wait", "120",
                                "--json"], env=env, capture_output=True, text=True,
                               timeout=180)
            assert d.returncode == 0, d.stderr
            doc = json.loads(d.stdout)
            assert len(doc["asked"]) == DRAINED and doc["held"] == [], doc
            outs = [a.communicate(timeout=120) for a in agents]
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
        for a, (out, err) in zip(agents, outs, strict=True):
            assert a.returncode == 0 and "drained" in err, err[-2000:]
            assert "done" not in out
        res = subprocess.run([*CLI, "resume", str(b_store), "--any", "--db", db, "--blobs",
                              blobs], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"{DRAINED} of {DRAINED} released" in res.stderr, res.stderr
        asked = len(srv.requests_to("/v1/chat/completions"))
    assert asked == DRAINED * TURNS  # no turn asked twice, none skipped
    for i in range(DRAINED):
        (st,) = states(b_store, f"d{i}")
        assert st.state == "ended", (i, st.state)
    again = subprocess.run([*CLI, "resume", str(b_store), "--any", "--db", db], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no released trajectory" in again.stderr, again.stderr


def test_a_worker_that_died_with_its_host_is_taken_over_by_resume_any(
        tmp_path: Path, db: str, s3: S3) -> None:
    """Nothing drains a worker whose host dies: its process group is killed (SIGKILL) in
    the middle of its turns, and its lease (2 s to live) runs out unrenewed. ``resume
    --any`` on host B finds it, brings it from the warm tier and runs it to its end; the
    warm tier then holds one history of it, event for event B's."""
    from stenograph.testing.model_server import ModelServer

    (tmp_path / "agent.py").write_text(CHATTY)
    a_store, b_store = tmp_path / "host-a", tmp_path / "host-b"
    blobs = f"s3://{s3.bucket}/dead"
    with ModelServer() as srv:
        env = _env(**s3.env(), OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-t")
        a = subprocess.Popen([*CLI, "record", "--store", str(a_store), "--traj", "gone",
                              "--workspace", "none", "--db", db, "--blobs", blobs,
                              "--lease-ttl", "2", "-o", str(tmp_path / "gone.steno"), "--",
                              sys.executable, "agent.py", "dead host"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        try:
            for _ in range(600):
                if len(srv.requests_to("/v1/chat/completions")) >= 4:
                    break
                time.sleep(0.05)
        finally:
            os.killpg(a.pid, signal.SIGKILL)
            a.communicate()
        time.sleep(2.5)  # the lease runs out
        res = subprocess.run([*CLI, "resume", str(b_store), "--any", "--db", db, "--blobs",
                              blobs], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "1 of 1 released" in res.stderr, res.stderr
    (st,) = states(b_store, "gone")
    assert st.state == "ended", st.state
    _one_history(b_store, db, "gone")
