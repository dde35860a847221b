"""Approvals: a call held for a person pauses the run (exit 5, nothing waiting), the
decision is taken from the CLI, and ``resume`` continues with it -- across as many
pauses as the run has. Real processes, a real store, the loopback effect service."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stenograph.recorder.resumes import states
from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import requests, sys, stenograph
base = sys.argv[1]
print("asking", flush=True)
a = stenograph.approval("deploy web1", "provision web1 in prod", expires=float(sys.argv[2]))
print("approved by", a.by, a.note, flush=True)
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.json()["id"], flush=True)

@stenograph.tool(effect=True, approval=lambda amount, to: f"pay {amount} to {to}")
def pay(amount, to):
    return requests.post(base + "/payments", json={"amount": amount, "to": to}).json()

try:
    print("paid", pay(5, "alice")["id"])
except stenograph.ApprovalDenied as e:
    print("not paid:", e)
print("done")
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=_env(),
                          cwd=cwd, timeout=120)


def _pending(store: Path) -> list[str]:
    (st,) = states(store, "t")
    return [a.call_id for a in st.approvals if a.state == "pending" and not a.used]


def test_held_calls_pause_the_run_until_a_person_decides(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PROGRAM)
    store = tmp_path / "s"
    with EffectService() as svc:
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "-o", str(tmp_path / "t.steno"), "--", sys.executable,
                   str(tmp_path / "p.py"), svc.url, "3600", cwd=tmp_path)
        assert rec.returncode == 5, rec.stderr
        assert rec.stdout == "asking\n"
        line = [ln for ln in rec.stderr.splitlines() if ln.startswith("stenograph: error")]
        assert len(line) == 1 and "waits for approval" in line[0], rec.stderr
        (st,) = states(store, "t")
        assert st.state == "paused"
        (first,) = _pending(store)
        assert svc.stats()["requests"] == 0  # nothing past the held call ran
        # the wrong call, or twice, is refused in one line and changes nothing
        bad = _cli("approve", str(store), "t", "0/approval/9", "--by", "ops")
        assert bad.returncode == 2 and "no approval" in bad.stderr
        ok = _cli("approve", str(store), "t", first, "--by", "ops", "--note", "go")
        assert ok.returncode == 0, ok.stderr
        again = _cli("approve", str(store), "t", first, "--by", "ops")
        assert again.returncode == 2 and "already approved" in again.stderr

        res = _cli("resume", str(store), "t", cwd=tmp_path)  # up to the tool's approval
        assert res.returncode == 5, res.stderr
        assert "approved by ops go" in res.stdout and "server srv_1" in res.stdout
        (second,) = _pending(store)
        assert second != first
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 0
        (st,) = states(store, "t")
        assert st.state == "paused" and st.approvals[1].call == "tool pay"

        no = _cli("deny", str(store), "t", second, "--by", "cfo", "--note", "over budget")
        assert no.returncode == 0, no.stderr
        res = _cli("resume", str(store), "t", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "not paid: tool pay: denied by cfo: over budget" in res.stdout
        assert res.stdout.endswith("done\n")
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 0
        (st,) = states(store, "t")
        assert st.state == "ended"
    exp = _cli("log", "export", str(store), "t", "-o", str(tmp_path / "all.steno"))
    assert exp.returncode == 0, exp.stderr
    rep = _cli("replay", str(tmp_path / "all.steno"), cwd=tmp_path)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr


def test_an_expired_approval_is_a_denial(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PROGRAM.replace('print("approved by"', 'print("ok"'))
    store = tmp_path / "s"
    with EffectService() as svc:
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "-o", str(tmp_path / "t.steno"), "--", sys.executable,
                   str(tmp_path / "p.py"), svc.url, "0.5", cwd=tmp_path)
        assert rec.returncode == 5, rec.stderr
        time.sleep(1.0)
        (call,) = _pending(store)
        assert _cli("approve", str(store), "t", call, "--by", "late").returncode == 0
        res = _cli("resume", str(store), "t", cwd=tmp_path)
        assert res.returncode == 1, res.stderr  # the program's own traceback: denied
        assert "ApprovalDenied: deploy web1: approved after it expired by late" in res.stderr
        assert svc.stats()["requests"] == 0


def test_an_approval_whose_precondition_no_longer_holds_is_a_denial(tmp_path: Path) -> None:
    """Approved while the world was as the person saw it; by the resume it is not (the
    server it was to replace is already there): the program is denied."""
    (tmp_path / "p.py").write_text("""
import requests, sys, stenograph
base = sys.argv[1]
def free():
    return not requests.get(base + "/servers", params={"name": "web1"}).json()["servers"]
try:
    stenograph.approval("create web1", "web1 does not exist yet", precondition=free)
    print("created", requests.post(base + "/servers", json={"name": "web1"}).json()["id"])
except stenograph.ApprovalDenied as e:
    print("denied:", e)
""")
    store = tmp_path / "s"
    with EffectService() as svc:
        rec = _cli("record", "--store", str(store), "--traj", "t", "--workspace", "none",
                   "-o", str(tmp_path / "t.steno"), "--", sys.executable,
                   str(tmp_path / "p.py"), svc.url, cwd=tmp_path)
        assert rec.returncode == 5, rec.stderr
        (call,) = _pending(store)
        assert _cli("approve", str(store), "t", call, "--by", "ops").returncode == 0
        svc.provision({"name": "web1"})  # someone else made it meanwhile
        res = _cli("resume", str(store), "t", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "denied: create web1: its precondition no longer holds" in res.stdout
        assert svc.stats()["servers"] == 1
