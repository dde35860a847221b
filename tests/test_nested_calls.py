"""Hooked calls made inside another hooked call's body are numbered in its scope.

A replay (or a resume, a fork) serves a ``stenograph.tool`` / ``stenograph.model`` call
without running its body, so whatever the body called never happens there. Those calls
must not take positions in the process's own streams, or every later call is numbered
one off (a resume then diverged, or -- worse -- sent a payment with another payment's
idempotency key). Real programs under the real shim: HTTP inside a tool, a model function
inside a tool, a tool inside a tool, two async tools overlapping, a tool whose body
crashed half way and is run again by a resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from stenograph.recorder.trajfile import read_trajectory
from stenograph.testing.effect_service import Drop, EffectService

CLI = [sys.executable, "-m", "stenograph"]

SYNC = """
import sys, requests, stenograph
base = sys.argv[1]

@stenograph.model
def think(q):
    return requests.get(base + "/servers", params={"name": q}).json()

@stenograph.tool
def inner(name):
    return requests.get(base + "/servers", params={"name": name}).json()["servers"]

@stenograph.tool(effect=True, probe=lambda name: None)
def provision(name):
    seen = inner(name)                       # a tool inside a tool
    plan = think("plan " + name)             # a model function inside a tool
    made = requests.post(base + "/servers", json={"name": name}).json()
    return {"seen": len(seen), "plan": len(plan["servers"]), "id": made["id"]}

for i in range(3):
    r = requests.post(base + "/payments", json={"amount": i, "to": "a"})
    print("pay", i, r.json()["id"])
    if i == 1:
        print("provision", provision("web1"))
print("after", requests.get(base + "/servers", params={"name": "web1"}).json())
"""

ASYNC = """
import asyncio, sys, httpx, stenograph
base = sys.argv[1]

@stenograph.tool
async def look(name):
    async with httpx.AsyncClient() as c:
        a = (await c.get(base + "/servers", params={"name": name})).json()
        b = (await c.get(base + "/servers", params={"name": name + "x"})).json()
    return [len(a["servers"]), len(b["servers"])]

async def main():
    async with httpx.AsyncClient() as c:
        got = await asyncio.gather(look("a"), look("b"),
                                   c.post(base + "/payments", json={"amount": 1, "to": "z"}))
        print(got[0], got[1], got[2].json()["id"])
        print((await c.post(base + "/payments", json={"amount": 2, "to": "z"})).json()["id"])

asyncio.run(main())
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _record(tmp: Path, src: str, svc: EffectService, name: str = "t"
            ) -> subprocess.CompletedProcess[str]:
    prog = tmp / f"{name}.py"
    prog.write_text(src)
    return subprocess.run([*CLI, "record", "--workspace", "none", "--store",
                           str(tmp / f"{name}.store"), "--traj", "t", "-o",
                           str(tmp / f"{name}.steno"), "--", sys.executable, str(prog),
                           svc.url], capture_output=True, text=True, env=_env(), cwd=tmp,
                          timeout=120)


