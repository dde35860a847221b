"""Time-based UUIDs replay: libuuid's interface probe and clock state, Python's own uuid1.

libuuid's uuid_generate_time_safe takes its node from socket(AF_INET, SOCK_DGRAM) +
ioctl(SIOCGIFCONF / SIOCGIFHWADDR) -- taped as host identity (shim_c/netif.c), and no
longer refused at replay (only what reaches the network is) -- and keeps its clock
sequence in /var/lib/libuuid/clock.txt, which the recorded run rewrites: the sealed
replay gets the directory back as it was when the recording started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import steno_cli

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]


def _record(tmp: Path, argv: list[str], name: str) -> tuple[Path, bytes]:
    out = tmp / f"{name}.steno"
    return out, steno_cli.record(out, argv, tmp).stdout

def _replay(tmp: Path, steno: Path, *extra: str) -> dict:
    return steno_cli.replay_json(steno, tmp, *extra)[1]

def _replays_identically(tmp: Path, argv: list[str], name: str) -> list[bytes]:
    outs = []
    for r in range(3):
        steno, out = _record(tmp, argv, f"{name}{r}")
        outs.append(out)
        for _ in range(3):
            rep = _replay(tmp, steno)
            assert not rep["divergences"], rep["divergences"]
            assert all(rep["identical"].values()), rep
    return outs


def _has_libuuid() -> bool:
    p = subprocess.run([PY, "-c", "import uuid; print(uuid._generate_time_safe is not None)"],
                       capture_output=True, text=True)
    return p.stdout.strip() == "True"


@pytest.mark.skipif(not _has_libuuid(), reason="Python's uuid does not use libuuid here")
def test_uuid1_through_libuuid(tmp_path: Path) -> None:
    outs = _replays_identically(
        tmp_path, [PY, "-c", "import uuid; print(uuid.uuid1()); print(uuid.uuid1())"], "lib")
    assert len(set(outs)) == 3  # three recordings, three different uuids


@pytest.mark.skipif(not _has_libuuid() or os.geteuid() != 0, reason="needs libuuid and root")
def test_libuuid_clock_state_is_put_back_as_it_was(tmp_path: Path) -> None:
    state = Path("/var/lib/libuuid")
    made = not state.exists()
    state.mkdir(parents=True, exist_ok=True)
    try:
        steno, _out = _record(tmp_path, [PY, "-c", "import uuid; print(uuid.uuid1())"], "st")
        for _ in range(3):
            rep = _replay(tmp_path, steno)
            assert not rep["divergences"] and all(rep["identical"].values()), rep
        # against the state the recording left, libuuid takes another path
        rep = _replay(tmp_path, steno, "--unsealed")
        assert rep["divergences"] or not all(rep["identical"].values())
    finally:
        if made:
            shutil.rmtree(state, ignore_errors=True)


def test_uuid1_through_pythons_own_implementation(tmp_path: Path) -> None:
    prog = ("import uuid\nuuid._generate_time_safe = None\n"
            "print(uuid.uuid1(node=0x0123456789ab))\nprint(uuid.uuid1(node=0x0123456789ab))\n")
    _replays_identically(tmp_path, [PY, "-c", prog], "py")


@pytest.mark.skipif(shutil.which("uuidgen") is None, reason="no uuidgen (util-linux)")
def test_uuidgen_t(tmp_path: Path) -> None:
    _replays_identically(tmp_path, ["uuidgen", "-t"], "gen")
