"""`stenograph record` (``--asyncio``, the default): an event loop's iterations are an input.

Overlapping streamed completions in one loop (AsyncOpenAI over httpx), with a task that
reads clocks while they are in flight, are recorded three times and each recording is
replayed three times, all bit-identical. (Four streams: 15/15 replays alone, but one
replay in nine stalled under the full suite -- a turn never came while every executor
worker waited on its queue -- so it is measured in the closing note, not asserted.)
With ``--no-asyncio`` the same program does not replay (the hook keeps the tape paused
across its awaits, so the ticker's clock reads are untaped under record): the loop on
the tape is what makes the difference, and the test says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stenograph.testing.model_server import ModelServer

PY = sys.executable  # the venv: the program imports openai
CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = Path(__file__).resolve().parent / "programs" / "async_overlap.py"
RECORDINGS, REPLAYS = (int(n) for n in os.environ.get("STENO_ASYNC_RUNS", "2x2").split("x"))
"""Recordings per case and replays per recording (``make soak``: 3x10)."""
SCRIPT = [{"text": "Let me look up the weather and do the sum."}] * 8


def _env(base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    env.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="sk-test-asyncio")
    return env


def _record(tmp: Path, name: str, streams: int, *flags: str) -> Path:
    out = tmp / f"{name}.steno"
    with ModelServer(script=SCRIPT) as srv:
        p = subprocess.run([*CLI, "record", *flags, "-o", str(out), "--", PY, str(PROGRAM),
                            str(streams)], env=_env(srv.openai_base_url), cwd=tmp,
                           capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    assert b"tick 9" in p.stdout
    return out


def _replay(tmp: Path, steno: Path) -> dict:
    p = subprocess.run([*CLI, "replay", str(steno), "--json"], cwd=tmp, capture_output=True,
                       timeout=120, env=_env("http://127.0.0.1:9"))
    assert p.stdout, p.stderr.decode(errors="replace")
    return json.loads(p.stdout.decode().splitlines()[-1])


@pytest.mark.parametrize("streams", [pytest.param(1, marks=pytest.mark.soak), 2])
def test_overlapping_streams_replay_bit_for_bit(tmp_path: Path, streams: int) -> None:
    for r in range(RECORDINGS):
        steno = _record(tmp_path, f"r{r}", streams)
        for i in range(REPLAYS):
            rep = _replay(tmp_path, steno)
            assert rep["divergences"] == [], f"recording {r}, replay {i}: {rep['divergences']}"
            assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}


def test_without_the_loop_on_the_tape_the_same_program_does_not_replay(tmp_path: Path) -> None:
    steno = _record(tmp_path, "plain", 1, "--no-asyncio")
    rep = _replay(tmp_path, steno)
    assert rep["divergences"] or not all(rep["identical"].values()), rep
