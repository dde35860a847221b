"""The workspace on the tape, with real files, real processes and real mount namespaces.

A coding agent on the official openai SDK (examples/coding_agent.py) against the
loopback model server writes, edits and deletes files through Python and through a
shell, and reads them back into its prompts. Recorded with a checkpoint every third
turn, its workspace is then changed and partly deleted: the replay is bit-identical and
leaves the real workspace exactly as it was. ``checkpoint restore --at N`` for every
turn equals the copy the agent itself made of its tree before that model request.
A recorder killed with SIGKILL while it snapshots leaves no Checkpoint naming a torn
snapshot. Root without CAP_SYS_ADMIN (a container) is sealed in a user namespace, or by
the shim's path mapping where none can be made.
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

import pytest
from trees import tree

from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.snapshots import closure, load_manifest
from stenograph.testing.model_server import ModelServer

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stenograph"]
AGENT = ROOT / "examples" / "coding_agent.py"
SCRIPT = ROOT / "examples" / "coding_script.json"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
    env.update(extra)
    return env


@pytest.fixture()
def recorded_agent(tmp_path: Path) -> tuple[Path, Path, Path]:
    work, copies = tmp_path / "work", tmp_path / "copies"
    copies.mkdir()  # a second workspace root: replay writes its copies into the overlay
    (work / "build").mkdir(parents=True)
    (work / "old.txt").write_text("stale\n")
    (work / "build" / "x.o").write_bytes(b"\x7fELF")
    steno = tmp_path / "agent.steno"
    with ModelServer(script=SCRIPT) as srv:
        rec = subprocess.run(
            [*CLI, "record", "--checkpoint-every", "3", "--workspace", str(work),
             "--workspace", str(copies), "-o", str(steno), "--",
             sys.executable, str(AGENT), "--copies", str(copies)],
            cwd=work, env=_env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-w"),
            capture_output=True, timeout=120)
    assert rec.returncode == 0, rec.stderr.decode()[-3000:]
    assert b"files now: ['empty', 'main.py', 'notes.md', 'src']" in rec.stdout
    assert b"checkpoint(s)" in rec.stderr
    return work, copies, steno


@pytest.mark.parametrize("seal", ["mount-namespace", "path-map"])
def test_replay_sees_the_recorded_files_and_writes_none(
        recorded_agent: tuple[Path, Path, Path], tmp_path: Path, seal: str) -> None:
    """Sealed by root's mount namespace, and by the shim's path mapping (what a user gets
    where no user namespace can be made; ``STENOGRAPH_SEAL`` asks for it here)."""
    work, _copies, steno = recorded_agent
    shutil.rmtree(work / "src")
    (work / "notes.md").write_text("edited by hand since\n")
    (work / "unrelated.txt").write_text("new\n")
    before = tree(work)
    rec_out = subprocess.run([*CLI, "log", "cat", str(steno)], capture_output=True).stdout
    assert b"Checkpoint" in rec_out
    env = _env(**({"STENOGRAPH_SEAL": seal} if seal == "path-map" else {}))
    p = subprocess.run([*CLI, "replay", "--json", "--keep-writes", str(tmp_path / "writes"),
                        str(steno)], cwd=work, env=env, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    report = json.loads(p.stdout.decode().splitlines()[-1])
    assert report["sealed"] == seal and all(report["identical"].values()), report
    assert tree(work) == before  # not one byte, mode or time of the real files changed
    assert sorted(os.listdir(_copies)) == [str(n) for n in range(1, 9)]  # as recorded
    upper = tmp_path / "writes" / "0-work"
    assert (upper / "notes.md").read_text().startswith("# Notes")  # what the replay wrote
    assert not any((tmp_path / "writes").glob(".work-*"))
    assert not (upper / "old.txt").exists() or (upper / "old.txt").is_char_device()


def test_a_build_replay_of_the_agents_shell_tool_matches(
        recorded_agent: tuple[Path, Path, Path]) -> None:
    """Its ``run`` tool is ``subprocess.run(..., timeout=60)``: a loop of WNOHANG waits,
    more or fewer of them in a build replay. A wait served a record of another pid (a
    poll's record names none; the spawn may have run live) handed the program a pid not
    its child's: AssertionError in ``Popen._wait``, sent to the model as the tool's
    result (seen in 3 of 3 build replays of one recording, not reproduced on demand)."""
    work, copies, steno = recorded_agent
    for d in (work, copies):  # fresh checkouts: the run's own .py files are not code here
        shutil.rmtree(d)
    copies.mkdir()
    (work / "build").mkdir(parents=True)
    (work / "old.txt").write_text("stale\n")
    (work / "build" / "x.o").write_bytes(b"\x7fELF")
    p = subprocess.run([*CLI, "replay", "--build", "--json", str(steno)], cwd=work,
                       env=_env(), capture_output=True, timeout=120)
    report = json.loads(p.stdout.decode().splitlines()[-1])
    assert p.returncode == 0 and report["divergences"] == [], (report["divergences"], p.stderr)
    assert b"AssertionError" not in p.stdout


def test_restore_at_every_turn_equals_the_agents_own_copies(
        recorded_agent: tuple[Path, Path, Path], tmp_path: Path) -> None:
    work, copies, steno = recorded_agent
    ls = subprocess.run([*CLI, "checkpoint", "ls", "--json", str(steno)], capture_output=True,
                        text=True, check=True)
    doc = json.loads(ls.stdout)
    rows = doc["checkpoints"]
    assert doc["turns"] == 8
    assert [r["at"] for r in rows] == ["start", "turn", "turn", "end"]
    assert [r["turn"] for r in rows[1:3]] == [3, 6]
    shutil.rmtree(work)  # restoring needs nothing but the file
    turns = sorted(int(p.name) for p in copies.iterdir())
    assert turns == list(range(1, 9))
    for n in turns:
        out = tmp_path / f"at{n}"
        p = subprocess.run([*CLI, "checkpoint", "restore", str(steno), "--at", str(n), "-o",
                            str(out)], capture_output=True, text=True, env=_env(), timeout=120)
        assert p.returncode == 0, (n, p.stderr)
        got_root = out / "0-work"
        want, got = tree(copies / str(n)), tree(got_root)
        assert tree(copies / str(n), times=False) == tree(got_root, times=False), n
        assert sorted(os.listdir(out / "1-copies")) == [str(i) for i in range(1, n + 1)]
        if n in (3, 6):
            assert "(checkpoint" in p.stderr
            assert got == want, n
        else:  # the mtimes too: the recording noted them at every turn
            assert "sealed replay stopped at model request" in p.stderr
            assert "mtimes as recorded at that turn" in p.stderr, p.stderr
            assert "the replay's mtime" not in p.stderr, p.stderr
            assert got == want, (n, {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
                                     if want.get(k) != got.get(k)})
    start = tmp_path / "start"
    subprocess.run([*CLI, "checkpoint", "restore", str(steno), "--at", "start", "-o",
                    str(start)], check=True, capture_output=True)
    assert sorted(tree(start / "0-work")) == [".", "build", "build/x.o", "old.txt"]
    assert os.listdir(start / "1-copies") == []
    bad = subprocess.run([*CLI, "checkpoint", "restore", str(steno), "--at", "99", "-o",
                          str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "made 8 model request(s)" in bad.stderr
    assert not (tmp_path / "nope").exists()


def test_root_without_cap_sys_admin_is_sealed_all_the_same(tmp_path: Path) -> None:
    """Root in a container: no CAP_SYS_ADMIN (Docker's default), so no mount namespace of
    its own; the replay is sealed in a user namespace instead, and where none can be made
    either (``programs/nouserns.c``: Docker's default seccomp profile) by path mapping.
    Each replay is bit-identical and leaves the workspace as it was."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "kept.txt").write_text("recorded\n")
    steno = tmp_path / "r.steno"
    subprocess.run([*CLI, "record", "-o", str(steno), "--", "/bin/sh", "-c",
                    "ls; cat kept.txt; date > made.txt; rm kept.txt"],
                   cwd=work, env=_env(), check=True, capture_output=True)
    (work / "kept.txt").write_text("changed since\n")
    (work / "made.txt").unlink()
    before = tree(work)
    nouserns = tmp_path / "nouserns"
    subprocess.run(["gcc", "-O2", "-o", str(nouserns),
                    str(ROOT / "tests" / "programs" / "nouserns.c")], check=True)
    drop = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]
    for wrap, kind in ((drop, "user-namespace"), ([str(nouserns), *drop], "path-map")):
        p = subprocess.run([*wrap, *CLI, "replay", "--json", str(steno)], cwd=work,
                           env=_env(), capture_output=True, text=True)
        if "setpriv:" in p.stderr:
            pytest.skip(f"setpriv cannot drop CAP_SYS_ADMIN here: {p.stderr.strip()}")
        assert p.returncode == 0, p.stderr
        report = json.loads(p.stdout.splitlines()[-1])
        assert report["sealed"] == kind and all(report["identical"].values()), report
        assert tree(work) == before


@pytest.mark.parametrize("seal", ["mount-namespace", "path-map"])
def test_replay_keeps_its_tape_inside_the_workspace(tmp_path: Path, seal: str) -> None:
    """``--keep-tape DIR`` with DIR in the recorded workspace: the tape is prepared
    elsewhere (an overlay of the workspace cannot hold its own lower layers: ELOOP) and
    moved into DIR after the run, which was sealed and bit-identical and never saw DIR; a
    replay that fails to run leaves no DIR, and an empty one as it was."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "kept.txt").write_text("recorded\n")
    steno = tmp_path / "r.steno"
    subprocess.run([*CLI, "record", "-o", str(steno), "--", "/bin/sh", "-c",
                    "ls -a; cat kept.txt; date > made.txt"],
                   cwd=work, env=_env(), check=True, capture_output=True)
    (work / "made.txt").unlink()
    (work / "empty").mkdir()
    before = tree(work, dir_times=False)
    env = _env(**({"STENOGRAPH_SEAL": seal} if seal == "path-map" else {}))
    for dest in (work / "tape", work / "empty"):
        p = subprocess.run([*CLI, "replay", "--json", "--keep-tape", str(dest), str(steno)],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        report = json.loads(p.stdout.splitlines()[-1])
        assert report["sealed"] == seal and all(report["identical"].values()), report
        assert (dest / "0").is_dir() and (dest / "key-shapes.json").is_file()
        assert not any(dest.parent.glob("steno-tape-*"))
        shutil.rmtree(dest)
    (work / "empty").mkdir()
    assert tree(work, dir_times=False) == before  # (the files' times too)
    before = tree(work)
    for dest in (work / "tape", work / "empty"):
        p = subprocess.run([*CLI, "replay", "--keep-tape", str(dest), str(steno), "--",
                            str(work / "no-such-program")], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert tree(work) == before


def _files_under(d: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(d))


def test_a_recorder_killed_while_it_snapshots_names_no_torn_snapshot(tmp_path: Path) -> None:
    rng = random.Random(5)
    work = tmp_path / "big"
    work.mkdir()
    for d in range(20):
        (work / f"d{d}").mkdir()
        for f in range(100):
            (work / f"d{d}" / f"f{f}").write_bytes(rng.randbytes(8192))
    prog = "import os, time\nfor i in range(30):\n    os.listdir('.')\n    time.sleep(0.01)\n"
    torn_seen = 0
    for trial in range(4):
        store = tmp_path / f"store{trial}"
        rec = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t", "-o",
                                str(tmp_path / f"out{trial}.steno"), "--", sys.executable,
                                "-c", prog], cwd=work, env=_env(), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The kill waits for the snapshot's own progress, not for a guessed delay: a
        # guessed one landed before the store existed whenever the host was busy (CI).
        target = rng.randint(1, 1900)
        deadline = time.monotonic() + 60
        while rec.poll() is None and time.monotonic() < deadline \
                and _files_under(store / "blobs") < target:
            time.sleep(0.002)
        os.killpg(rec.pid, signal.SIGKILL)
        rec.wait()
        assert (store / "STENOGRAPH-STORE").exists(), "the store is made before any blob"
        blobs = BlobStore(store / "blobs")
        cps = [ev for ev in StoreReader(store).events(traj="t") if ev.kind == "Checkpoint"]
        for ev in cps:  # every checkpoint named is whole, and restores
            ref = BlobRef.from_body(ev.body["snapshot"])
            assert all(blobs.has(r.sha256) for r in closure(blobs, ref))
            m = load_manifest(blobs, ref)
            assert m.files() == 2000
        torn_seen += not cps and _files_under(store / "blobs") > 0
    assert torn_seen >= 1, "no kill landed inside a snapshot"


def test_a_coding_agent_crashed_mid_run_resumes_into_its_real_workspace(
        tmp_path: Path) -> None:
    """Killed (the whole group) as its fourth model call arrives, the agent is resumed:
    its workspace is put back to the start, the prefix redoes its edits and shell
    commands, the rest is made live -- and the directory ends as an uncrashed run leaves
    it (bytes, modes, links). The workspace lies under /tmp, which the resume seals:
    the workspace itself must stay the real one."""
    from crashes import kill_at_request

    from stenograph.testing.model_server import Knobs

    def start(d: Path) -> Path:
        w = d / "work"
        (w / "build").mkdir(parents=True)
        (w / "old.txt").write_text("stale\n")
        (w / "build" / "x.o").write_bytes(b"\x7fELF")
        return w

    ref = start(tmp_path / "ref")
    with ModelServer(script=SCRIPT) as srv:
        env = _env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-w")
        r = subprocess.run([*CLI, "record", "--workspace", str(ref), "-o",
                            str(tmp_path / "ref.steno"), "--", sys.executable, str(AGENT)],
                           cwd=ref, env=env, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
    work = start(tmp_path / "crash")
    store = tmp_path / "crash" / "s"
    with ModelServer(script=SCRIPT, knobs=Knobs(delay_ms=200)) as srv:
        env = _env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-w")
        p = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t",
                              "--workspace", str(work), "-o", str(tmp_path / "c.steno"), "--",
                              sys.executable, str(AGENT)], cwd=work, env=env,
                             start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        kill_at_request(p, srv, 4)
        p.communicate(timeout=120)
        assert p.returncode == -9
        crashed_at = len(srv.requests)
        assert tree(work, times=False) != tree(ref, times=False)  # left half done
        res = subprocess.run([*CLI, "resume", str(store), "t"], cwd=work, env=env,
                             capture_output=True, timeout=120)
        assert res.returncode == 0, res.stderr.decode()[-3000:]
        # the first three replayed; the fourth (the crashed one) and the rest made live
        assert len(srv.requests) - crashed_at == 8 - 4 + 1
    assert tree(work, times=False) == tree(ref, times=False)
