"""`diff` judges a tool result by every file the tool's work read, from the evidence on
the tape: the stat it made (size, mtime; the shim names the file an fstat looked at)
and the bytes a snapshot holds, inside the recorded workspace or not.

The report behind it: the agent's checkout is given as an argument and `record` runs
from another directory, so the file the tool reads is outside the recorded workspace.
The file changed between the two runs; `diff` blamed the harness ("its inputs are the
same in both runs"). The agent is examples/agent.py recorded under the real shim
against the loopback model server, whose script branches on what the file says."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest
from planted_agent import CLI, NOTES, env, record

from stenograph.harness.divergence import analyze
from stenograph.harness.reads import Reads, Seen, compare
from stenograph.harness.source import open_input
from stenograph.harness.trajectory import build
from stenograph.recorder.chunks import chunk_data
from stenograph.recorder.filestats import stats
from stenograph.recorder.tape import RECORD, iter_records

OTHER = "release notes: ship it.\nnothing to do.\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reads")
    checkout, moved = root / "checkout", root / "moved"
    checkout.mkdir()
    moved.mkdir()
    out = {
        "monday": record(root, "monday", checkout=checkout)[0],
        # the same checkout, left alone; the harness cuts tool output at 20 characters
        "harness": record(root, "harness", checkout=checkout, max_output=20)[0],
        # the checkout's notes.txt says something else now
        "tuesday": record(root, "tuesday", checkout=checkout, notes=OTHER)[0],
        # the checkout is somewhere else, and says something else
        "moved-run": record(root, "moved-run", checkout=moved, notes=OTHER)[0],
    }
    assert not (root / "monday" / "notes.txt").exists()  # not in the recorded workspace
    return {**out, "checkout": checkout, "moved": moved}


def _diff(a: Path, b: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "diff", str(a), str(b), *extra], capture_output=True,
                          text=True, timeout=60, env=env())


def _json(a: Path, b: Path) -> dict:
    p = _diff(a, b, "--json")
    assert p.returncode == 1, p.stderr
    return json.loads(p.stdout)


def _notes(where: Path) -> str:
    return os.path.realpath(where / "notes.txt")


def test_a_file_outside_the_workspace_that_changed_is_the_environment(runs: dict) -> None:
    d = _json(runs["monday"], runs["tuesday"])
    assert d["t_div"] == 3 and d["context_identical"] is False, d
    assert d["cause"] == "environment", d
    first = d["differences"][0]
    notes = _notes(runs["checkout"])
    assert first["source"].startswith(
        f"environment: tool result: the file {notes} differs between the runs "
        f"(size {len(NOTES)} vs {len(OTHER)}, mtime "), first["source"]
    [f] = [f for f in first["files"] if f["file"] == notes]
    assert f["verdict"] == "differs" and f["what"] == ["size", "mtime"], f
    assert (f["a"]["size"], f["b"]["size"]) == (len(NOTES), len(OTHER))
    assert f["a"]["mtime_ns"] < f["b"]["mtime_ns"]
    p = _diff(runs["monday"], runs["tuesday"])
    assert "cause: environment (contexts at turn 3 differ)" in p.stdout
    assert f"the file {notes} differs" in p.stdout and "its inputs are the same" not in p.stdout


def test_the_same_file_outside_the_workspace_leaves_it_to_the_harness(runs: dict) -> None:
    """Every file the tool read has evidence in both runs and it is the same: then, and
    only then, the inputs are the same."""
    d = _json(runs["monday"], runs["harness"])
    assert d["t_div"] == 3 and d["cause"] == "harness", d
    first = d["differences"][0]
    assert first["source"].startswith("harness: tool result of read_file: its inputs are "
                                      "the same in both runs"), first["source"]
    [f] = [f for f in first["files"] if f["file"] == _notes(runs["checkout"])]
    assert f["verdict"] == "same" and f["a"] == f["b"], f


def test_a_file_one_run_holds_no_evidence_of_is_unknown(runs: dict) -> None:
    """The checkout moved: each run read a file the other's tape says nothing of."""
    d = _json(runs["monday"], runs["moved-run"])
    assert d["t_div"] == 3 and d["cause"] == "unknown", d
    first = d["differences"][0]
    notes, moved = _notes(runs["checkout"]), _notes(runs["moved"])
    assert first["source"].startswith(
        f"unknown: tool result of read_file: the file {notes}: run b holds no evidence "
        f"of it; run a's tool read it (size {len(NOTES)}, mtime "), first["source"]
    verdicts = {f["file"]: (f["verdict"], f["a"] is None, f["b"] is None)
                for f in first["files"]}
    assert verdicts[notes] == ("unknown", False, True), verdicts
    assert verdicts[moved] == ("unknown", True, False), verdicts
    p = _diff(runs["monday"], runs["moved-run"])
    assert "cause: unknown" in p.stdout and f"unknown: {moved}: run a holds no evidence" \
        in p.stdout, p.stdout


