"""Logs written by earlier builds (golden_logs/) must still read back exactly, and the
recordings of the examples (golden_logs/MANIFEST.json, written by golden_logs/record.py)
must build-replay against the current code: the examples must still send what they
sent when they were recorded."""

from __future__ import annotations

import hashlib
import json
import lzma
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stenograph
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.kinds import FORMAT_VERSION
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.recorder.trajfile import read_trajectory
from stenograph.runner.shim import EXACT, PROTOCOL, READS

GOLDEN = Path(__file__).resolve().parent.parent / "golden_logs"
REPO = GOLDEN.parent
CLI = [sys.executable, "-m", "stenograph"]
MANIFEST = json.loads((GOLDEN / "MANIFEST.json").read_text())
LOGS: list[dict[str, Any]] = MANIFEST["logs"]
CURRENT = [e for e in LOGS if not e.get("superseded")]
WS_ROOT = "/tmp/steno-golden"


def test_every_format_version_has_golden_files() -> None:
    versions = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
    assert "v1" in versions


def test_v1_store_reads_back_exactly() -> None:
    expected = json.loads((GOLDEN / "v1" / "expected-events.json").read_text())
    reader = StoreReader(GOLDEN / "v1" / "store")
    got = [e.to_json() for e in reader.events()]
    assert got == expected
    assert len(reader.segments) > 1, "the golden store should span several segments"
    assert reader.torn is None


def test_v1_trajectory_file_and_blob() -> None:
    expected = [e for e in json.loads((GOLDEN / "v1" / "expected-events.json").read_text())
                if e["traj"] == "run-a"]
    tf = read_trajectory(GOLDEN / "v1" / "run-a.steno")
    assert [e.to_json() for e in tf.events] == expected
    result = next(e for e in tf.events if e.kind == "ToolResult")
    ref = BlobRef.from_body(result.body["output"])
    assert tf.blobs[ref.sha256] == BlobStore(GOLDEN / "v1" / "store" / "blobs").get(ref)
    assert len(tf.blobs[ref.sha256]) == ref.size


def test_v1_store_is_appendable_by_this_build(tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN / "v1" / "store", copy)
    with Store(copy) as st:
        assert st.recovered is None
        assert st.next_seq("run-a") == 5
        lsn = st.append("run-a", "Note", {"after": "upgrade"})
    evs = list(StoreReader(copy).events(traj="run-a"))
    assert evs[-1].lsn == lsn == 19
    assert evs[-1].prev == evs[-2].lsn


# -- the recordings of the examples: build replay against the current code -----------

def _name(entry: dict[str, Any]) -> str:
    return str(entry["log"]).removesuffix(".xz")


def _unpack(entry: dict[str, Any], into: Path) -> Path:
    """The entry's log, uncompressed into ``into``, checked against the manifest."""
    data = (GOLDEN / entry["log"]).read_bytes()
    if entry["log"].endswith(".xz"):
        data = lzma.decompress(data)
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], "log differs from MANIFEST"
    out = into / _name(entry)
    out.write_bytes(data)
    return out


def _cmd(entry: dict[str, Any]) -> list[str]:
    return [a.replace("{python}", sys.executable).replace("{repo}", str(REPO))
            for a in entry["cmd"]]


