"""A policy's ``hold`` on a command or on a program's own request (issue "Intent before
effect at every way out", 1c): the run pauses there (exit 5) with the call not made, a
person approves or denies, and ``resume`` makes it once -- or refuses it the way the
program would see a refused exec or connection. The effects are real: ``git push`` to a
``git daemon`` on 127.0.0.1 (the remote's own log is the ground truth), payments by
``curl`` and ``urllib`` to the effect service (its own count).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_net_effects import AGENTS

from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)

PUSHER = """
import subprocess
open("notes.txt", "a").write("fixed the bug\\n")
subprocess.run(["git", "add", "notes.txt"], check=True)
subprocess.run(["git", "commit", "-qm", "fix the bug"], check=True)
print("committed", flush=True)
try:
    r = subprocess.run(["git", "push", "-q", "origin", "main"], capture_output=True, text=True)
    print("push:", r.returncode)
except PermissionError as e:
    print("push refused:", e.errno)
"""
HOLD_PUSH = '[[rule]]\nmatch = "^exec git push"\naction = "hold"\nsummary = "push to main"\n'
HOLD_PAY = '[[rule]]\nmatch = "^POST .*/payments"\naction = "hold"\nsummary = "a payment"\n'


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _cli(*args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=180, check=check)


def _pending(store: Path, cwd: Path) -> list[str]:
    out = _cli("status", str(store), "t", cwd=cwd, check=True).stdout
    return re.findall(r"^\s+(\S+)\s+approval pending", out, re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A working copy whose ``origin`` is a bare repository served by ``git daemon``."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(tmp_path / "remote.git")], check=True)
    port = _free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", f"--base-path={tmp_path}",
                               "--export-all", "--enable=receive-pack", "--listen=127.0.0.1",
                               f"--port={port}", str(tmp_path)], start_new_session=True,
                              stderr=subprocess.DEVNULL)
    work = tmp_path / "work"
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    for args in (["config", "user.email", "a@example.com"], ["config", "user.name", "A"],
                 ["commit", "-q", "--allow-empty", "-m", "one"],
                 ["remote", "add", "origin", f"git://127.0.0.1:{port}/remote.git"]):
        subprocess.run(["git", *args], cwd=work, check=True)
    (work / "agent.py").write_text(PUSHER)
    (work / "policy.toml").write_text(HOLD_PUSH)
    try:
        yield work, tmp_path / "remote.git"
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def _pushed(remote: Path) -> list[str]:
    p = subprocess.run(["git", "log", "--format=%s", "main"], cwd=remote, capture_output=True,
                       text=True)
    return p.stdout.splitlines() if p.returncode == 0 else []


def _paused(work: Path, store: Path) -> subprocess.CompletedProcess[str]:
    """Record the pusher under the hold: the run pauses (exit 5) at its push."""
    rec = _cli("record", "--store", str(store), "--traj", "t", "--policy", "policy.toml",
               "--", PY, "agent.py", cwd=work)
    assert rec.returncode == 5, rec.stderr
    return rec


def test_a_held_push_pauses_the_run_and_is_made_once_when_approved(
        repo: tuple[Path, Path], tmp_path: Path) -> None:
    work, remote = repo
    store = tmp_path / "store"
    rec = _paused(work, store)
    assert rec.stdout == "committed\n" and "waits for approval" in rec.stderr, rec.stderr
    assert len(rec.stderr.strip().splitlines()) == 1, rec.stderr
    assert _pushed(remote) == []
    (call,) = _pending(store, work)
    assert call.endswith("/exec/1"), call
    _cli("approve", str(store), "t", call, "--by", "alice", cwd=work, check=True)
    res = _cli("resume", str(store), "t", "--policy", "policy.toml", cwd=work)
    assert res.returncode == 0 and res.stdout == "committed\npush: 0\n", res.stderr
    assert _pushed(remote) == ["fix the bug", "one"], _pushed(remote)
    status = _cli("status", str(store), "t", cwd=work, check=True).stdout
    assert re.search(rf"{re.escape(call)}\s+settled\s+exec git push -q origin main", status), \
        status
    assert "approved (used)" in status and "ended" in status.splitlines()[0], status
    # the whole run, pause and resume, replays without the remote: nothing pushed again
    steno = tmp_path / "run.steno"
    _cli("log", "export", str(store), "t", "-o", str(steno), cwd=work, check=True)
    rep = _cli("replay", str(steno), cwd=work)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr
    assert rep.stdout == "committed\npush: 0\n"


def test_a_held_push_denied_is_refused_as_a_failed_exec(repo: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    work, remote = repo
    store = tmp_path / "store"
    _paused(work, store)
    (call,) = _pending(store, work)
    _cli("deny", str(store), "t", call, "--by", "bob", cwd=work, check=True)
    res = _cli("resume", str(store), "t", "--policy", "policy.toml", cwd=work)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "committed\npush refused: 13\n", res.stdout  # EACCES
    assert _pushed(remote) == []
    assert _pending(store, work) == []


def test_a_resume_without_a_decision_pauses_again(repo: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    work, remote = repo
    store = tmp_path / "store"
    _paused(work, store)
    again = _cli("resume", str(store), "t", "--policy", "policy.toml", cwd=work)
    assert again.returncode == 5 and "waits for approval" in again.stderr, again.stderr
    assert _pushed(remote) == [] and len(_pending(store, work)) == 1


@pytest.mark.parametrize("tool", ["curl", "urllib"])
def test_held_payments_are_each_made_once_after_approval(tmp_path: Path, tool: str) -> None:
    """Two held payments on a program's own connections: the run pauses at each; each
    approval and resume makes exactly that one payment."""
    if tool == "curl" and not shutil.which("curl"):
        pytest.skip("curl is not installed")
    (tmp_path / "agent.py").write_text(AGENTS[tool])
    (tmp_path / "policy.toml").write_text(HOLD_PAY)
    store = tmp_path / "store"
    with EffectService() as svc:
        run = _cli("record", "--store", str(store), "--traj", "t", "--policy", "policy.toml",
                   "--", PY, "agent.py", svc.url, cwd=tmp_path)
        made = []
        while run.returncode == 5:
            made.append(svc.stats()["payments"])
            (call,) = _pending(store, tmp_path)
            _cli("approve", str(store), "t", call, "--by", "carol", cwd=tmp_path, check=True)
            run = _cli("resume", str(store), "t", "--policy", "policy.toml", cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert made == [0, 1], made  # paused before each payment
        assert [p["to"] for p in svc.payments] == ["acct-A", "acct-B"]
        assert run.stdout.count('"id": "pay_') == 2, run.stdout
    status = _cli("status", str(store), "t", cwd=tmp_path, check=True).stdout
    assert status.count("settled") == 2 and status.count("approved (used)") == 2, status
