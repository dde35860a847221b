"""Ship to the warm tier (issue "A fleet of hosts", its first part): ``stenograph ship``
copies a store's committed events into a real PostgreSQL 15 cluster (Debian's package,
started here on a free port) and the tables then equal the store.

Real parts throughout: stores written by real recordings and by the store's own writer
(with its fdatasync), the shipper as a real process killed with SIGKILL mid-batch, the
host recorder serving a store while it is shipped (``serve --ship``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm import S3, q

from stenograph.recorder.codec import pack_body
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.testing.effect_service import EffectService
from stenograph.testing.postgres import installed

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
KILLS = int(os.environ.get("STENO_SHIP_KILLS", "6"))
"""Shipper kills mid-batch (``make soak``: 60)."""

pytestmark = pytest.mark.skipif(not installed(), reason="PostgreSQL 15 is not installed")

AGENT = """
import sys, requests
url = sys.argv[1]
for i in range(3):
    print(requests.post(url + "/payments", json={"amount": i, "to": "acct"}).json()["id"])
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _ship(store: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "ship", str(store), "--to", url, *extra], env=_env(),
                          capture_output=True, text=True, timeout=300)


def _table_equals_store(store: Path, url: str) -> int:
    """Every event of the store once in ``steno_events``, with its LSN, kind and the
    hash of its body; nothing else there. Returns the count."""
    want = {(e.traj, e.seq): (e.lsn, e.kind, hashlib.sha256(pack_body(e.body)).hexdigest())
            for e in StoreReader(store).events()}
    rows = q(url, "SELECT trajectory_id, seq, lsn, kind, raw_sha256 FROM steno_events")
    got = {(t, int(s)): (int(lsn), k, h) for t, s, lsn, k, h in rows}
    assert len(rows) == len(got), "a (trajectory, seq) shipped twice"
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    assert not missing and not extra, (missing, extra)
    assert got == want
    return len(want)