def _build_replay(log: Path, cmd: list[str]) -> tuple[int, dict[str, Any], str]:
    p = subprocess.run([*CLI, "replay", "--build", str(log), "--json", "--", *cmd],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    lines = p.stdout.strip().splitlines()
    assert lines, f"no report (exit {p.returncode}): {p.stderr[-3000:]}"
    return p.returncode, json.loads(lines[-1]), p.stderr


def test_the_manifest_names_every_golden_log_and_the_examples_exist() -> None:
    names = sorted(p.name for p in GOLDEN.iterdir()
                   if p.name.endswith((".steno", ".steno.xz")))
    assert names == sorted(e["log"] for e in LOGS)
    assert {e["name"] for e in CURRENT} >= {"openai_agent", "anthropic_agent",
                                             "effect_agent", "pipeline"}
    for e in CURRENT:
        assert (REPO / e["example"]).is_file(), e["example"]
        assert f"{{repo}}/{e['example']}" in e["cmd"]
        assert e["workspace"].startswith(WS_ROOT + "/")
        assert (GOLDEN / e["log"]).stat().st_size < 1 << 20


@pytest.mark.parametrize("entry", LOGS, ids=_name)
def test_a_golden_log_reads_and_verifies(entry: dict[str, Any], tmp_path: Path) -> None:
    """Every golden log, superseded ones too: this build reads it, `log verify` passes,
    its versions are the manifest's; a superseded one (kept when its example was
    re-recorded by a later format or protocol) still goes through a build replay to a
    report, matching or not."""
    log = _unpack(entry, tmp_path)
    tf = read_trajectory(log)
    started = next(e.body for e in tf.events if e.kind == "RunStarted")
    assert any(e.kind == "RunEnded" for e in tf.events)
    assert started["shim"] == entry["shim"]
    assert str(started["shim"]).partition("/")[0] == str(entry["protocol"])
    assert started["stenograph"] == entry["stenograph"]
    assert tf.header["format"] == entry["format"] <= FORMAT_VERSION
    assert started["cwd"] == entry["workspace"]
    v = subprocess.run([*CLI, "log", "verify", str(log)], capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr
    if entry.get("superseded"):
        rc, rep, err = _build_replay(log, _cmd(entry))
        assert rc in (0, 1) and rep["mode"] == "build", err[-3000:]


@pytest.mark.parametrize("entry", CURRENT, ids=_name)
def test_a_golden_log_build_replays_against_the_current_code(
        entry: dict[str, Any], tmp_path: Path) -> None:
    """Model requests, tool calls, effects and the exit status as recorded (a log of an
    older shim protocol too: its C tape is then all live, and a note says so)."""
    log = _unpack(entry, tmp_path)
    rc, rep, err = _build_replay(log, _cmd(entry))
    assert rep["divergences"] == [], json.dumps(rep["divergences"], indent=1)[:4000]
    assert rc == 0, err[-3000:]
    assert rep["exit_status"] == {"recorded": 0, "replayed": 0}
    if entry["protocol"] != PROTOCOL:
        assert "shim protocol" in " ".join(rep.get("notes") or []), rep


def test_every_shim_protocol_has_a_golden_log() -> None:
    """One recording per protocol this build reads (golden_logs/record.py ``--src`` adds an
    older release's): the promise below is held for each. A new protocol needs its own:
    ``record.py pipeline`` after the bump keeps the last one's as superseded."""
    assert {int(e["protocol"]) for e in LOGS} >= READS | {PROTOCOL}


@pytest.fixture()
def installed_like() -> Iterator[Callable[[dict[str, Any]], list[str]]]:
    """``python -m stenograph`` of this build from a directory whose path is as long as
    the one a log was recorded from (``installed_at``, record.py): the checkout, or a
    copy of the package. The shim's path (``LD_PRELOAD``) and the hooks' (``PYTHONPATH``)
    are on a program's stack, so only then does it see the recorded addresses (the
    pipeline's ``mktemp -d`` names its directory after one)."""
    made: list[Path] = []

    def cli(entry: dict[str, Any]) -> list[str]:
        here = Path(stenograph.__file__).resolve().parent.parent
        want = len(str(entry.get("installed_at") or here))
        if len(str(here)) == want:
            return CLI
        if want < len("/tmp/") + 6:
            pytest.skip(f"recorded from a path of {want} bytes: no copy of the package fits")
        d = Path("/tmp/" + secrets.token_hex(want)[:want - len("/tmp/")])
        d.mkdir()
        made.append(d)
        shutil.copytree(here / "stenograph", d / "stenograph", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        return [sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, {str(d)!r}); "
                "runpy.run_module('stenograph', run_name='__main__', alter_sys=True)"]

    yield cli
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("entry", LOGS, ids=_name)
def test_an_exact_replay_of_a_golden_log_is_bit_for_bit_or_one_line(
        entry: dict[str, Any], tmp_path: Path,
        installed_like: Callable[[dict[str, Any]], list[str]]) -> None:
    """``stenograph replay`` (not ``--build``) of a log this shim replays exactly (its own
    protocol) is bit-identical; of any other protocol it stops before anything is
    prepared or run (no tape, no output) with one line that names both protocols and the
    two ways on: a build replay (which reads every golden log: the tests above), or the
    release that recorded it."""
    log = _unpack(entry, tmp_path)
    tape = tmp_path / "tape"
    cli = installed_like(entry) if entry["protocol"] in EXACT else CLI
    p = subprocess.run([*cli, "replay", "--json", "--keep-tape", str(tape), str(log), "--",
                        *_cmd(entry)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if entry["protocol"] in EXACT:
        assert p.returncode == 0, p.stderr[-3000:]
        report = json.loads(p.stdout.strip().splitlines()[-1])
        assert report["divergences"] == [] and all(report["identical"].values()), report
        return
    assert p.returncode == 2 and not p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"stenograph: error: recorded with shim protocol "
                           f"{entry['protocol']}; this stenograph speaks {PROTOCOL} "), line
    assert f"`stenograph replay --build {log}`" in line, line
    assert (f"the stenograph release that recorded it (stenograph {entry['stenograph']}, "
            f"shim {entry['shim']}) replays it exactly") in line, line
    assert not tape.exists(), "nothing may be prepared for a refused replay"


def test_a_changed_agent_fails_the_build_replay_at_turn_2(tmp_path: Path) -> None:
    """The suite can fail: examples/agent.py with its tool output cut to 20 characters
    asks the model something else at turn 2 (the first tool result goes back in it)."""
    (entry,) = [e for e in CURRENT if e["name"] == "openai_agent"]
    src = (REPO / "examples" / "agent.py").read_text()
    assert "\nMAX_OUTPUT = 4000\n" in src
    changed = tmp_path / "changed" / "agent.py"
    changed.parent.mkdir()
    changed.write_text(src.replace("\nMAX_OUTPUT = 4000\n", "\nMAX_OUTPUT = 20\n"))
    cmd = [str(changed) if a == str(REPO / "examples" / "agent.py") else a
           for a in _cmd(entry)]
    assert str(changed) in cmd
    rc, rep, err = _build_replay(_unpack(entry, tmp_path), cmd)
    assert rc == 1, err[-3000:]
    first = rep["divergences"][0]
    assert (first["turn"], first["channel"], first["kind"]) == (2, "model", "changed"), first
    assert any("messages" in str(d["path"]) for d in first["diff"]), first["diff"]


@pytest.mark.parametrize("entry", CURRENT, ids=_name)
def test_a_golden_log_build_replays_on_a_machine_that_never_recorded(
        entry: dict[str, Any], tmp_path: Path) -> None:
    """No /tmp/steno-golden: the build replay runs with a fresh /tmp (record.py
    --fresh-tmp), as on a CI machine that never recorded; the sealed replay should
    recreate the workspace from the log's snapshot."""
    log = _unpack(entry, tmp_path)
    wrap = [sys.executable, str(GOLDEN / "record.py"), "--fresh-tmp", "--"]
    p = subprocess.run([*wrap, *CLI, "replay", "--build", str(log), "--json", "--",
                        *_cmd(entry)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert "record.py" not in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["divergences"] == []
