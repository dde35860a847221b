"""Crash and resume: the whole process group -- recorder and program -- is killed with
SIGKILL at every boundary of the effect sequence and at random moments, then
``stenograph resume`` is run (and killed again, sometimes) until the run ends.

The effect service is the ground truth: after every trial each intended payment was
made exactly once, no effect settled before a resume was sent again by it, and before
each resume ``stenograph status`` listed every payment the service made (settled or in
doubt, never missing) and called settled only what the service did. The program is a
plain ``requests`` script; nothing in it knows about stenograph.

``STENO_CRASH_TRIALS`` sets the number of trials (``make soak`` runs more).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from crashes import Run, go, service

from stenograph.recorder.errors import BadInput
from stenograph.recorder.resumes import states
from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
PAYMENTS = 3
PROGRAM = f"""
import requests, sys, time
base = sys.argv[1]
t0 = time.monotonic()
for i in range({PAYMENTS}):
    r = requests.post(base + "/payments", json={{"amount": i, "to": "p"}})
    print("pay", i, r.status_code, r.json()["id"], flush=True)
    print("seen", requests.get(base + "/servers", params={{"name": "x"}}).json()["servers"],
          flush=True)
print("done", time.monotonic() >= t0)
"""
TRIALS = int(os.environ.get("STENO_CRASH_TRIALS", "6"))
WORKERS = int(os.environ.get("STENO_CRASH_WORKERS", "3"))
"""Trials at a time. They wait on sockets and syncs about as much as they compute: on two
cores three at a time go fastest (40 trials: 25.2 s at two, 20.5 at three, 19.4 at four)."""

# where a run is killed: the n-th POST (1-based, counted per run) as it arrives (its
# intent durable, the effect not applied), once applied but before its answer, or the
# n-th GET as it arrives (after the result of the POST before it); or after a delay
BOUNDARIES = [(kind, n) for n in range(1, PAYMENTS + 1)
              for kind in ("dispatch", "applied", "read")]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _go(run: Run, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return go(run, argv, cwd, _env(), timeout=120)


def _status(store: Path) -> dict[str, Any] | None:
    """What ``stenograph status --json`` prints for the trajectory (the same function,
    called in this process: a CLI start per check would double the test's time); None
    if the store does not have it (killed before its first event was durable)."""
    try:
        (st,) = states(store, "t")
    except BadInput:
        return None
    return st.to_json()


def trial(tmp: Path, kills: list[tuple[str, Any] | None]) -> dict[str, Any]:
    """Record the program killed at ``kills[0]``, resume killed at ``kills[1]``... and
    resume unkilled until the run ends; check the ground truth at every step."""
    tmp.mkdir(parents=True, exist_ok=True)
    prog = tmp / "pay.py"
    prog.write_text(PROGRAM)
    store = tmp / "store"
    runs: list[Run] = []
    current: list[Run] = [Run(None)]
    with service(current) as svc:
        for i in range(len(kills) + 8):
            run = Run(kills[i] if i < len(kills) else None)
            st = _status(store) if i else None
            if st is None:  # nothing durable yet: nothing was sent, record again
                assert not svc.applied()
                assert not runs or not runs[-1].posts
                argv = [*CLI, "record", "--store", str(store), "--traj", "t",
                        "--workspace", "none", "-o", str(tmp / "t.steno"), "--",
                        sys.executable, str(prog), svc.url]
            else:
                if st["state"] == "ended":
                    break
                applied = svc.applied()
                listed = {e["idempotency_key"]: e["state"] for e in st["effects"]}
                missing = applied - set(listed)
                assert not missing, f"the service made payments status does not list: {missing}"
                wrong = {k for k, s in listed.items() if s == "settled" and k not in applied}
                assert not wrong, f"status says settled what the service never did: {wrong}"
                settled_counts = {k: svc.by_key[k] for k, s in listed.items() if s == "settled"}
                argv = [*CLI, "resume", str(store), "t"]
                run.resume = True
            current[0] = run
            runs.append(run)
            done = _go(run, argv, tmp)
            if not run.killed.is_set():
                assert done.returncode == 0, (i, done.stderr[-3000:])
                assert "done True" in done.stdout, done.stdout
            if run.resume:
                resent = {k for k, n in settled_counts.items() if svc.by_key[k] != n}
                assert not resent, f"resume sent settled effects again: {resent}"
        else:
            raise AssertionError(f"not ended after {len(runs)} runs")
        amounts = sorted(p["amount"] for p in svc.payments)
        assert amounts == list(range(PAYMENTS)), f"payments made: {svc.payments}"
        st = _status(store)
        assert st is not None and st["state"] == "ended"
        # one epoch per worker after the first that got as far as its claim (a kill may
        # come before it; a record begun again after one killed before its first event
        # claims the next epoch too)
        assert st["epoch"] <= len(runs) - 1
        assert st["epoch"] >= 1 or not any(r.resume for r in runs)
        assert all(e["state"] == "settled" for e in st["effects"])
        return {"runs": len(runs), "epoch": st["epoch"]}


def _kill_plans(n: int, seed: int = 7) -> list[list[tuple[str, Any] | None]]:
    """Every boundary as the record's kill (then a clean resume), every boundary of the
    record paired with one of the first resume, then random plans (random boundaries or
    random delays, up to two crashes in a row, three in soak) until there are ``n``."""
    rng = random.Random(seed)
    plans: list[list[tuple[str, Any] | None]] = [[b] for b in BOUNDARIES]
    plans += [[a, b] for a in BOUNDARIES for b in BOUNDARIES[:3]]
    while len(plans) < n:
        k = rng.randint(1, 3 if n > 200 else 2)  # three crashes in a row: soak
        plans.append([rng.choice(BOUNDARIES) if rng.random() < 0.6
                      else ("timer", round(rng.uniform(0.05, 0.5), 3)) for _ in range(k)])
    return plans[:n]


def test_crash_anywhere_then_resume_until_done_every_effect_exactly_once(
        tmp_path: Path) -> None:
    plans = _kill_plans(TRIALS)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:  # each trial: its own service
        results = list(pool.map(lambda ip: trial(tmp_path / f"t{ip[0]}", ip[1]),
                                enumerate(plans)))
    assert len(results) == len(plans) >= min(TRIALS, 1)
    resumes = sum(r["runs"] - 1 for r in results)
    print(f"{len(plans)} trials, {resumes} resumes, {time.monotonic() - t0:.1f} s")


def test_resume_of_an_ended_run_says_so_and_runs_nothing(tmp_path: Path) -> None:
    prog = tmp_path / "pay.py"
    prog.write_text(PROGRAM)
    with EffectService() as svc:
        rec = subprocess.run([*CLI, "record", "--store", str(tmp_path / "s"), "--traj", "t",
                              "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--",
                              sys.executable, str(prog), svc.url], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert rec.returncode == 0, rec.stderr
        before = svc.stats()["requests"]
        again = subprocess.run([*CLI, "resume", str(tmp_path / "s"), "t"], env=_env(),
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert "already ended" in again.stderr
        assert svc.stats()["requests"] == before


@pytest.mark.parametrize("plan", [[("dispatch", 2)], [("applied", 1), ("read", 1)]])
def test_a_resumed_run_replays_bit_for_bit(tmp_path: Path, plan: list[Any]) -> None:
    """The trajectory a resume finished is one recording: prefix and live part replay
    as one tape, offline."""
    trial(tmp_path, plan)
    exp = subprocess.run([*CLI, "log", "export", str(tmp_path / "store"), "t", "-o",
                          str(tmp_path / "r.steno")], capture_output=True, text=True,
                         env=_env(), timeout=60)
    assert exp.returncode == 0, exp.stderr
    rep = subprocess.run([*CLI, "replay", str(tmp_path / "r.steno")], capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert "bit-identical" in rep.stderr


PROVISION = """
import requests, sys
base = sys.argv[1]
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.status_code, r.json(), flush=True)
print("done", len(requests.get(base + "/servers", params={"name": "web1"}).json()["servers"]))
"""


def _crashed(tmp: Path, program: str, kill: tuple[str, Any]) -> tuple[EffectService, Path,
                                                                       list[Run]]:
    """A service, and a store whose trajectory ``t`` crashed at ``kill``."""
    (tmp / "p.py").write_text(program)
    current = [Run(kill)]
    svc = service(current).start()
    _go(current[0], [*CLI, "record", "--store", str(tmp / "s"), "--traj", "t", "--workspace",
                     "none", "-o", str(tmp / "t.steno"), "--", sys.executable,
                     str(tmp / "p.py"), svc.url], tmp)
    assert current[0].killed.is_set()
    return svc, tmp / "s", current


def _again(current: list[Run], kill: tuple[str, Any] | None, argv: list[str],
           cwd: Path) -> subprocess.CompletedProcess[str]:
    current[0] = Run(kill)
    return _go(current[0], argv, cwd)


def test_in_doubt_at_a_service_that_ignores_keys_waits_for_a_person(tmp_path: Path) -> None:
    """``--escalate`` names the URLs whose services ignore idempotency keys: an effect in
    doubt there stops the resume (exit 4, one line naming the call) until `settle`."""
    svc, store, current = _crashed(tmp_path, PROVISION, ("dispatch", 1))
    try:
        (st,) = states(store, "t")
        assert [e.state for e in st.effects] == ["in-doubt"]
        call = st.effects[0].call_id
        stop = _again(current, None, [*CLI, "resume", str(store), "t", "--escalate",
                                      "/servers$"], tmp_path)
        assert stop.returncode == 4, stop.stderr
        lines = [ln for ln in stop.stderr.splitlines() if ln.startswith("stenograph: error")]
        assert len(lines) == 1 and call in lines[0] and "settle" in lines[0], stop.stderr
        assert svc.stats()["servers"] == 0  # not sent while nobody knows
        again = _again(current, None, [*CLI, "resume", str(store), "t", "--escalate", "/servers$"],
                    tmp_path)
        assert again.returncode == 4  # still waiting
        s = subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "not-done",
                            "--by", "ops"], capture_output=True, text=True, env=_env())
        assert s.returncode == 0, s.stderr
        done = _again(current, None, [*CLI, "resume", str(store), "t", "--escalate", "/servers$"],
                   tmp_path)
        assert done.returncode == 0, done.stderr
        assert "done 1" in done.stdout
        assert svc.stats()["servers"] == 1
        (st,) = states(store, "t")
        assert st.state == "ended"
    finally:
        svc.stop()


def test_settled_as_done_the_program_gets_the_given_result(tmp_path: Path) -> None:
    svc, store, current = _crashed(tmp_path, PROVISION, ("applied", 1))  # made, never answered
    try:
        (st,) = states(store, "t")
        call = st.effects[0].call_id
        (tmp_path / "r.json").write_text(json.dumps({"id": "srv_1", "name": "web1"}))
        s = subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done", "--result",
                            str(tmp_path / "r.json")], capture_output=True, text=True,
                           env=_env())
        assert s.returncode == 0, s.stderr
        done = _again(current, None, [*CLI, "resume", str(store), "t", "--settle-http", "escalate"],
                   tmp_path)
        assert done.returncode == 0, done.stderr
        assert "server 200 {'id': 'srv_1', 'name': 'web1'}" in done.stdout
        assert "done 1" in done.stdout
        assert svc.stats()["servers"] == 1  # the person's word: not sent again
    finally:
        svc.stop()


TOOLS = """
import json, sys, urllib.request
import requests
import stenograph
base = sys.argv[1]