def test_a_recorded_store_ships_whole_and_twice_is_once(tmp_path: Path, db: str) -> None:
    """Two recordings of an agent paying through requests: shipped, the events table
    equals the store, the trajectories are ended, the effects view holds each payment
    settled; shipped again, nothing moves."""
    store = tmp_path / "store"
    (tmp_path / "agent.py").write_text(AGENT)
    with EffectService() as svc:
        for t in ("pay-1", "pay-2"):
            rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", t,
                                  "--workspace", "none", "-o", str(tmp_path / f"{t}.steno"),
                                  "--", PY, "agent.py", svc.url], cwd=tmp_path, env=_env(),
                                 capture_output=True, text=True, timeout=120)
            assert rec.returncode == 0, rec.stderr[-2000:]
    first = _ship(store, db, "--once", "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    n = _table_equals_store(store, db)
    assert doc["events"] == n and doc["lag"] == 0 and doc["trajectories"] == ["pay-1", "pay-2"]
    trajs = q(db, "SELECT trajectory_id, state, last_seq FROM steno_trajectories "
                   "ORDER BY 1")
    assert [(t, s) for t, s, _ in trajs] == [("pay-1", "ended"), ("pay-2", "ended")]
    effects = q(db, "SELECT trajectory_id, state, target FROM steno_effects ORDER BY 1, 3")
    assert len(effects) == 6 and {s for _, s, _ in effects} == {"settled"}, effects
    assert all("/payments" in target for _, _, target in effects), effects
    again = _ship(store, db, "--once", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["events"] == 0
    assert _table_equals_store(store, db) == n


def _big_store(path: Path, trajs: int, events: int) -> None:
    """A store written by its own writer (durable appends, real fdatasync): ``trajs``
    trajectories interleaved, ``events`` in all, bodies of every size up to 100 KiB."""
    rng = random.Random(7)
    with Store(path) as s:
        for t in range(trajs):
            s.append(f"t{t}", "RunStarted", {"argv": ["agent", str(t)], "started": 1.7e9 + t},
                     durable=False)
        for i in range(events - trajs):
            t = f"t{rng.randrange(trajs)}"
            size = rng.choice([10, 100, 1000, 70_000])
            s.append(t, "Note", {"i": i, "text": "x" * size, "bin": rng.randbytes(8)},
                     durable=False)
        s.flush()


def test_a_shipper_killed_mid_batch_leaves_no_duplicate_and_no_gap(
        tmp_path: Path, db: str) -> None:
    """``KILLS`` times: a following shipper with small batches, SIGKILLed at a random
    moment (mid-COPY, mid-commit, between batches); then one more pass. The table equals
    the store: no event twice, none missing."""
    store = tmp_path / "store"
    n = 1000 * max(6, KILLS)  # (enough that most kills land while it ships)
    _big_store(store, 5, n)
    rng = random.Random(11)
    killed_at: list[int] = []
    for _ in range(KILLS):
        p = subprocess.Popen([*CLI, "ship", str(store), "--to", db, "--batch", "23",
                              "--every", "0.05"], env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(rng.uniform(0.5, 1.2))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        killed_at.append(int(q(db, "SELECT coalesce(max(lsn), 0) FROM steno_cursors")[0][0]))
    assert killed_at[0] > 0, "the shipper shipped nothing before its first kill"
    mid = [c for c in killed_at if 0 < c < n]
    assert len(mid) >= min(3, KILLS), f"too few kills landed mid-shipment: {killed_at}"
    done = _ship(store, db, "--once", "--json")
    assert done.returncode == 0, done.stderr
    assert _table_equals_store(store, db) == n
    assert int(q(db, "SELECT lsn FROM steno_cursors")[0][0]) == n
    big = q(db, "SELECT count(*) FROM steno_events WHERE raw IS NULL AND raw_bytes > 65536")
    assert int(big[0][0]) > 0  # bodies over the threshold keep their hash, not their bytes


def test_serve_ships_what_it_commits_while_agents_record(tmp_path: Path, db: str) -> None:
    """``serve --ship``: the host recorder ships as its recordings commit; once they have
    ended the table catches up with the store, and only committed events ever left."""
    store = tmp_path / "store"
    with Store(store) as s:
        s.append("seed", "Note", {})
    serve = subprocess.Popen([*CLI, "serve", str(store), "--ship", db], env=_env(),
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (store / "serve.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (tmp_path / "agent.py").write_text(AGENT)
        with EffectService() as svc:
            recs = [subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", f"a{i}",
                                      "--workspace", "none", "-o",
                                      str(tmp_path / f"a{i}.steno"), "--", PY, "agent.py",
                                      svc.url], cwd=tmp_path, env=_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for i in range(4)]
            for r in recs:
                _, err = r.communicate(timeout=180)
                assert r.returncode == 0, err[-2000:]
        deadline = time.monotonic() + 60
        want = sum(1 for _ in StoreReader(store).events())
        while time.monotonic() < deadline:
            if int(q(db, "SELECT count(*) FROM steno_events")[0][0]) >= want:
                break
            time.sleep(0.2)
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=60)
    assert "ship:" not in err, err
    assert _table_equals_store(store, db) == want
    states = dict((t, s) for t, s in q(db, "SELECT trajectory_id, state FROM "
                                            "steno_trajectories"))
    assert all(states[f"a{i}"] == "ended" for i in range(4)), states


def test_bad_input_is_one_line_and_touches_nothing(tmp_path: Path, db: str) -> None:
    store = tmp_path / "store"
    _big_store(store, 1, 10)
    before = sorted((p.name, p.stat().st_size) for p in (store / "wal").iterdir())
    cases = [
        ([*CLI, "ship", str(store)], 2, "no warm tier"),
        ([*CLI, "ship", str(store), "--to", "mysql://x/y"], 2, "postgresql://"),
        ([*CLI, "ship", str(tmp_path / "nothing"), "--to", db], 2, "not"),
        ([*CLI, "ship", str(store), "--to", db, "--json"], 2, "--once"),
        ([*CLI, "ship", str(store), "--to", "postgresql://postgres:hunter2@127.0.0.1:1/x",
          "--once"], 7, "cannot reach"),
        ([*CLI, "ship", str(store), "--to", db, "--blobs", "http://x", "--once"], 2,
         "s3://"),
        ([*CLI, "serve", str(store), "--ship", "mysql://x"], 2, "postgresql://"),
        ([*CLI, "serve", str(store), "--ship", "postgresql://postgres@127.0.0.1:1/x"], 7,
         "cannot reach"),
    ]
    for argv, code, words in cases:
        r = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == code and len(lines) == 1 and words in lines[0], (argv, r.stderr)
        assert "hunter2" not in r.stderr  # a password never printed
    assert sorted((p.name, p.stat().st_size) for p in (store / "wal").iterdir()) == before
    assert not (store / "serve.sock").exists()  # (no host recorder left serving it)


def test_a_trajectory_name_another_run_holds_is_refused(tmp_path: Path, db: str) -> None:
    """Two stores, each with its own run called ``t0``: the second is not mixed into the
    first's rows; ship says so in one line (exit 2) and the first stays whole."""
    a, b = tmp_path / "a", tmp_path / "b"
    _big_store(a, 1, 50)
    with Store(b) as s:
        s.append("t0", "RunStarted", {"argv": ["other"], "started": 1.8e9})
        s.append("t0", "Note", {"other": True})
    assert _ship(a, db, "--once").returncode == 0
    r = _ship(b, db, "--once")
    assert r.returncode == 2 and "another run" in r.stderr, r.stderr
    assert _table_equals_store(a, db) == 50


def test_status_db_shows_every_hosts_trajectories(tmp_path: Path, db: str) -> None:
    """Two stores ("hosts") shipped into one warm tier: ``status --db`` lists both hosts'
    trajectories, the one with a payment in doubt and an approval waiting as
    needs-attention, with the counts; ``--json`` and one TRAJ as one document."""
    a, b = tmp_path / "a", tmp_path / "b"
    with Store(a) as s:
        s.append("done-1", "RunStarted", {"argv": ["x"], "started": 1.7e9})
        s.append("done-1", "ToolIntent", {"call_id": "0/http/1", "target": "POST /pay"})
        s.append("done-1", "ToolResult", {"call_id": "0/http/1", "status": "200"})
        s.append("done-1", "RunEnded", {"status": 0})
    with Store(b) as s:
        s.append("stuck-2", "RunStarted", {"argv": ["y"], "started": 1.7e9 + 5})
        s.append("stuck-2", "ToolIntent", {"call_id": "0/http/3", "target": "POST /pay"})
        s.append("stuck-2", "ApprovalRequested", {"call_id": "0/http/4", "call": "deploy",
                                                  "summary": "deploy web",
                                                  "requested_at": 1.7e9 + 9})
    for st in (a, b):
        assert _ship(st, db, "--once").returncode == 0
    doc = json.loads(subprocess.run([*CLI, "status", "--db", db, "--json"], env=_env(),
                                    capture_output=True, text=True, check=True).stdout)
    got = {t["traj"]: (t["state"], t["effects"], t["in_doubt"], t["approvals_waiting"])
           for t in doc["trajectories"]}
    assert got == {"done-1": ("ended", 1, 0, 0), "stuck-2": ("needs-attention", 1, 1, 1)}
    one = json.loads(subprocess.run([*CLI, "status", "--db", db, "stuck-2", "--json"],
                                    env=_env(), capture_output=True, text=True,
                                    check=True).stdout)
    assert one["traj"] == "stuck-2" and one["shipped_ago"] is not None
    text = subprocess.run([*CLI, "status", "--db", db], env=_env(), capture_output=True,
                          text=True, check=True).stdout
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:] if ln.strip()}
    assert "needs-attention" in lines["stuck-2"] and "ended" in lines["done-1"], text
    bad = subprocess.run([*CLI, "status", "--db", "mysql://x"], env=_env(),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_blobs_and_snapshots_ship_to_the_object_store(tmp_path: Path, db: str, s3: S3) -> None:
    """``ship --blobs``: every blob an event names and every checkpoint's snapshot (its
    manifests and files) is in the bucket under its hash, and each body too big for its
    row too; shipped again, nothing is written twice. A blob another host already put is
    never overwritten (If-None-Match)."""
    store = tmp_path / "store"
    work = tmp_path / "work"
    work.mkdir()
    (work / "agent.py").write_text(AGENT)
    (work / "notes.txt").write_text("workspace file\n" * 100)
    with EffectService() as svc:
        rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "ws",
                              "-o", str(tmp_path / "ws.steno"), "--", PY, "agent.py",
                              svc.url], cwd=work, env=_env(), capture_output=True, text=True,
                             timeout=120)
        assert rec.returncode == 0, rec.stderr[-2000:]
    from stenograph.recorder.hostclient import RemoteStore

    with RemoteStore(store, traj="big") as rs:  # (its host recorder still serves it)
        rs.append("big", "RunStarted", {"argv": ["x"], "started": 1.7e9})
        rs.append("big", "Note", {"text": "y" * 100_000})
    url = f"s3://{s3.bucket}/fleet"
    env = {**_env(), **s3.env()}
    first = subprocess.run([*CLI, "ship", str(store), "--to", db, "--blobs", url, "--once",
                            "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["blobs"] > 0 and doc["missing_blobs"] == 0, doc
    _table_equals_store(store, db)
    from stenograph.recorder.blobs import BlobStore
    from stenograph.recorder.gc import needed
    from stenograph.warm.objects import ObjectStore

    objects = ObjectStore(url, client=s3.client())
    walked: set[str] = set()
    want: set[str] = set()
    snapshots = 0
    for ev in StoreReader(store).events():
        want |= needed(BlobStore(store / "blobs"), ev, walked)
        snapshots += ev.kind == "Checkpoint" and "snapshot" in ev.body
    assert snapshots >= 2 and want, (snapshots, len(want))
    for sha in want:  # each one there, and what its name says
        assert objects.get(sha) == BlobStore(store / "blobs").get(sha)
    (big,) = q(db, "SELECT raw_sha256 FROM steno_events WHERE raw IS NULL")
    assert len(objects.get(big[0])) > 100_000
    again = subprocess.run([*CLI, "ship", str(store), "--to", db, "--blobs", url, "--once",
                            "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout)["blobs"] == 0, again.stdout
    sha = sorted(want)[0]
    key = objects.where.key(sha)
    with pytest.raises(Exception, match=r"PreconditionFailed|412"):  # another host's write
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"not it",  # type: ignore
                               IfNoneMatch="*")
    assert objects.get(sha) == BlobStore(store / "blobs").get(sha)
