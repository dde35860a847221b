"""Replays run sealed: a private mount namespace where /tmp, /var/tmp and $TMPDIR are
overlays with every name the recorded run created there hidden, so exclusive creations
(mkdtemp, mktemp -d, O_CREAT|O_EXCL) of the names the tape draws succeed as they did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import steno_cli

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]


def _record(tmp: Path, argv: list[str], name: str) -> tuple[Path, bytes]:
    out = tmp / f"{name}.steno"
    return out, steno_cli.record(out, argv, tmp).stdout

def _replay(tmp: Path, steno: Path, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    p = subprocess.run([*CLI, "replay", str(steno), "--json", *extra], cwd=tmp,
                       capture_output=True, timeout=120)
    assert p.stdout, p.stderr.decode(errors="replace")
    return json.loads(p.stdout.decode().splitlines()[-1]), p


def _identical(rep: dict) -> bool:
    return not rep["divergences"] and all(rep["identical"].values())


RECORDINGS, REPLAYS = (1, 2) if not os.environ.get("STENO_SOAK") else (2, 3)
"""make test: one recording, two sealed replays; make soak: two of three."""


def test_mktemp_d_and_mktemp_replay_the_recorded_names(tmp_path: Path) -> None:
    cmd = ["bash", "-c", "mktemp -d; mktemp; mktemp -d --tmpdir=/var/tmp; mktemp -u"]
    for r in range(RECORDINGS):
        steno, out = _record(tmp_path, cmd, f"mktemp{r}")
        names = out.decode().split()
        assert os.path.isdir(names[0]) and os.path.isfile(names[1])  # left behind
        for _ in range(REPLAYS):
            rep, _p = _replay(tmp_path, steno)
            assert _identical(rep), rep
        # the replays wrote into their private overlays: nothing new in the real /tmp
        assert not os.path.exists(names[3])
        # unsealed, the names the recording left behind are taken: another one is drawn
        rep, _p = _replay(tmp_path, steno, "--unsealed")
        assert rep["divergences"] or not all(rep["identical"].values())


TEMPFILES = r"""
import os, tempfile
d = tempfile.mkdtemp(); print(d)
f = tempfile.NamedTemporaryFile(delete=False); f.write(b"x"); f.close(); print(f.name)
fd, p = tempfile.mkstemp(suffix=".txt"); print(p)
print(sorted(os.listdir(d)))
with open(os.path.join(os.environ["OUT_DIR"], "result.txt"), "a") as out:
    out.write("written\n")
"""


def test_python_tempfile_names_and_output_files_outside_tmp(tmp_path: Path) -> None:
    prog = tmp_path / "tempfiles.py"
    prog.write_text(TEMPFILES)
    outdir = Path.home() / f".steno-test-out-{os.getpid()}"  # not under a sealed root
    outdir.mkdir(exist_ok=True)
    result = outdir / "result.txt"
    result.unlink(missing_ok=True)
    env = dict(os.environ, OUT_DIR=str(outdir))
    steno = tmp_path / "tf.steno"
    p = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(prog)], cwd=tmp_path,
                       capture_output=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    try:
        for _ in range(3):
            rep, _p = _replay(tmp_path, steno)
            assert _identical(rep), rep
        # a file the program writes outside the temporary directories is real, as before
        assert result.read_text() == "written\n" * 4
    finally:
        result.unlink(missing_ok=True)
        outdir.rmdir()


def test_the_script_and_its_data_under_tmp_stay_visible(tmp_path: Path) -> None:
    """The overlay's lower layer is the live /tmp: what existed before the recording
    (the program, its inputs, the working directory) is there at replay."""
    (tmp_path / "data.txt").write_text("input\n")
    prog = tmp_path / "reads.py"
    prog.write_text("print(open('data.txt').read().strip())\n")
    steno, out = _record(tmp_path, [PY, str(prog)], "reads")
    assert out == b"input\n"
    rep, _p = _replay(tmp_path, steno)
    assert _identical(rep), rep



def test_plain_mktemp_d(tmp_path: Path) -> None:
    """gnulib's tempname seeds the first name with the address of a local: the stack
    starts where it did when recorded only because the STENO_* variables are padded to
    one count and one size (launch.pad_steno_env)."""
    for r in range(3):
        steno, _out = _record(tmp_path, ["mktemp", "-d"], f"plain{r}")
        for _ in range(3):
            rep, _p = _replay(tmp_path, steno)
            assert _identical(rep), rep