def servers(name):
    return requests.get(base + "/servers", params={"name": name}).json()["servers"]

@stenograph.tool(effect=True, probe=lambda name: (servers(name) or [None])[0])
def provision(name):
    return requests.post(base + "/servers", json={"name": name}).json()

@stenograph.tool(effect=True)
def provision_blind(name):
    return requests.post(base + "/servers", json={"name": name}).json()

print("made", provision("web1"), flush=True)
print("made", provision_blind("db1"), flush=True)
print("done", [s["name"] for s in servers("web1") + servers("db1")])
"""


def test_a_declared_tool_in_doubt_is_probed_or_left_to_a_person(tmp_path: Path) -> None:
    """Its probe found the first effect done: the program gets what the probe returned
    and the tool does not run again. The second declares neither key nor probe: exit 4."""
    svc, store, current = _crashed(tmp_path, TOOLS, ("applied", 1))
    try:
        stop = _again(current, ("applied", 1), [*CLI, "resume", str(store), "t"], tmp_path)
        # the probe settled web1 (no new POST): the first POST of this run is db1's
        assert svc.stats()["by_name"] == {"web1": 1, "db1": 1}
        (st,) = states(store, "t")
        assert [e.state for e in st.effects] == ["settled", "in-doubt"], st.effects
        assert stop.returncode == -9
        stop = _again(current, None, [*CLI, "resume", str(store), "t"], tmp_path)
        assert stop.returncode == 4, stop.stderr
        assert "no idempotency key and no probe" in stop.stderr
        call = states(store, "t")[0].effects[1].call_id
        (tmp_path / "r.json").write_text(json.dumps({"id": "srv_2", "name": "db1"}))
        subprocess.run([*CLI, "settle", str(store), "t", call, "--as", "done", "--result",
                        str(tmp_path / "r.json")], check=True, env=_env(),
                       capture_output=True)
        done = _again(current, None, [*CLI, "resume", str(store), "t"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert "made {'id': 'srv_1', 'name': 'web1'}" in done.stdout
        assert "made {'id': 'srv_2', 'name': 'db1'}" in done.stdout
        assert "done ['web1', 'db1']" in done.stdout
        assert svc.stats()["servers"] == 2
    finally:
        svc.stop()


def test_a_late_result_is_delivered_and_handed_over_at_resume(tmp_path: Path) -> None:
    """The service made the effect and its answer was lost with the crash; the result
    arrives later by other means (`stenograph deliver`). Resume hands it to the program
    and sends nothing. Unknown calls, settled calls and ended runs are refused."""
    svc, store, current = _crashed(tmp_path, PROVISION, ("applied", 1))
    try:
        (st,) = states(store, "t")
        call = st.effects[0].call_id
        (tmp_path / "r.json").write_text(json.dumps({"id": "srv_1", "name": "web1"}))

        def deliver(c: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*CLI, "deliver", str(store), "t", c, "--result",
                                   str(tmp_path / "r.json"), "--by", "webhook"],
                                  capture_output=True, text=True, env=_env())

        unknown = deliver("0/http/7")
        assert unknown.returncode == 2 and "no effect" in unknown.stderr
        assert len(unknown.stderr.strip().splitlines()) == 1
        assert deliver(call).returncode == 0
        twice = deliver(call)
        assert twice.returncode == 2 and "already has its result" in twice.stderr
        done = _again(current, None, [*CLI, "resume", str(store), "t", "--settle-http",
                                      "escalate"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert "server 200 {'id': 'srv_1', 'name': 'web1'}" in done.stdout
        assert svc.stats()["servers"] == 1
        late = deliver(call)
        assert late.returncode == 2 and "has ended" in late.stderr
    finally:
        svc.stop()


def test_a_worker_paused_past_its_lease_is_fenced_and_another_finishes(
        tmp_path: Path) -> None:
    """Worker A is stopped (SIGSTOP, the whole group) with its second payment on the
    wire; its lease expires; worker B resumes the trajectory (epoch 1), re-issues that
    payment with its key and finishes. A is continued: its late request is refused by
    the service's fencing gate, and A itself stops in one line (exit 8), having written
    nothing more. Every payment was made once."""
    (tmp_path / "p.py").write_text(PROGRAM)
    store = tmp_path / "s"
    release, stopped = threading.Event(), threading.Event()
    a_proc: list[subprocess.Popen[str]] = []
    with EffectService() as svc:
        posts = [0]

        def on_effect(path: str, headers: dict[str, str]) -> None:
            posts[0] += 1
            if posts[0] == 2:  # A's second payment: A stops, its request waits
                os.killpg(a_proc[0].pid, signal.SIGSTOP)
                stopped.set()
                release.wait(60)

        svc.on_effect = on_effect
        a = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t",
                              "--workspace", "none", "--lease-ttl", "1", "-o",
                              str(tmp_path / "t.steno"), "--", sys.executable,
                              str(tmp_path / "p.py"), svc.url], cwd=tmp_path, env=_env(),
                             start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        a_proc.append(a)
        try:
            assert stopped.wait(60)
            held = subprocess.run([*CLI, "resume", str(store), "t"], cwd=tmp_path,
                                  env=_env(), capture_output=True, text=True, timeout=60)
            assert held.returncode == 2 and "is held by pid" in held.stderr  # lease live
            time.sleep(1.5)  # A's lease runs out
            b = subprocess.run([*CLI, "resume", str(store), "t", "--lease-ttl", "1"],
                               cwd=tmp_path, env=_env(), capture_output=True, text=True,
                               timeout=120)
            assert b.returncode == 0, b.stderr
            assert "done True" in b.stdout
        finally:
            release.set()
            os.killpg(a.pid, signal.SIGCONT)
        _out, err = a.communicate(timeout=60)
        assert a.returncode == 8, err
        lines = [ln for ln in err.splitlines() if ln.startswith("stenograph: error")]
        assert len(lines) == 1 and "lease" in lines[0], err
        assert svc.stats()["rejected_stale"] == 1
        assert sorted(p["amount"] for p in svc.payments) == list(range(PAYMENTS))
    (st,) = states(store, "t")
    assert st.state == "ended" and st.epoch == 1
    exp = subprocess.run([*CLI, "log", "verify", str(store)], capture_output=True,
                         text=True, env=_env())
    assert exp.returncode == 0, exp.stderr


CPU = """
import requests, sys, time
base = sys.argv[1]
for i in range(40):
    requests.get(base + "/servers", params={"name": "x"})
    print(i, repr(time.process_time()), repr(time.monotonic()), flush=True)