def _streams(steno: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for ev in read_trajectory(steno).events:
        if ev.kind == "Exchange":
            out.setdefault(str(ev.body["channel"]), []).append(int(ev.body["pos"]))
    return {k: sorted(v) for k, v in out.items()}


def test_calls_inside_a_body_are_numbered_under_it_and_the_replay_matches(
        tmp_path: Path) -> None:
    with EffectService() as svc:
        rec = _record(tmp_path, SYNC, svc)
        assert rec.returncode == 0, rec.stderr
        made = svc.stats()
    streams = _streams(tmp_path / "t.steno")
    # the program's own calls: three payments and the last GET, numbered with no gap
    assert streams["http"] == [0, 1, 2, 3], streams
    assert streams["tool"] == [0]
    # the body's own: a tool, a model function, the POST; the inner tool's GET under it
    assert streams["tool/0/tool"] == [0] and streams["tool/0/model"] == [0]
    assert streams["tool/0/http"] == [0] and streams["tool/0/tool/0/http"] == [0]
    assert streams["tool/0/model/0/http"] == [0], streams
    for _ in range(2):  # served whole: nothing sent, every later call where it was
        rp = subprocess.run([*CLI, "replay", str(tmp_path / "t.steno")], capture_output=True,
                            text=True, env=_env(), timeout=120)
        assert rp.returncode == 0, rp.stderr
        assert "bit-identical" in rp.stderr
    assert made["payments"] == 3 and made["servers"] == 1


def test_overlapping_async_tools_keep_their_calls_to_themselves(tmp_path: Path) -> None:
    with EffectService() as svc:
        rec = _record(tmp_path, ASYNC, svc)
        assert rec.returncode == 0, rec.stderr
    streams = _streams(tmp_path / "t.steno")
    assert streams["tool"] == [0, 1], streams
    assert streams["tool/0/http"] == [0, 1] and streams["tool/1/http"] == [0, 1], streams
    assert streams["http"] == [0, 1], streams
    for _ in range(3):
        rp = subprocess.run([*CLI, "replay", str(tmp_path / "t.steno")], capture_output=True,
                            text=True, env=_env(), timeout=120)
        assert rp.returncode == 0, rp.stderr


CLOSED_BY_WITH = """
import asyncio, datetime, sys, httpx
async def main():
    async with httpx.AsyncClient() as c:
        r = await c.get(sys.argv[1] + "/servers", params={"name": "x"})
    print(datetime.datetime.now().year, r.json())
asyncio.run(main())
"""


def test_a_client_closed_by_async_with_replays(tmp_path: Path) -> None:
    """``async with httpx.AsyncClient()`` closes its pool through the transport's
    ``__aexit__``, not ``aclose``: the close's waits were not on the tape, and the next
    clock read came one loop iteration early at replay."""
    with EffectService() as svc:
        rec = _record(tmp_path, CLOSED_BY_WITH, svc)
        assert rec.returncode == 0, rec.stderr
    for _ in range(2):
        rp = subprocess.run([*CLI, "replay", str(tmp_path / "t.steno")], capture_output=True,
                            text=True, env=_env(), timeout=120)
        assert rp.returncode == 0, rp.stderr


PARTIAL = """
import sys, requests, stenograph
base = sys.argv[1]

@stenograph.tool
def settle_invoice(n):
    a = requests.post(base + "/payments", json={"amount": n, "to": "first"}).json()
    b = requests.post(base + "/payments", json={"amount": n, "to": "second"}).json()
    return [a["id"], b["id"]]

print("before", requests.post(base + "/payments", json={"amount": 0, "to": "x"}).json()["id"])
print("invoice", settle_invoice(7))
print("after", requests.post(base + "/payments", json={"amount": 9, "to": "y"}).json()["id"])
"""


def test_a_tool_crashed_half_way_is_run_again_without_repeating_its_first_half(
        tmp_path: Path) -> None:
    """A plain tool whose body makes two payments, the run killed as the second one
    arrives: the first is settled (its own intent and result), the second in doubt. The
    resume runs the tool again: its first payment is served from the tape (not sent), its
    second is sent again with its recorded key, and every call after it keeps its
    number: each payment is made once, and the finished run replays as one tape."""
    prog = tmp_path / "p.py"
    prog.write_text(PARTIAL)
    store = tmp_path / "s"
    posts = [0]
    proc: list[subprocess.Popen[str]] = []

    def on_effect(path: str, headers: dict[str, str]) -> None:
        posts[0] += 1
        if posts[0] == 3 and proc:
            os.killpg(proc[0].pid, signal.SIGKILL)
            raise Drop()

    with EffectService() as svc:
        svc.on_effect = on_effect
        proc.append(subprocess.Popen(
            [*CLI, "record", "--workspace", "none", "--store", str(store), "--traj", "t",
             "-o", str(tmp_path / "t.steno"), "--", sys.executable, str(prog), svc.url],
            cwd=tmp_path, env=_env(), start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
        proc[0].communicate(timeout=120)
        assert posts[0] == 3
        proc.clear()
        res = subprocess.run([*CLI, "resume", str(store), "t"], capture_output=True,
                             text=True, env=_env(), cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stderr
        made = Counter((p["amount"], p["to"]) for p in svc.payments)
        assert made == Counter([(0, "x"), (7, "first"), (7, "second"), (9, "y")]), made
        assert svc.stats()["keys_reused"] == []
        assert "invoice ['pay_2', 'pay_3']" in res.stdout, res.stdout
    exported = tmp_path / "all.steno"
    subprocess.run([*CLI, "log", "export", str(store), "t", "-o", str(exported)],
                   check=True, capture_output=True, env=_env())
    rp = subprocess.run([*CLI, "replay", str(exported)], capture_output=True, text=True,
                        env=_env(), timeout=120)
    assert rp.returncode == 0, rp.stderr
