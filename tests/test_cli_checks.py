"""A command refused for bad input says so in one line, exits 2, and leaves every byte
as it was: checked by hashing the directories involved before and after.

Each case is a real command line of the real CLI, the kind a tester's fuzzing found
mishandled: a named pipe as input (it used to hang `log verify`, `log cat` and
`replay` for ever), trajectory ids with a path in them or 4,096 characters long (a
traceback, or a store created in the parent directory), a command that cannot run
(detected after the store was made), an export written over the store's own segment.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "stenograph"]


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (and ``root``'s own listing) by content hash."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_fifo() or p.is_socket():
            out[rel] = "special"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=20,
                          env=env)


def _refused(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    s = tmp_path / "runs"
    p = _run(["log", "append", str(s), "--traj", "t1", "--kind", "RunStarted",
              "--body", '{"argv": ["x"]}'], tmp_path)
    assert p.returncode == 0, p.stderr
    return s


@pytest.mark.parametrize("args", [
    ["replay", "{fifo}"], ["log", "verify", "{fifo}"], ["log", "cat", "{fifo}"],
    ["log", "import", "{fifo}", "{tmp}/new-store"],
])
def test_a_named_pipe_as_input_is_refused_at_once(tmp_path: Path, args: list[str]) -> None:
    fifo = tmp_path / "in.steno"
    os.mkfifo(fifo)
    before = _tree(tmp_path)
    p = _run([a.format(fifo=fifo, tmp=tmp_path) for a in args], tmp_path)
    _refused(p)
    assert "named pipe" in p.stderr
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("traj", ["../escape", "a/b", "x" * 4096, "", "bad id"])
def test_a_bad_trajectory_id_is_refused_before_anything_is_made(tmp_path: Path,
                                                                 traj: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    before = _tree(tmp_path)
    p = _run(["record", "--traj", traj, "--", "true"], work)
    _refused(p)
    assert _tree(tmp_path) == before


def test_a_command_that_cannot_run_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)  # not executable
    before = _tree(tmp_path)
    for cmd in ([str(script)], ["no-such-command-anywhere"]):
        p = _run(["record", "-o", str(tmp_path / "out.steno"), "--", *cmd], tmp_path)
        _refused(p)
        assert _tree(tmp_path) == before, cmd


def test_an_export_over_the_stores_own_files_is_refused(tmp_path: Path, store: Path) -> None:
    seg = next((store / "wal").glob("*.seg"))
    before = _tree(tmp_path)
    for out in (seg, store / "new.steno", store / "wal" / "x.steno"):
        p = _run(["log", "export", str(store), "t1", "-o", str(out)], tmp_path)
        _refused(p)
        assert "inside the store" in p.stderr, p.stderr
        assert _tree(tmp_path) == before, out
    assert _run(["log", "verify", str(store)], tmp_path).returncode == 0


def test_a_record_output_inside_a_store_is_refused(tmp_path: Path, store: Path) -> None:
    before = _tree(tmp_path)
    p = _run(["record", "-o", str(store / "wal" / "run.steno"), "--", "true"], tmp_path)
    _refused(p)
    assert _tree(tmp_path) == before


def test_log_ls_never_cuts_a_trajectory_id(tmp_path: Path) -> None:
    s = tmp_path / "runs"
    long_id = "agent-" + "k" * 150 + "-end"
    p = _run(["log", "append", str(s), "--traj", long_id, "--kind", "RunStarted",
              "--body", "{}"], tmp_path)
    assert p.returncode == 0, p.stderr
    out = _run(["log", "ls", str(s)], tmp_path).stdout
    first_column = [ln.split("│")[1].strip() for ln in out.splitlines()
                    if ln.startswith("│") and ln.count("│") > 2]
    assert "".join(first_column) == long_id, out


def test_a_refused_import_leaves_the_store_as_it_was(tmp_path: Path, store: Path) -> None:
    steno = tmp_path / "t1.steno"
    assert _run(["log", "export", str(store), "t1", "-o", str(steno)], tmp_path).returncode == 0
    before = _tree(tmp_path)
    p = _run(["log", "import", str(steno), str(store)], tmp_path)  # t1 is already there
    _refused(p)
    assert "already has a trajectory" in p.stderr
    assert _tree(tmp_path) == before  # not even LOCK rewritten or a close marker added