"""


def test_clocks_do_not_run_backwards_where_a_resume_goes_live(tmp_path: Path) -> None:
    """The recorded run spent CPU on 30 real requests the resumed prefix only replays,
    so where it goes live the process's CPU clock is behind the last value served: it
    is shifted forward, and every clock the program reads keeps rising."""
    svc, store, current = _crashed(tmp_path, CPU, ("read", 30))
    try:
        done = _again(current, None, [*CLI, "resume", str(store), "t"], tmp_path)
        assert done.returncode == 0, done.stderr
        rows = [ln.split() for ln in done.stdout.splitlines()]
        assert [int(r[0]) for r in rows] == list(range(40))
        cpu = [float(r[1]) for r in rows]
        mono = [float(r[2]) for r in rows]
        assert cpu == sorted(cpu) and mono == sorted(mono), rows[25:35]
    finally:
        svc.stop()


BUSY = """
import sys, threading, time, requests
base = sys.argv[1]
done = threading.Event()

def work():
    time.sleep(0.2)  # the main thread meanwhile waits for `done`: nobody asks for a turn
    s = 0
    for i in range({n}):  # on the CPU, and no call the shim sees
        s += i
    print("summed", s, flush=True)
    r = requests.post(base + "/payments", json={{"amount": 1, "to": "w"}})
    print("paid", r.json()["id"], flush=True)
    print("seen", requests.get(base + "/servers", params={{"name": "x"}}).json()["servers"],
          flush=True)
    done.set()

