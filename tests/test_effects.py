"""Effects are written down before they are sent: a real program (requests) makes real
effects against the loopback effect service, recorded into a store.

The service is instrumented: the moment a mutating request arrives, before it does
anything, it reads the store *from disk* and finds the call's ``ToolIntent`` there,
durable, after every event the run had before it. The call's result (its ``Exchange``)
comes after the intent. Each effect carried an ``Idempotency-Key`` (the program's own
where it set one) and the fencing token; a GET is not an effect; ``stenograph status``
classifies every effect; a replay sends nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stenograph.recorder.reader import StoreReader
from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import requests, sys
base = sys.argv[1]
r = requests.post(base + "/payments", json={"amount": 5, "to": "alice"})
print("pay", r.status_code, r.json()["id"])
print("probe", requests.get(base + "/servers", params={"name": "web1"}).json())
r = requests.post(base + "/servers", json={"name": "web1"})
print("server", r.status_code, r.json()["id"])
r = requests.post(base + "/payments", json={"amount": 7, "to": "bob"},
                  headers={"Idempotency-Key": "mine-1"})
print("pay", r.status_code, r.json()["id"])
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _record_with_service(tmp: Path, store: Path, program: str, name: str,
                         on_effect: Any) -> tuple[subprocess.CompletedProcess[str],
                                                  dict[str, Any]]:
    """Record ``program`` (given the service's URL) into ``store`` as trajectory ``t``,
    output ``name.steno``, against an effect service calling ``on_effect``."""
    prog = tmp / f"{name}.py"
    prog.write_text(program)
    with EffectService() as svc:
        svc.on_effect = on_effect
        rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "-o",
                              str(tmp / f"{name}.steno"), "--", sys.executable, str(prog),
                              svc.url], cwd=tmp, env=_env(), capture_output=True,
                             text=True, timeout=120)
        return rec, svc.stats()


def test_every_effect_is_durable_before_it_is_sent(tmp_path: Path) -> None:
    store, seen = tmp_path / "store", []

    def at_dispatch(path: str, headers: dict[str, str]) -> None:
        key = headers.get("Idempotency-Key")
        events = list(StoreReader(store).events(traj="t"))  # what is on disk right now
        intents = [e for e in events if e.kind == "ToolIntent"
                   and e.body.get("idempotency_key") == key]
        seen.append({"path": path, "key": key, "intent": intents[0] if intents else None,
                     "before": max((e.lsn for e in events if e.kind != "ToolIntent"),
                                   default=-1),
                     "fence": headers.get("Stenograph-Fencing-Token")})

    rec, counts = _record_with_service(tmp_path, store, PROGRAM, "e", at_dispatch)
    assert rec.returncode == 0, rec.stderr
    assert counts["payments"] == 2 and counts["servers"] == 1
    assert [s["path"] for s in seen] == ["/payments", "/servers", "/payments"]
    for s in seen:
        intent = s["intent"]
        assert intent is not None, f"{s['path']} arrived before its intent was durable"
        assert intent.lsn > s["before"]  # after everything the run had written before
        assert s["fence"] == "t:0"
    assert seen[2]["key"] == "mine-1"  # the program's own key is kept
    assert seen[0]["key"] != seen[1]["key"] and seen[0]["key"].startswith("steno-")

    events = list(StoreReader(store).events(traj="t"))
    intents = [e for e in events if e.kind == "ToolIntent"]
    assert len(intents) == 3  # the GET is not an effect
    for it in intents:
        b = it.body
        result = [e for e in events if e.kind == "Exchange" and e.body.get("pos") == b["pos"]
                  and e.body.get("channel") == b["channel"]]
        assert result and result[0].lsn > it.lsn  # intent < dispatch < result

    st = subprocess.run([*CLI, "status", str(store), "t", "--json"], capture_output=True,
                        text=True, check=True)
    report: dict[str, Any] = json.loads(st.stdout)
    assert report["state"] == "ended" and report["epoch"] == 0
    assert [e["state"] for e in report["effects"]] == ["settled"] * 3
    # a checkpoint of the workspace before each effect, whatever the cadence
    ats = [e.body["at"] for e in events if e.kind == "Checkpoint"]
    assert ats == ["start", "effect", "effect", "effect", "end"], ats
    cp_lsns = [e.lsn for e in events if e.kind == "Checkpoint" and e.body["at"] == "effect"]
    assert all(c < i.lsn for c, i in zip(cp_lsns, intents, strict=True))
    assert {e["idempotency_key"] for e in report["effects"]} >= {"mine-1"}

    with EffectService() as svc2:  # nothing is sent at replay, anywhere
        rep = subprocess.run([*CLI, "replay", str(tmp_path / "e.steno")], cwd=tmp_path,
                             env=_env(), capture_output=True, text=True, timeout=120)
        assert svc2.stats()["requests"] == 0
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout


def test_status_names_an_effect_in_doubt(tmp_path: Path) -> None:
    """An intent with no result (the recorder died between them) is in doubt."""
    from stenograph.recorder.store import Store

    store = tmp_path / "s"
    with Store(store) as st:
        st.append("x", "RunStarted", {"argv": ["prog"]})
        st.append("x", "ToolIntent", {"call_id": "0/http/0", "proc": "0", "channel": "http",
                                      "pos": 0, "target": "POST http://svc/payments",
                                      "idempotency_key": "k1", "epoch": 0})
    p = subprocess.run([*CLI, "status", str(store), "--json"], capture_output=True,
                       text=True, check=True)
    (report,) = json.loads(p.stdout)["trajectories"]
    assert report["state"] == "needs-attention"
    assert report["effects"] == [{"call_id": "0/http/0", "target": "POST http://svc/payments",
                                  "state": "in-doubt", "idempotency_key": "k1", "epoch": 0,
                                  "did": {"process": "0", "command": "prog",
                                          "request": {"method": "POST",
                                                      "url": "http://svc/payments"}}}]
    bad = subprocess.run([*CLI, "status", str(tmp_path / "nope")], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    unknown = subprocess.run([*CLI, "settle", str(store), "x", "0/http/9", "--as", "done"],
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "no effect" in unknown.stderr
    ok = subprocess.run([*CLI, "settle", str(store), "x", "0/http/0", "--as", "not-done",
                         "--by", "ops"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    after = json.loads(subprocess.run([*CLI, "status", str(store), "x", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    assert after["effects"][0]["state"] == "settled"
    assert after["effects"][0]["decision"] == "not-done"
    assert after["state"] == "crashed"  # no doubt left; the run still has no end
    again = subprocess.run([*CLI, "settle", str(store), "x", "0/http/0", "--as", "done"],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "already settled" in again.stderr


LOOP = """
import requests, sys, time
base = sys.argv[1]
for i in range(40):
    requests.post(base + "/payments", json={"amount": i, "to": "x"})
    requests.post(base + "/servers", json={"name": f"s{i}"})
"""


def test_killing_the_whole_tree_loses_no_intent_of_a_sent_effect(tmp_path: Path) -> None:
    """SIGKILL to the recorder and the program together, at random moments among its
    effects (once the service has seen a random number of them, then a random few
    milliseconds on: the kill waits for events, not for time, so a loaded machine moves
    it nowhere): every request the service received has its intent in the store,
    durable."""
    import random
    import signal
    import time

    rng = random.Random(11)
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP)
    checked = 0
    for trial in range(6):
        store = tmp_path / f"s{trial}"
        with EffectService() as svc:
            keys: list[str | None] = []
            svc.on_effect = lambda path, h, keys=keys: keys.append(h.get("Idempotency-Key"))
            err = (tmp_path / f"err{trial}").open("wb")  # (shown if an intent is missing)
            p = subprocess.Popen([*CLI, "record", "--workspace", "none", "--store", str(store),
                                  "--traj", "t", "-o", str(tmp_path / f"o{trial}.steno"), "--",
                                  sys.executable, str(prog), svc.url], env=_env(),
                                 start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=err)
            after, deadline = rng.randint(1, 60), time.monotonic() + 120
            while len(keys) < after and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.03))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            err.close()
            received = list(keys)
        if not (store / "wal").exists():
            continue
        durable = {e.body.get("idempotency_key") for e in StoreReader(store).events(traj="t")
                   if e.kind == "ToolIntent"}
        missing = [k for k in received if k not in durable]
        assert not missing, (trial, len(received), missing[:3],
                             (tmp_path / f"err{trial}").read_text(errors="replace")[-2000:],
                             sorted({e.kind for e in StoreReader(store).events()}))
        checked += len(received)
        st = subprocess.run([*CLI, "status", str(store), "t", "--json"], capture_output=True,
                            text=True, check=True)
        report = json.loads(st.stdout)
        assert report["state"] in ("crashed", "needs-attention", "ended")
        assert len(report["effects"]) >= len(received)
    assert checked > 10, "the kills came before any effect was sent"


TOOL_PROGRAM = """
import json, sys, urllib.request
import stenograph
base = sys.argv[1]

@stenograph.tool(effect=True, idempotency_key=lambda amount, to: f"pay-{to}-{amount}")
def pay(amount, to):
    req = urllib.request.Request(
        base + "/payments", data=json.dumps({"amount": amount, "to": to}).encode(),
        method="POST", headers={"Idempotency-Key": f"pay-{to}-{amount}",
                                "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["id"]

@stenograph.tool
def lookup(name):
    return "found " + name

print(pay(3, "carol"), lookup("x"), pay(4, "dave"))
"""


def test_a_declared_effect_tool_is_durable_before_it_runs(tmp_path: Path) -> None:
    store, seen = tmp_path / "store", []

    def at_dispatch(path: str, headers: dict[str, str]) -> None:
        key = headers.get("Idempotency-Key")
        on_disk = [e for e in StoreReader(store).events(traj="t") if e.kind == "ToolIntent"]
        seen.append((key, [e.body.get("idempotency_key") for e in on_disk]))

    rec, _counts = _record_with_service(tmp_path, store, TOOL_PROGRAM, "t", at_dispatch)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout.strip() == "pay_1 found x pay_2"
    assert seen == [("pay-carol-3", ["pay-carol-3"]),
                    ("pay-dave-4", ["pay-carol-3", "pay-dave-4"])]
    report = json.loads(subprocess.run([*CLI, "status", str(store), "t", "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert [(e["target"], e["state"]) for e in report["effects"]] == [
        ("tool pay", "settled"), ("tool pay", "settled")]  # lookup is not an effect
    rep = subprocess.run([*CLI, "replay", str(tmp_path / "t.steno")], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and rep.stdout == rec.stdout, rep.stderr


def test_agent_effects_follow_proposal_intent_dispatch_result(tmp_path: Path) -> None:
    """The example agent (openai SDK) against the loopback model server and the effect
    service: for every effect, the model reply that proposed it < its durable intent <
    its dispatch (the service finds the intent on disk) < its result."""
    from stenograph.testing.model_server import ModelServer

    root = Path(__file__).resolve().parent.parent
    store, seen = tmp_path / "store", []
    with EffectService() as svc, ModelServer(script=root / "examples" /
                                             "effect_script.json") as model:
        def at_dispatch(path: str, headers: dict[str, str]) -> None:
            evs = list(StoreReader(store).events(traj="ops"))
            intent = [e for e in evs if e.kind == "ToolIntent"
                      and e.body.get("idempotency_key") == headers.get("Idempotency-Key")]
            models = [e.lsn for e in evs if e.kind == "Exchange"
                      and e.body.get("channel") == "model"]
            seen.append((path, intent[0].lsn if intent else None, models[-1] if models else None))

        svc.on_effect = at_dispatch
        env = {**_env(), "EFFECT_URL": svc.url, "OPENAI_BASE_URL": model.openai_base_url,
               "OPENAI_API_KEY": "sk-ops"}
        rec = subprocess.run([*CLI, "record", "--workspace", "none", "--store", str(store),
                              "--traj", "ops", "-o", str(tmp_path / "ops.steno"), "--",
                              sys.executable, str(root / "examples" / "effect_agent.py")],
                             env=env, capture_output=True, text=True, timeout=120)
        assert rec.returncode == 0, rec.stderr
        assert svc.stats()["servers"] == 1 and svc.stats()["payments"] == 1
    assert [p for p, _i, _m in seen] == ["/servers", "/payments"]
    evs = list(StoreReader(store).events(traj="ops"))
    for _path, intent_lsn, proposal_lsn in seen:
        assert intent_lsn is not None and proposal_lsn is not None
        assert proposal_lsn < intent_lsn  # the reply that proposed it came first
        result = [e for e in evs if e.kind == "Exchange" and e.lsn > intent_lsn
                  and e.body.get("channel") == "http"]
        assert result  # and its result after
    report = json.loads(subprocess.run([*CLI, "status", str(store), "ops", "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert report["turns"] == 4
    assert [e["target"].split()[0] for e in report["effects"]] == ["POST", "POST"]