def _without_file_names(path: Path):
    """The recording as a tape made before the shim named the files an fstat looked at:
    every meta record cut after its result."""
    rec = open_input(str(path), None)
    events = []
    for ev in rec.events:
        if ev.kind == "TapeChunk":
            out = bytearray()
            for ch, op, payload in iter_records(chunk_data(ev.body)):
                if ch == 8:
                    hdr = 16 if op == 2 else 12
                    (pl,) = struct.unpack_from("<I", payload, hdr - 4)
                    (rc,) = struct.unpack_from("<i", payload, hdr + pl + 4)
                    payload = payload[:hdr + pl + 8 + (0 if rc else 256 if op == 2 else 144)]
                out += RECORD.pack(ch, op, 0, len(payload)) + payload
            ev = dataclasses.replace(ev, body={**{k: v for k, v in ev.body.items()
                                                  if k in ("proc", "thread")},
                                               "data": bytes(out)})
        events.append(ev)
    return build(rec.traj, rec.header, events, rec.body)


def test_a_tape_that_does_not_name_the_file_is_unknown(runs: dict) -> None:
    """Run b's tape holds the stats of what its tool read but not which file they were:
    no evidence of the file run a's tool read, named."""
    a = open_input(str(runs["monday"]), None).trajectory()
    d = analyze(a, _without_file_names(runs["tuesday"]))
    assert d.t_div == 3 and d.cause == "unknown", d.to_json()
    notes = _notes(runs["checkout"])
    assert d.differences[0].source.startswith(
        f"unknown: tool result of read_file: the file {notes}: run b holds no evidence of "
        "it"), d.differences[0].source
    d = analyze(_without_file_names(runs["monday"]), _without_file_names(runs["tuesday"]))
    assert d.cause == "unknown" and d.differences[0].source == (
        "unknown: tool result of read_file: its work read 1 file(s) the tape does not name "
        "(recorded before stats named their files), so whether they differ is not known")


def test_meta_records_decode_to_files_and_compare_by_their_evidence() -> None:
    """The record layouts of docs/shim-protocol.md (channel 8), and the rules `compare`
    judges a file by: the same bytes are the same file whenever written; a field the
    stat did not ask for (a statx mask without the mtime) is not compared."""
    def statx(path: bytes, mask: int, size: int, where: bytes | None) -> bytes:
        body = bytearray(256)
        struct.pack_into("<I", body, 0, mask)
        struct.pack_into("<H", body, 28, 0o100644)
        struct.pack_into("<Q", body, 40, size)
        struct.pack_into("<qI", body, 112, 1_700_000_000, 5)
        tail = struct.pack("<I", len(where)) + where if where is not None else b""
        return (struct.pack("<iiII", -100, 0, 0xfff, len(path)) + path +
                struct.pack("<ii", -100, 0) + bytes(body) + tail)

    def fstat(size: int, mtime: int, where: bytes | None) -> bytes:
        body = bytearray(144)
        struct.pack_into("<I", body, 24, 0o100644)
        struct.pack_into("<q", body, 48, size)
        struct.pack_into("<qq", body, 88, mtime // 10**9, mtime % 10**9)
        tail = struct.pack("<I", len(where)) + where if where is not None else b""
        return struct.pack("<iiI", -1, 4096, 0) + struct.pack("<ii", 5, 0) + bytes(body) + tail

    data = b"".join(RECORD.pack(8, op, 0, len(p)) + p for op, p in (
        (2, statx(b"f.txt", 0x1 | 0x200, 6, b"/w/f.txt")),
        (2, statx(b"f.txt", 0x1 | 0x200 | 0x40, 6, b"/w/f.txt")),
        (1, fstat(6, 7 * 10**18, b"/w/f.txt")),
        (1, fstat(6, 7 * 10**18, None)),
        (2, statx(b"/etc/x", 0x1 | 0x200, 1, None))))
    got = list(stats(data))
    assert [(s.path, s.size, s.mtime_ns) for s in got] == [
        ("/w/f.txt", 6, None), ("/w/f.txt", 6, 1_700_000_000_000_000_005),
        ("/w/f.txt", 6, 7 * 10**18), (None, 6, 7 * 10**18), ("/etc/x", 1, None)]
    assert all(s.regular for s in got)

    def reads(**files: Seen) -> Reads:
        return Reads({k: dataclasses.replace(v, file=k) for k, v in files.items()})

    one = Seen("", "/w/f", True, 6, 1, "ab" * 32)
    verdicts = {e.file: (e.verdict, e.what) for e in compare(
        reads(same_bytes=one, no_mtime=dataclasses.replace(one, mtime_ns=None, sha256=""),
              grew=one, only_a=one, gone=one),
        reads(same_bytes=dataclasses.replace(one, mtime_ns=2),
              no_mtime=dataclasses.replace(one, sha256=""),
              grew=dataclasses.replace(one, size=7, sha256=""),
              gone=Seen("", "/w/f", False)))}
    assert verdicts == {"same_bytes": ("same", ()), "no_mtime": ("same", ()),
                        "grew": ("differs", ("size",)), "only_a": ("unknown", ()),
                        "gone": ("differs", ("exists",))}, verdicts
