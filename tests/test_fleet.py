"""A fleet of hosts (issue "A fleet of hosts", its second part): a trajectory's lease is
its row in PostgreSQL, a run crashed on one host resumes on another from the warm tier
and the object store, and the worker it was taken from is fenced.

"Hosts" here are separate stores and process trees on this machine, sharing one real
PostgreSQL 15 cluster (Debian's package, on a free port) and one real S3 server
(SeaweedFS's ``weed mini``); nothing of host A's store is read by host B.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crashes import Run, go, service
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
        go(current[0], [*CLI, "record", "--store", str(a_store), "--traj", "t", "--db", db,
                        "--blobs", blobs, "-o", str(tmp_path / "t.steno"), "--",
                        sys.executable, "p.py", svc.url], work, env)
        assert current[0].killed.is_set()
        side = subprocess.run([*CLI, "ship", str(a_store), "--to", db, "--blobs", blobs,
                               "--once"], env=env, capture_output=True, text=True, timeout=120)
        assert side.returncode == 0, side.stderr
        (row,) = q(db, "SELECT epoch, store_id FROM steno_leases WHERE trajectory_id = 't'")
        assert row[0] == "0"
        current[0] = Run(None, resume=True)
        b = subprocess.run([*CLI, "resume", str(b_store), "t", "--db", db, "--blobs", blobs],
                           cwd=work, env=env, capture_output=True, text=True, timeout=180)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "done True" in b.stdout
        assert sorted(p["amount"] for p in svc.payments) == list(range(PAYMENTS))
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
            side = subprocess.run([*CLI, "ship", str(a_store), "--to", db, "--blobs", blobs,
                                   "--once"], env=env, capture_output=True, text=True,
                                  timeout=120)
            assert side.returncode == 0, side.stderr
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