threading.Thread(target=work).start()
done.wait()
print("done", flush=True)
"""


def _loop_for(seconds: float) -> int:
    """How many turns of ``s += i`` take ``seconds`` here."""
    n, t0 = 2_000_000, time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return int(n * seconds / (time.perf_counter() - t0))


def test_a_thread_long_on_the_cpu_mid_prefix_is_waited_for(tmp_path: Path) -> None:
    """The main thread reaches its prefix's end at once and parks; the worker computes
    for longer than ``LIVE_WAIT_MS`` (2 s) before its recorded calls. Running, it is not
    a thread blocked in a call the shim does not see: the process waits for it rather
    than go live with it mid-prefix (which left its unreplayed records in the log before
    its live ones, and the whole trajectory then did not replay)."""
    svc, store, current = _crashed(tmp_path, BUSY.format(n=_loop_for(2.6)), ("read", 1))
    try:
        done = _again(current, None, [*CLI, "resume", str(store), "t"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert "done" in done.stdout and svc.stats()["payments"] == 1
        exp = subprocess.run([*CLI, "log", "export", str(store), "t", "-o",
                              str(tmp_path / "r.steno")], capture_output=True, text=True,
                             env=_env(), timeout=60)
        assert exp.returncode == 0, exp.stderr
        rep = subprocess.run([*CLI, "replay", str(tmp_path / "r.steno")], capture_output=True,
                             text=True, env=_env(), timeout=120)
        assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr[-2000:]
    finally:
        svc.stop()
