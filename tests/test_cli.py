"""The `stenograph log` commands, run as real processes through the console script."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stenograph.recorder.segment import HEADER, TRAJ_MAGIC


def steno(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stenograph", *args],
        capture_output=True, text=True, cwd=cwd, timeout=60,
    )


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "LOCK":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    s = tmp_path / "store"
    for traj, kind, body in [
        ("t1", "TaskStarted", {"task": "x"}),
        ("t1", "ModelReplied", {"text": "hi", "raw": "caf\u00e9"}),
        ("t2", "Note", {"n": 1}),
        ("t1", "ToolResult", {"status": "ok"}),
    ]:
        r = steno("log", "append", str(s), "--traj", traj, "--kind", kind, "--body",
                  json.dumps(body))
        assert r.returncode == 0, r.stderr
    return s


def test_append_ls_cat_roundtrip(store: Path) -> None:
    r = steno("log", "ls", str(store), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    counts = {t["traj"]: t["events"] for t in info["trajectories"]}
    assert counts == {"t1": 3, "t2": 1}
    r = steno("log", "cat", str(store), "--traj", "t1", "--jsonl")
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [e["kind"] for e in lines] == ["TaskStarted", "ModelReplied", "ToolResult"]
    assert [e["seq"] for e in lines] == [0, 1, 2]
    assert lines[1]["body"]["raw"] == "caf\u00e9"
    assert lines[2]["prev"] == lines[1]["lsn"]


def test_export_verify_import(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "t1.steno"
    r = steno("log", "export", str(store), "t1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    r = steno("log", "verify", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["events"] == 3
    other = tmp_path / "other"
    r = steno("log", "import", str(out), str(other), "--as", "copy")
    assert r.returncode == 0, r.stderr
    r = steno("log", "cat", str(other), "--jsonl")
    assert [json.loads(x)["kind"] for x in r.stdout.splitlines()] == [
        "TaskStarted", "ModelReplied", "ToolResult"]


def test_verify_reports_corruption_with_exit_3(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "t1.steno"
    assert steno("log", "export", str(store), "t1", "-o", str(out)).returncode == 0
    data = bytearray(out.read_bytes())
    data[60] ^= 0x40
    out.write_bytes(bytes(data))
    r = steno("log", "verify", str(out))
    assert r.returncode == 3
    assert r.stderr.startswith("stenograph: error: ")
    assert str(out) in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("setup", "args", "code"),
    [
        ("garbage", ["log", "verify", "{f}"], 2),
        ("empty", ["log", "verify", "{f}"], 2),
        ("newer", ["log", "cat", "{f}"], 2),
        ("truncated", ["log", "verify", "{f}"], 3),
        ("dir", ["log", "ls", "{d}"], 2),
        ("none", ["log", "cat", "{f}"], 2),
        ("none", ["log", "append", "{store}", "--traj", "t1", "--kind", "Nope"], 2),
        ("none", ["log", "append", "{store}", "--traj", "bad id", "--kind", "Note"], 2),
        ("none", ["log", "append", "{store}", "--traj", "t1", "--kind", "Note",
                  "--body", "[1]"], 2),
        ("none", ["log", "export", "{store}", "missing", "-o", "{f}"], 2),
        ("none", ["log", "import", "{store}", "{store}"], 2),
        ("none", ["log", "bogus"], 2),
        ("none", ["log", "cat"], 2),
    ],
)
def test_bad_input_one_line_and_nothing_modified(
    store: Path, tmp_path: Path, setup: str, args: list[str], code: int
) -> None:
    f = tmp_path / "input.steno"
    d = tmp_path / "plain-dir"
    d.mkdir()
    (d / "x").write_text("not a store")
    if setup == "garbage":
        f.write_bytes(os.urandom(300))
    elif setup == "empty":
        f.write_bytes(b"")
    elif setup == "newer":
        f.write_bytes(HEADER.pack(TRAJ_MAGIC, 99, 0, 0, 0, 0) + b"\0" * 16)
    elif setup == "truncated":
        assert steno("log", "export", str(store), "t1", "-o", str(f)).returncode == 0
        f.write_bytes(f.read_bytes()[:-7])
    before = tree_digest(tmp_path)
    r = steno(*[a.format(f=f, d=d, store=store) for a in args])
    assert r.returncode == code, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stenograph: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert tree_digest(tmp_path) == before


def test_help_teaches() -> None:
    r = steno("log", "--help")
    assert r.returncode == 0
    for cmd in ("append", "cat", "export", "import", "ls", "verify"):
        assert cmd in r.stdout
    assert "Examples" in r.stdout


def test_the_readme_exit_codes_are_the_errors_exit_codes() -> None:
    """One list of exit codes (README) and one source (recorder/errors.py): they agree."""
    import re

    from stenograph.recorder import errors

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("(`src/", 1)[0]
    listed = {int(n): what.strip() for n, what in re.findall(r"(\d) ([^·]+)", section)}
    by_code = {1: errors.ReplayDiverged, 2: errors.BadInput, 3: errors.CorruptLog,
               4: errors.NeedsPerson, 5: errors.Paused, 6: errors.Stopped,
               7: errors.WriteFailed, 8: errors.StoreFenced}
    assert sorted(listed) == [0, *sorted(by_code)]
    for code, cls in by_code.items():
        assert cls.exit_code == code, (code, cls)
    assert "paused" in listed[5] and "policy" in listed[6] and "write" in listed[7]
    assert "lease" in listed[8]


def test_record_sweeps_the_socket_directories_killed_recorders_left(tmp_path: Path) -> None:
    """A recorder killed with SIGKILL leaves ``steno-rec-*`` in the temporary directory;
    the next record removes those an hour old whose sockets no one accepts on, and
    keeps one whose recorder still listens."""
    import socket

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    dead, live = tmpdir / "steno-rec-dead", tmpdir / "steno-rec-live"
    dead.mkdir()
    live.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(dead / "tape.sock"))  # closed: its file stays, nothing accepts
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(live / "tape.sock"))
    listener.listen(1)
    try:
        for d in (dead, live):
            os.utime(d, (1, 1))
        env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
        env["TMPDIR"] = str(tmpdir)
        r = subprocess.run([sys.executable, "-m", "stenograph", "record", "-o",
                            str(tmp_path / "t.steno"), "--workspace", "none", "--", "/bin/true"],
                           cwd=tmp_path, env=env, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not dead.exists() and live.exists()
    finally:
        listener.close()
