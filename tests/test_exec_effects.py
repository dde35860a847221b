"""Commands are effects (issue "Intent before effect at every way out", part 1b): an exec
of a command the effects list names (``git push``, ``kubectl apply``... and a policy's
``[commands]``) gets a durable ``ToolIntent`` before the new image starts and a
``ToolResult`` (its exit status) when it ends. Killed while it runs, the command is in
doubt: ``status`` says so, ``resume`` stops for a person (exit 4), and after ``settle``
the resumed run runs it again only if the person said it did not happen. A policy rule
on ``exec ...`` refuses a command before it starts. Real processes, killed as a group
with SIGKILL; the deploy script's own log is the ground truth.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)

DEPLOY = """#!/bin/sh
# deploy.sh VERSION WHEN LOG: the effect (a line in LOG) before or after a pause
[ "$2" = before ] && echo "deployed $1" >> "$3"
touch "$3.running"
sleep 3
[ "$2" = after ] && echo "deployed $1" >> "$3"
echo "deployed $1"
"""

AGENT = """
import subprocess, sys
when, log = sys.argv[1], sys.argv[2]
r = subprocess.run(["./deploy.sh", "v1", when, log], capture_output=True, text=True)
print("deploy:", r.returncode, r.stdout.strip(), flush=True)
print("git:", subprocess.run(["git", "--version"], capture_output=True, text=True).returncode)
"""

POLICY = '[commands]\neffect = ["deploy.sh*"]\n'


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO")}


def _setup(tmp_path: Path, policy: str = POLICY) -> tuple[Path, Path]:
    (tmp_path / "deploy.sh").write_text(DEPLOY)
    (tmp_path / "deploy.sh").chmod(0o755)
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "policy.toml").write_text(policy)
    # the effect's ground truth is a file of the workspace: a resume's writes reach it when
    # the resumed run ends (a sealed resume's /tmp is its own)
    return tmp_path / "store", tmp_path / "deploys.log"


def _status(store: Path) -> list[list[str]]:
    out = subprocess.run([*CLI, "status", str(store), "t"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [line.split(None, 2) for line in out.splitlines()[1:]
            if line.strip() and not line.strip().startswith("did:")]


def _record_killed_while_deploying(tmp_path: Path, store: Path, log: Path, when: str) -> None:
    p = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t", "--policy",
                          "policy.toml", "--", PY, "agent.py", when, str(log)],
                         cwd=tmp_path, env=_env(), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    running = Path(f"{log}.running")
    deadline = time.monotonic() + 60
    while not running.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert running.exists(), "the deploy never started"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=60)


def _resume(tmp_path: Path, store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "resume", str(store), "t", "--policy", "policy.toml"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=180)


def _deploys(log: Path) -> int:
    return log.read_text().count("deployed") if log.exists() else 0


def test_a_command_is_an_effect_with_its_exit_status(tmp_path: Path) -> None:
    store, log = _setup(tmp_path)
    rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "--policy",
                          "policy.toml", "--", PY, "agent.py", "after", str(log)],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0 and "deploy: 0 deployed v1" in rec.stdout, rec.stderr
    rows = _status(store)
    assert len(rows) == 1 and rows[0][1] == "settled", rows  # git --version is no effect
    assert rows[0][2] == f"exec deploy.sh v1 after {log}", rows


def test_a_command_killed_before_its_effect_is_run_once_more_after_a_person_says_so(
        tmp_path: Path) -> None:
    store, log = _setup(tmp_path)
    _record_killed_while_deploying(tmp_path, store, log, "after")
    assert _deploys(log) == 0
    (call, state, target), = _status(store)
    assert state == "in-doubt" and target.startswith("exec deploy.sh v1"), (call, state)
    stop = _resume(tmp_path, store)
    assert stop.returncode == 4 and call in stop.stderr and "settle" in stop.stderr, stop.stderr
    assert _deploys(log) == 0  # nothing ran
    subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "not-done"], check=True,
                   capture_output=True, timeout=60)
    res = _resume(tmp_path, store)
    assert res.returncode == 0 and "deploy: 0 deployed v1" in res.stdout, res.stderr
    assert _deploys(log) == 1


def test_a_command_settled_as_done_is_not_run_again(tmp_path: Path) -> None:
    store, log = _setup(tmp_path)
    _record_killed_while_deploying(tmp_path, store, log, "before")
    assert _deploys(log) == 1
    (call, state, _), = _status(store)
    assert state == "in-doubt"
    subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done"], check=True,
                   capture_output=True, timeout=60)
    res = _resume(tmp_path, store)
    assert res.returncode == 0 and "deploy: 0" in res.stdout and "git: 0" in res.stdout, \
        res.stderr
    assert _deploys(log) == 1
    assert [r[1] for r in _status(store)] == ["settled"]


def test_a_policy_rule_refuses_a_command_before_it_starts(tmp_path: Path) -> None:
    store, log = _setup(tmp_path, POLICY + '\n[[rule]]\nmatch = "^exec deploy\\\\.sh "\n'
                                           'action = "deny"\n')
    rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "--policy",
                          "policy.toml", "--", PY, "agent.py", "before", str(log)],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert rec.returncode == 1 and "PermissionError" in rec.stderr, rec.stderr
    assert _deploys(log) == 0 and _status(store) == []


def test_the_result_of_a_command_is_the_status_it_ends_with_however_it_ends(
        tmp_path: Path) -> None:
    """``sh`` ends through ``_exit``; ``git`` and Python return from ``main`` or call
    ``exit``, whose status the shim learns only from a handler registered as ``main``
    starts (one registered earlier runs after the shim's own last word)."""
    from stenograph.recorder.reader import StoreReader

    (tmp_path / "agent.py").write_text(
        "import subprocess, sys\n"
        "for argv in (['sh', '-c', 'exit 3'], ['git', 'rev-parse', '--verify', '-q', 'nope'],\n"
        "             [sys.executable, '-c', 'import sys; sys.exit(7)']):\n"
        "    print(subprocess.run(argv).returncode)\n")
    (tmp_path / "policy.toml").write_text(
        '[commands]\neffect = ["sh -c exit*", "git rev-parse*", "python* -c *"]\n')
    store = tmp_path / "store"
    rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "--policy",
                          "policy.toml", "--", PY, "agent.py"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=180)
    assert rec.returncode == 0 and rec.stdout.split() == ["3", "128", "7"], rec.stderr
    results = [ev.body.get("status") for ev in StoreReader(store).events(traj="t")
               if ev.kind == "ToolResult"]
    assert results == ["3", "128", "7"], results


def test_a_probe_settles_a_command_in_doubt_without_a_person(tmp_path: Path) -> None:
    """The policy's ``[[probe]]`` for ``deploy.sh`` asks the deploy log (exit 0: it
    happened, 1: it did not): killed before the deploy wrote its line, the resume runs it
    again; killed after, it does not; nobody is asked either time."""
    for when, runs in (("after", 1), ("before", 1)):
        case = tmp_path / when
        case.mkdir()
        log = case / "deploys.log"
        store, _ = _setup(case, POLICY + '\n[[probe]]\nmatch = "^exec deploy\\\\.sh "\n'
                                         f'command = "test -f {log} && grep -q deployed {log}"\n')
        _record_killed_while_deploying(case, store, log, when)
        assert _status(store)[0][1] == "in-doubt"
        res = _resume(case, store)
        assert res.returncode == 0 and "deploy: 0" in res.stdout, res.stderr
        assert _deploys(log) == runs, (when, log.read_text())
        assert _status(store)[0][1] == "settled"
