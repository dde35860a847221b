"""A user's hook settings (``STENO_MODEL_URLS``, ``STENO_READONLY_URLS``,
``STENO_EFFECT_URLS``, ``STENO_REDACT_*``) are part of the recording: they decide which
calls are model calls and which are effects, so a replay, a resume or a fork started in
another shell, without them, must still see the calls as the recording did.

Real programs (requests) against the loopback effect service and a counting server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from crashes import Run, go, service

from stenograph.recorder.reader import StoreReader
from stenograph.recorder.trajfile import read_trajectory
from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
SERVERS = """
import requests, sys
base = sys.argv[1]
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.status_code, r.json()["id"])
"""
LOOKUP_THEN_SERVERS = """
import requests, sys
base = sys.argv[1]
print("probe", requests.get(base + "/servers", params={"name": "web1"}).json())
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.status_code, r.json()["id"])
"""
GENERATE = """
import requests, sys
r = requests.post(sys.argv[1] + "/v9/generate", json={"prompt": "hi"})
print(r.status_code, r.text)
"""


def _env(**user: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    env.update(user)
    return env


def _kinds(steno: Path) -> list[str]:
    return [ev.kind for ev in read_trajectory(steno).events]


def _channels(steno: Path) -> list[str]:
    return [str(ev.body.get("channel")) for ev in read_trajectory(steno).events
            if ev.kind == "Exchange"]


def test_a_read_only_setting_holds_at_replay_in_a_shell_without_it(tmp_path: Path) -> None:
    prog = tmp_path / "servers.py"
    prog.write_text(SERVERS)
    out = tmp_path / "ro.steno"
    with EffectService() as svc:
        rec = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable,
                              str(prog), svc.url], cwd=tmp_path, capture_output=True,
                             text=True, env=_env(STENO_READONLY_URLS="/servers$"),
                             timeout=120)
        assert rec.returncode == 0, rec.stderr
        assert svc.stats()["servers"] == 1
    assert "ToolIntent" not in _kinds(out), "the setting made POST /servers read-only"
    with EffectService() as svc2:
        rep = subprocess.run([*CLI, "replay", str(out)], cwd=tmp_path, capture_output=True,
                             text=True, env=_env(), timeout=120)
        assert rep.returncode == 0, rep.stderr
        assert svc2.stats()["requests"] == 0
    assert rep.stdout == rec.stdout


def test_model_url_patterns_hold_at_replay_in_a_shell_without_them(
        tmp_path: Path, counting_server: str) -> None:
    prog = tmp_path / "gen.py"
    prog.write_text(GENERATE)
    out = tmp_path / "m.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable, str(prog),
                          counting_server], cwd=tmp_path, capture_output=True, text=True,
                         env=_env(STENO_MODEL_URLS="/v9/generate$"), timeout=120)
    assert rec.returncode == 0, rec.stderr
    chans = _channels(out)
    assert chans == ["model"], chans
    rep = subprocess.run([*CLI, "replay", str(out)], cwd=tmp_path, capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout


def test_a_resume_in_a_shell_without_the_setting_keeps_it(tmp_path: Path) -> None:
    """Killed as its first read arrives; resumed without the setting, the POST it then
    makes live is still read-only: no intent, no idempotency key of ours."""
    prog = tmp_path / "lookup.py"
    prog.write_text(LOOKUP_THEN_SERVERS)
    store = tmp_path / "store"
    current = [Run(kill=("read", 1))]
    with service(current) as svc:
        rec = go(current[0], [*CLI, "record", "--store", str(store), "--traj", "t", "--",
                              sys.executable, str(prog), svc.url], tmp_path,
                 _env(STENO_READONLY_URLS="/servers$"))
        assert current[0].killed.is_set(), rec.stderr
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*CLI, "resume", str(store), "t"], tmp_path, _env())
        assert res.returncode == 0, res.stderr
        assert svc.stats()["servers"] == 1
    kinds = [ev.kind for ev in StoreReader(store).events(traj="t")]
    assert "RunEnded" in kinds
    assert "ToolIntent" not in kinds, "the resumed POST /servers was taken for an effect"
