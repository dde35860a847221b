"""stenograph.model / stenograph.tool: recorded and replayed in real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.exchanges import ExchangeServer, prepare_py_tape
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.runner.pyenv import hook_env

PROGRAM = textwrap.dedent("""
    import asyncio, os, sys
    import stenograph

    LOG = sys.argv[1]
    def side_effect(tag):
        with open(LOG, "a") as f:
            f.write(tag + "\\n")

    @stenograph.tool
    def lookup(key, *, upper=False):
        side_effect("lookup " + key)
        value = key * 3 + ":" + os.environ.get("SECRET_SAUCE", "none")
        return {"value": value.upper() if upper else value, "blob": b"x" * 40000}

    @stenograph.tool(name="fails")
    def fails(n):
        side_effect("fails")
        raise ValueError(f"bad n {n}")

    @stenograph.model
    async def chat(prompt):
        side_effect("chat")
        return {"text": f"reply to {prompt} from {os.environ.get('SECRET_SAUCE')}"}

    r = lookup(sys.argv[2], upper=True)
    print(r["value"], len(r["blob"]))
    try:
        fails(3)
    except ValueError as e:
        print("ValueError", e)
    print(asyncio.run(chat(sys.argv[2]))["text"])
""")


def _run(tmp: Path, env: dict[str, str], key: str) -> subprocess.CompletedProcess[str]:
    prog = tmp / "prog.py"
    prog.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(prog), str(tmp / "effects.log"), key], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture()
def recorded(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    store_dir = tmp_path / "store"
    with Store(store_dir) as st:
        srv = ExchangeServer(st, "run", tmp_path / "x.sock")
        env = hook_env("record", sock=str(tmp_path / "x.sock"), store=str(store_dir))
        env["SECRET_SAUCE"] = "live"
        try:
            res = _run(tmp_path, env, "ab")
        finally:
            srv.close()
    assert res.returncode == 0, res.stderr
    return store_dir, res


def _replay(tmp: Path, store_dir: Path, key: str) -> subprocess.CompletedProcess[str]:
    prepare_py_tape(StoreReader(store_dir).events(traj="run"), tmp / "tape",
                    BlobStore(store_dir / "blobs"))
    env = hook_env("replay", tape=str(tmp / "tape"))
    env["SECRET_SAUCE"] = "replay-env"
    return _run(tmp, env, key)


def test_calls_are_recorded_with_ids(recorded: tuple[Path, subprocess.CompletedProcess[str]]
                                     ) -> None:
    store_dir, res = recorded
    assert res.stdout.splitlines() == [
        "ABABAB:LIVE 40000", "ValueError bad n 3", "reply to ab from live"]
    evs = [e.body for e in StoreReader(store_dir).events(traj="run") if e.kind == "Exchange"]
    assert [(e["channel"], e["call_id"]) for e in evs] == [
        ("tool", "lookup#0"), ("tool", "fails#1"), ("model", "chat#0")]
    assert evs[1]["error"]["type"] == "ValueError"
    assert "$blob" in evs[0]["result"]["blob"]  # large bytes went to the blob store


def test_replay_returns_results_without_calling(
        tmp_path: Path, recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    store_dir, res = recorded
    effects = (tmp_path / "effects.log").read_text()
    rep = _replay(tmp_path, store_dir, "ab")
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == res.stdout  # recorded results, not the replay environment's
    assert (tmp_path / "effects.log").read_text() == effects  # no function ran


def test_changed_arguments_diverge(
        tmp_path: Path, recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    store_dir, _ = recorded
    rep = _replay(tmp_path, store_dir, "zz")
    assert rep.returncode == 86
    assert "tool call #0" in rep.stderr and '"zz"' in rep.stderr


def test_outside_the_tape_calls_go_straight_through(tmp_path: Path) -> None:
    res = _run(tmp_path, {k: v for k, v in hook_env("record").items()
                          if not k.startswith("STENO_MODE")}, "q")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "effects.log").read_text().split() == [
        "lookup", "q", "fails", "chat"]
