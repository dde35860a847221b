"""The numbers and names C and Python share agree, value by value.

shim_c/steno_shim.h is the truth for numbers, shim_c/wrapped.def for op names and for
what the library exports; the Python modules keep mirrors of them, which would drift
silently: a record written under one number and read under another is misread, not
refused.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stenograph.interpose import exits
from stenograph.recorder import rings, tape
from stenograph.runner import shim

SHIM_C = Path(__file__).resolve().parent.parent / "shim_c"
DEFINE = re.compile(r"^#define\s+(\w+)\s+(\d+|\"[^\"]*\")", re.MULTILINE)
OP_ROW = re.compile(r"^OP\((CH_\w+),\s*(OP_\w+),\s*\"([^\"]*)\"\)", re.MULTILINE)
SYM_ROW = re.compile(r"^(REAL|RAW)\((\w+),", re.MULTILINE)


def header() -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for name, value in DEFINE.findall((SHIM_C / "steno_shim.h").read_text()):
        out[name] = value.strip('"') if value.startswith('"') else int(value)
    return out


def test_header_parses() -> None:
    h = header()
    assert {"STENO_PROTOCOL", "MSG_DATA", "CH_CLOCK", "OP_CLOCK_GETTIME", "NCH",
            "DIVERGENCE_EXIT", "STENO_MAGIC"} <= set(h)


MIRRORS = [
    ("STENO_PROTOCOL", "stenograph.runner.shim.PROTOCOL", shim.PROTOCOL),
    ("STENO_MAGIC", "stenograph.recorder.tape.MAGIC", tape.MAGIC.decode()),
    ("MSG_DATA", "stenograph.recorder.tape.MSG_DATA", tape.MSG_DATA),
    ("MSG_BARRIER", "stenograph.recorder.tape.MSG_BARRIER", tape.MSG_BARRIER),
    ("MSG_EXIT", "stenograph.recorder.tape.MSG_EXIT", tape.MSG_EXIT),
    ("MSG_RING", "stenograph.recorder.tape.MSG_RING", tape.MSG_RING),
    ("MSG_NUDGE", "stenograph.recorder.tape.MSG_NUDGE", tape.MSG_NUDGE),
    ("MSG_BIG", "stenograph.recorder.tape.MSG_BIG", tape.MSG_BIG),
    ("MSG_SYNC", "stenograph.recorder.tape.MSG_SYNC", tape.MSG_SYNC),
    ("MSG_INTENT", "stenograph.recorder.tape.MSG_INTENT", tape.MSG_INTENT),
    ("MSG_RESULT", "stenograph.recorder.tape.MSG_RESULT", tape.MSG_RESULT),
    ("MSG_EXEC", "stenograph.recorder.tape.MSG_EXEC", tape.MSG_EXEC),
    *[(name, f"stenograph.recorder.tape.{name}", getattr(tape, name))
      for name in ("ANS_REFUSED", "ANS_GO", "ANS_SKIP", "ANS_ANSWERED")],
    *[(name, f"stenograph.recorder.rings.{name}",
       getattr(rings, name).decode() if name == "RING_MAGIC" else getattr(rings, name))
      for name in ("RING_MAGIC", "RING_VERSION", "ARENA_HDR", "ARENA_OFF_NSLOTS",
                   "ARENA_OFF_PID", "ARENA_OFF_ID", "RING_SLOTS", "RING_HDR", "RING_CAP",
                   "RING_SLOT", "RING_OFF_TINDEX", "RING_OFF_HEAD", "RING_OFF_TAIL")],
    ("DIVERGENCE_EXIT", "stenograph.recorder.tape.DIVERGENCE_EXIT", tape.DIVERGENCE_EXIT),
    ("DIVERGENCE_EXIT", "stenograph.interpose.exits.DIVERGED_EXIT", exits.DIVERGED_EXIT),
]


@pytest.mark.parametrize(("c_name", "py_name", "py_value"), MIRRORS,
                         ids=[py for _c, py, _v in MIRRORS])
def test_protocol_magic_messages_and_exit_codes(c_name: str, py_name: str,
                                                py_value: object) -> None:
    assert header()[c_name] == py_value, f"{c_name} in steno_shim.h vs {py_name}"


def test_channels() -> None:
    h = header()
    channels = {v: k[3:].lower() for k, v in h.items() if k.startswith("CH_")}
    assert channels == tape.CHANNELS
    assert h["NCH"] == max(channels) + 1
    # the stream file names the shim opens at replay (TAPE/<proc>/<thread>.<channel>)
    m = re.search(r"CH_NAMES\[NCH\]\s*=\s*\{([^}]*)\}", (SHIM_C / "shim.h").read_text())
    assert m
    c_names = re.findall(r"\"([^\"]*)\"", m.group(1))
    assert dict(enumerate(c_names[1:], 1)) == tape.CHANNELS


def op_table() -> dict[tuple[int, int], str]:
    h = header()
    rows = OP_ROW.findall((SHIM_C / "wrapped.def").read_text())
    table = {(int(h[ch]), int(h[op])): name for ch, op, name in rows}
    assert len(table) == len(rows), "two OP rows for one (channel, op)"
    return table


def test_every_op_has_one_name_and_python_agrees() -> None:
    h = header()
    table = op_table()
    named = {op for _ch, op, _name in OP_ROW.findall((SHIM_C / "wrapped.def").read_text())}
    assert named == {k for k in h if k.startswith("OP_")}, "an OP_ define without an OP row"
    assert table == tape.OP_NAMES


def test_symbol_rows_match_the_exports() -> None:
    """Every symbol the shim exports is one row of wrapped.def, and no row goes unexported."""
    rows = SYM_ROW.findall((SHIM_C / "wrapped.def").read_text())
    assert len(rows) > 60
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    out = subprocess.run([nm, "-D", "--defined-only", shim.shim_path()], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    hooks = {"steno_pause", "steno_resume", "steno_getenv", "steno_reentries",
             "steno_tape_put", "steno_tape_get", "steno_gate_next", "steno_wait_fds",
             "steno_tape_ended", "steno_go_live", "steno_is_live", "steno_park_live",
             "steno_paused_seeds", "steno_tree_peer"}
    assert exported - hooks == {name for _kind, name in rows}


@pytest.mark.parametrize("other", [999, shim.PROTOCOL - 1])
def test_replay_refuses_a_recording_of_another_shim_protocol(tmp_path: Path,
                                                             other: int) -> None:
    """Records are read by layout: another protocol's tape would be misserved, not refused.
    An unknown protocol and an older one this shim reads alike: an exact replay and a fork
    stop before anything is prepared, in one line naming both protocols and the ways on;
    a build replay reads it."""
    from stenograph.recorder.trajfile import read_trajectory, write_trajectory

    cli = [sys.executable, "-m", "stenograph"]
    rec = tmp_path / "echo.steno"
    p = subprocess.run([*cli, "record", "--workspace", "none", "-o", str(rec), "--", "echo",
                        "hi"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    tf = read_trajectory(rec)
    events = []
    for ev in tf.events:
        if ev.kind == "RunStarted":
            assert str(ev.body["shim"]).split("/")[0] == str(shim.PROTOCOL)
            ev = dataclasses.replace(ev, body={**ev.body, "shim": f"{other}/0123456789abcdef",
                                               "stenograph": "0.0.9"})
        events.append(ev)
    old = tmp_path / "old.steno"
    write_trajectory(old, tf.traj, events)
    tape_dir = tmp_path / "tape"
    p = subprocess.run([*cli, "replay", "--keep-tape", str(tape_dir), str(old)],
                       capture_output=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.decode().strip().splitlines()
    assert lines == [
        f"stenograph: error: recorded with shim protocol {other}; this stenograph speaks "
        f"{shim.PROTOCOL} and replays only protocol {shim.PROTOCOL} bit for bit: "
        f"`stenograph replay --build {old}` judges it against this build, or the "
        f"stenograph release that recorded it (stenograph 0.0.9, shim "
        f"{other}/0123456789abcdef) replays it exactly ({old})"], lines
    assert not p.stdout
    assert not tape_dir.exists(), "nothing may be prepared for a refused replay"
    f = subprocess.run([*cli, "fork", str(old), "--at", "1", "-o", str(tmp_path / "f.steno"),
                        "--model-url", "http://127.0.0.1:9/v1"],
                       capture_output=True, text=True, timeout=60)
    assert f.returncode == 2 and len(f.stderr.strip().splitlines()) == 1, f.stderr
    assert f"recorded with shim protocol {other}; " in f.stderr
    assert "--build" not in f.stderr and not (tmp_path / "f.steno").exists()
    b = subprocess.run([*cli, "replay", "--build", str(old)], capture_output=True, text=True,
                       timeout=60)
    assert b.returncode == 0, b.stderr
    assert f"recorded with shim protocol {other}" in b.stderr  # (a note)
    p = subprocess.run([*cli, "replay", str(rec)], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_the_programs_run_with_a_normalizing_flag_are_the_same_in_c_and_python() -> None:
    """``NORMALIZE`` in shim_c/proc.c (every exec in the tree) and its mirror in
    ``runner/shim.py`` (the command stenograph starts) list the same programs and flags;
    the flag goes right after the program, once, and not for an older protocol's tape."""
    rows = re.findall(r'\{"(\w+)", "([^"]+)"\}', (SHIM_C / "proc.c").read_text())
    assert rows and dict(rows) == shim.NORMALIZE
    assert shim.normalized(["/usr/bin/node", "a.js"], None) == [
        "/usr/bin/node", "--single-threaded", "a.js"]
    assert shim.normalized(["node", "--single-threaded", "a.js"], None) == [
        "node", "--single-threaded", "a.js"]
    assert shim.normalized(["node", "a.js"], 5) == ["node", "a.js"]
    assert shim.normalized(["python3", "a.py"], None) == ["python3", "a.py"]
