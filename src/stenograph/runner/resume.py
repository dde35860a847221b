"""Resume a crashed run: replayed up to its crash, then live, into the same trajectory.

The resume claims the trajectory (``LeaseAcquired``, epoch + 1: effects it sends carry
the new fencing token), keeps what the crash left in the workspace as a ``pre-resume``
checkpoint, and runs the recorded command again in a sealed namespace where each
workspace root is an overlay of its start snapshot. Everything up to the cut
(``recorder/resumes.py``) is served from the tape -- model replies, tool results, clocks,
entropy; no model call is made, no effect sent -- and where the tape ends each process
goes live (``shim_c/live.c``, ``PyTape.go_live``) and is recorded by a ``LiveSession``.
An effect the crash left in doubt is settled when the program reaches it
(``interpose/resume_plan.py``). The program's writes go into the real roots when it ends
(``runner/writeback.py``); the run then ends as a recording does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.interpose import resume_plan
from stenograph.recorder import keyshapes
from stenograph.recorder.answers import net_answers, outputs, recorded_answer
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.checkpoints import Checkpointer
from stenograph.recorder.codec import Event
from stenograph.recorder.didwhat import described
from stenograph.recorder.drift import signature, tool_calls_of
from stenograph.recorder.errors import BadInput, StenographError, StoreLocked
from stenograph.recorder.exchanges import ExchangeServer
from stenograph.recorder.hostclient import HostRecorderLost
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.resumes import ResumePlan, covered, plan, settled_entry, states
from stenograph.recorder.secretfiles import recorded_secrets, write_values
from stenograph.recorder.snapshots import (
    Cadence,
    Limits,
    Snapshotter,
    load_manifest,
    recorded_rules,
    start_snapshot,
)
from stenograph.recorder.store import Store
from stenograph.recorder.tape import GivenOutput, LiveReply, read_divergences
from stenograph.runner import prepare
from stenograph.runner.hostrecorder import open_writer, serve_lost_line
from stenograph.runner.pathmap import MappedHold, hold
from stenograph.runner.seal import HeldSeal, seal_roots
from stenograph.runner.session import LiveSession, socket_dir, sweep_dead_sockets
from stenograph.runner.settings import TapeFiles
from stenograph.runner.standin import StandIns
from stenograph.runner.worker import Worker
from stenograph.runner.workspace import WorkspaceMount
from stenograph.runner.workspace import prepare as prepare_workspace
from stenograph.runner.writeback import write_back


@dataclass
class ResumeRequest:
    """What ``stenograph resume`` was asked."""

    store: Path
    traj: str
    settle_http: str = "reissue"
    """An HTTP effect in doubt: ``reissue`` it with its key, or ``escalate`` to a person."""
    escalate: list[re.Pattern[str]] = field(default_factory=list)
    drift: str = "cross"
    authorizer: Any = None
    lease_ttl: float = 30.0
    db: str | None = None
    """``--db``: the lease is the row in the warm tier; a trajectory this store does not
    have is brought from there first (another host recorded it)."""
    blobs: str | None = None


PROBE_TIMEOUT = 120.0
OWN_SETTLING = ("net", "exec", "mcp")
"""Effects in doubt a policy's probe may settle: the program cannot be asked about them
(a declared tool's own ``probe`` answers for it)."""


@dataclass(frozen=True)
class ProbeSaid:
    """What a probe found: ``done`` (with what it printed, the answer the program gets:
    a request's JSON ``result``, a command's ``output``) or ``not-done``."""

    decision: str
    result: Any = None
    output: bytes | None = None


def run_probe(probe: Any, doubt: dict[str, Any], cwd: str) -> ProbeSaid | None:
    """Run a policy's probe for an effect in doubt (``sh -c``, in the run's working
    directory, told which call by ``STENO_PROBE_*``): done on exit 0, not done on exit 1
    with nothing on stderr, None when it cannot tell (anything else, or it did not
    finish). Exit 1 with a complaint is a probe that failed, not one that looked: a
    Python probe's traceback (a timeout reaching the service) exits 1 too, and "not done"
    makes the effect again -- a second server provisioned, once in CI. Done, what it prints
    is the call's answer: JSON for a request (``settle --result``), the bytes of a
    command's stdout (``settle --output``)."""
    env = {**os.environ, "STENO_PROBE_CALL_ID": str(doubt["call_id"]),
           "STENO_PROBE_TARGET": str(doubt["target"]),
           "STENO_PROBE_BY": str(doubt.get("by") or ""),
           "STENO_PROBE_ARGUMENTS": str(doubt.get("arguments") or "")}
    try:
        p = subprocess.run(["/bin/sh", "-c", probe.command], cwd=cwd, env=env,
                           capture_output=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode == 1:  # said cleanly; a complaint with it is a probe that failed
        return None if p.stderr.strip() else ProbeSaid("not-done")
    if p.returncode != 0:
        return None
    if not p.stdout.strip():
        return ProbeSaid("done")
    if doubt.get("channel") == "exec" or str(doubt["call_id"]).endswith(".0"):
        return ProbeSaid("done", output=p.stdout)  # a command's, a connection's maker's
    try:
        return ProbeSaid("done", result=json.loads(p.stdout))
    except ValueError:
        return ProbeSaid("done")  # (not an answer: settled done, with nothing to give)


def _bring(req: ResumeRequest) -> None:
    """``--db``: a trajectory this store lacks comes from the warm tier (its events, and
    from ``--blobs`` what they need), once no live lease elsewhere holds it."""
    from stenograph.recorder.reader import is_store
    from stenograph.recorder.store import init_store

    if is_store(req.store) and any(True for _ in StoreReader(req.store).events(
            traj=req.traj, lazy_tape=True)):
        return
    from stenograph.warm.fetch import fetch_trajectory
    from stenograph.warm.leases import PgLeases
    from stenograph.warm.objects import ObjectStore

    pg = PgLeases(req.db or "", "")
    try:
        other = pg.held_by_other(req.traj)
    finally:
        pg.close()
    if other is not None:  # (refused before anything is copied; the claim checks again)
        raise StoreLocked(f"{req.traj} is held by pid {other.pid} on {other.host} at epoch "
                          f"{other.epoch}: resume it once its lease runs out", str(req.store))
    blobs = BlobStore(req.store / "blobs")
    got = fetch_trajectory(req.db or "", req.traj, blobs,
                           ObjectStore(req.blobs) if req.blobs else None)
    if not is_store(req.store):
        init_store(req.store)
    with open_writer(req.store, start=True) as s:  # (other workers may be bringing theirs)
        got.write(s, req.traj, blobs)
    _restore_missing_roots(req.store, req.traj, blobs)


def _restore_missing_roots(store: Path, traj: str, blobs: BlobStore) -> None:
    """A trajectory brought from another host: each workspace root this host lacks is
    made from the trajectory's last checkpoint (its snapshot came with it), so the run
    goes on in the files it left there. (A secret file's value is masked in a snapshot:
    it comes back masked, as `checkpoint restore` gives it.)"""
    from stenograph.recorder.snapshots import load_manifest, restore_tree

    events = list(StoreReader(store).events(traj=traj, lazy_tape=True))
    started = events[0].body if events and events[0].kind == "RunStarted" else {}
    ws = started.get("workspace") if isinstance(started, dict) else None
    roots = [r.get("path") for r in (ws or {}).get("roots", []) if isinstance(r, dict)]
    missing = [r for r in roots if isinstance(r, str) and not os.path.exists(r)]
    snaps = [e.body["snapshot"] for e in events if e.kind == "Checkpoint"
             and isinstance(e.body.get("snapshot"), dict)]
    if not missing or not snaps:
        return
    manifest = load_manifest(blobs, BlobRef.from_body(snaps[-1]))
    for root in missing:
        if root in manifest.trees:
            Path(root).mkdir(parents=True, exist_ok=True)
            restore_tree(blobs, manifest.trees[root], root)


def _take_decisions(req: ResumeRequest) -> None:
    """``--db``: the decisions people gave through the warm tier (``approve``/``deny``/
    ``settle --db``) that the log does not hold yet, appended as the CLI appends them on
    the trajectory's own host."""
    from stenograph.warm.decisions import waiting

    got = waiting(req.db or "", req.traj)
    if not got:
        return
    (st,) = states(req.store, req.traj)
    pending = {a.call_id for a in st.approvals if a.state == "pending" and not a.used}
    doubt = {e.call_id for e in st.effects if e.state == "in-doubt"}
    todo = [d for d in got if d.call_id in (pending if d.kind == "ApprovalResolved"
                                            else doubt)]
    if not todo:
        return
    blobs = BlobStore(req.store / "blobs")
    with open_writer(req.store, start=True) as s:
        for d in todo:
            body = dict(d.body)
            out = body.get("output")
            if isinstance(out, bytes) and len(out) > 64 << 10:  # as `settle` keeps it
                body["output"] = blobs.put(out).to_body()
            s.append(req.traj, d.kind, body)


def resume(req: ResumeRequest) -> dict[str, Any]:
    """Resume ``req.traj``; the outcome (``resumed``, ``status``, ``paused``,
    ``divergences``, ``attention``, ``set_aside``...) for the CLI to report."""
    store, traj = req.store, req.traj
    if req.db is not None:
        _bring(req)
        _take_decisions(req)
    if not (store / "wal").is_dir():
        raise BadInput("not a store (no wal/ directory)", str(store))
    events = list(StoreReader(store).events(traj=traj, lazy_tape=True))
    if not events:
        raise BadInput(f"no trajectory {traj!r} in the store", str(store))
    rp = plan(traj, events)
    if rp.state.state == "ended":
        return {"traj": traj, "resumed": False, "state": "ended",
                "exit_status": rp.state.exit_status}
    started = rp.started
    if not isinstance(started.get("argv"), list) or not started["argv"]:
        raise BadInput(f"{traj} has no RunStarted with a command: nothing to resume from",
                       str(store))
    prepare.protocol(started, str(store), offer_build=False)
    worker = Worker(store, traj, rp.state.epoch + 1, req.lease_ttl, db=req.db,
                    blobs=req.blobs)
    try:
        # read again now that this worker holds the store: nothing can be appended
        # between this plan and the claim (a worker that lost its lease is fenced)
        events = list(StoreReader(store).events(traj=traj, lazy_tape=True))
        rp = plan(traj, events)
        if rp.state.state == "ended":
            return {"traj": traj, "resumed": False, "state": "ended",
                    "exit_status": rp.state.exit_status}
        for d in rp.in_doubt:
            url = d["target"].partition(" ")[2]
            http = not d["target"].startswith(("tool ", "mcp "))
            d["settle"] = "person" if http and (req.settle_http == "escalate" or any(
                p.search(url) for p in req.escalate)) else "reissue"
            if d.get("channel") == "exec" or (d.get("channel") == "net" and not d.get(
                    "idempotency_key")) or (d.get("channel") == "mcp" and not d.get(
                    "idempotent")):  # a command, a request no key makes safe to send, a
                d["settle"] = "person"  # tool that does not say it may be called again
        found = [(d["call_id"], "reissue", "its idempotency key") for d in rp.in_doubt
                 if d.get("channel") == "net" and d["settle"] == "reissue"]
        policy = getattr(req.authorizer, "policy", None)
        for d in rp.in_doubt:
            probe = policy.probe_for(d["target"]) if policy is not None and d.get(
                "channel") in OWN_SETTLING and d["settle"] == "person" else None
            if probe is None:
                continue
            said = run_probe(probe, d, str(started.get("cwd") or "."))
            if said is not None:  # it found out: done, or not done (made again)
                found.append((d["call_id"], said.decision, f"probe: {probe.command}",
                              said.result, said.output))
        if found:  # settled without a person: a key makes it safe to send again, or a probe
            _settle(store, traj, found)
            events = list(StoreReader(store).events(traj=traj, lazy_tape=True))
            rp = plan(traj, events)
        inside = covered(rp.events, rp.state)
        if inside:  # what a server did for an MCP call settled done is settled with it
            _settle(store, traj, [(cid, "done", f"inside {outer}, settled done")
                                  for cid, outer in inside])
            events = list(StoreReader(store).events(traj=traj, lazy_tape=True))
            rp = plan(traj, events)
        net = [d for d in rp.in_doubt if d.get("channel") in ("net", "exec")
               or (d.get("channel") == "mcp" and d["settle"] == "person")]
        if net:  # nothing in the program can ask for it again: a person, before it runs
            d = net[0]
            why = {"net": "was sent by the program on its own connection, which no one can "
                          "ask again",
                   "exec": "is a command that was running when the run ended",
                   "mcp": "its tool does not say it is idempotent (MCP idempotentHint)"
                   }[d["channel"]]
            return {"traj": traj, "resumed": True, "epoch": rp.state.epoch,
                    "in_doubt": [x["call_id"] for x in rp.in_doubt],
                    "attention": {"call_id": d["call_id"], "target": d["target"], "why": why,
                                  "did": d.get("did") or {},
                                  "line": resume_plan.person_line(
                                      d["call_id"], described(d["did"]) if d.get("did")
                                      else resume_plan.described(
                                          d["target"], d.get("by") or d.get("arguments")),
                                      why)}}
        blobs = BlobStore(store / "blobs")
        if req.authorizer is not None:  # what the prefix spent counts
            for ev in rp.events:
                if ev.kind == "Exchange" and ev.body.get("channel") == "model":
                    ExchangeServer.spend_into(req.authorizer, ev.body, blobs)
        out = _run(req, rp, worker, events, _drift_plan(rp, req.drift, blobs))
    except StenographError as exc:
        lost = worker.fenced(look=True)
        if lost is not None:
            raise lost from None
        if isinstance(exc, HostRecorderLost) and "stenograph resume" not in str(exc.args[0]):
            raise HostRecorderLost(serve_lost_line(str(store), traj, exc),
                                   str(store)) from None
        raise
    finally:
        worker.close()
    return {"traj": traj, "resumed": True, **out}


def _settle(store: Path, traj: str, decisions: list[tuple[Any, ...]]) -> None:
    """Append a ``Settled`` (call, as, by[, result, output]) for each decision made
    without a person."""
    with open_writer(store, shared=True) as s:
        for call, as_, by, *given in decisions:
            result, output = [*given, None, None][:2]
            s.append(traj, "Settled", {"call_id": call, "as": as_, "result": result,
                                       "by": by, **({"output": output, "exit": 0}
                                                    if output is not None else {})})


def _body(value: Any, blobs: BlobStore) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return blobs.get(BlobRef.from_body(value))
    except (OSError, KeyError, ValueError, StenographError, AttributeError):
        return b""


def _drift_plan(rp: ResumePlan, mode: str, blobs: BlobStore) -> dict[str, Any]:
    """What a resumed program compares its live model calls with (``seam.drift_check``):
    the recording's last model call, and the tools whose effects are in doubt."""
    last, proposed = None, []
    doubt = {d["call_id"] for d in rp.in_doubt}
    tools: set[str] = {d["target"][5:] for d in rp.in_doubt if d["target"].startswith("tool ")}
    for ev in rp.events:
        if ev.kind == "Exchange" and ev.body.get("channel") == "model":
            req, resp = ev.body.get("request") or {}, ev.body.get("response") or {}
            reply = _body(resp.get("body"), blobs) if isinstance(resp, dict) else b""
            last = signature(_body(req.get("body"), blobs), reply)
            proposed = tool_calls_of(reply)
        elif ev.kind == "ToolIntent" and ev.body.get("call_id") in doubt:
            tools.update(proposed)
    return {"mode": mode, "last": last.to_body() if last else None,
            "in_doubt_tools": sorted(tools)}


def _run(req: ResumeRequest, rp: ResumePlan, worker: Worker, all_events: list[Event],
         drift: dict[str, Any]) -> dict[str, Any]:
    """Claim, restore, run; the outcome for the report."""
    store, traj, started = req.store, req.traj, rp.started
    tape = Path(tempfile.mkdtemp(prefix="steno-resume-"))
    sweep_dead_sockets()
    sock_dir = socket_dir()
    epoch = max(worker.epoch, rp.state.epoch + 1)
    out: dict[str, Any] = {"epoch": epoch, "cut": rp.cut,
                           "in_doubt": [d["call_id"] for d in rp.in_doubt]}
    held: HeldSeal | MappedHold | None = None
    standins = StandIns()
    lost: list[StenographError] = []
    live: list[LiveSession] = []

    def on_lost(err: StenographError) -> None:  # the host recorder went away: stop
        lost.append(err)
        for one in live:
            one.stop()

    try:
        with open_writer(store, lease=worker.lease, start=True, on_lost=on_lost,
                         shared=True) as s:
            s.append(traj, "LeaseAcquired", {"epoch": epoch, "pid": os.getpid(),
                                             "host": os.uname().nodename, "by": "resume",
                                             "resumed_at": rp.cut})
            entries = []
            for done in rp.settled_done:  # a person said it happened: the program gets
                entry = settled_entry(done["intent"], done["settled"].get("result"))
                s.append(traj, "Exchange", entry)
                entries.append(entry)
            prepare.fill_tape(tape, started, rp.events, BlobStore(store / "blobs"),
                              protocol=prepare.protocol(started, str(store)),
                              extra=[Event(0, traj, 1 << 60, None, "Exchange", e)
                                     for e in entries])
            keys = {str(e.body["idempotency_key"]): str(e.body.get("call_id"))
                    for e in rp.events
                    if e.kind == "ToolIntent" and e.body.get("idempotency_key")}
            (tape / "py" / resume_plan.FILE).write_text(json.dumps(
                {"in_doubt": {d["call_id"]: d for d in rp.in_doubt},
                 "approvals": rp.approvals, "drift": drift, "keys": keys}))
            sw = _seal_workspace(s, store, traj, rp, tape, all_events, out)
            checkpoints = sw.checkpoints if sw is not None else None
            held = hold(_seal(started, tape, sock_dir, store, sw), os.environ)
            if sw is not None:  # checkpoints of what the program sees
                sw.checkpoints.snap.read_from = held.view
            session = LiveSession(s, traj, sock_dir, checkpoints=checkpoints,
                                  authorizer=req.authorizer, worker=worker)
            live.append(session)
            # a command the prefix runs again is replayed, or (settled) done or redone
            session.tape.known = {str(e.body.get("call_id")) for e in rp.events
                                  if e.kind == "ToolIntent"}
            session.tape.settled = {e.call_id: "answered" if e.answered else str(e.decision)
                                    for e in rp.state.effects
                                    if e.decision is not None or e.answered}
            session.tape.approvals = rp.approvals
            _known_answers(session, rp, tape, standins)
            try:
                _outcome(session, epoch, tape, started, held, out)
            finally:
                held.close()
                standins.close()
            if lost:
                raise worker.fenced(look=True) or type(lost[0])(
                    serve_lost_line(str(store), traj, lost[0]), str(store)) from None
            if session.tape.stats.answered:
                out["answered"] = sorted(set(session.tape.stats.answered))
            if sw is not None and "divergences" not in out and worker.fenced(look=True) is None:
                _write_back(sw, store, traj, epoch, out)
            return out
    finally:
        standins.close()
        if held is not None:
            held.close()
        shutil.rmtree(tape, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)


def _known_answers(session: LiveSession, rp: ResumePlan, tape: Path,
                   standins: StandIns) -> None:
    """What the resumed run's processes are told when they reach, live, a request or a
    command the log knows (``recorder/answers.py``): each request's reply (an answer
    opens a stand-in when it is first reached), and the commands given their output."""
    def recorded(call: str) -> Callable[[], bytes]:
        def read() -> bytes:
            got = recorded_answer(rp.events, call)
            if not got:
                raise ValueError("the log holds no answer for it")
            return got
        return read

    replies = {}
    for call, a in net_answers(rp.events, rp.state, rp.approvals).items():
        if a.action == "answer":
            source = recorded(a.recorded) if a.recorded else (lambda b=a.answer: b)
            replies[call] = LiveReply("answer", standins.opener(source))
        else:
            replies[call] = LiveReply(a.action)
    session.tape.replies = replies
    given = tape / "given"
    for o in outputs(rp.events, rp.state, BlobStore(session.store.path / "blobs")):
        given.mkdir(exist_ok=True)
        path = given / re.sub(r"[^0-9A-Za-z.@-]", "_", o.call_id)
        path.write_bytes(o.stdout)
        session.tape.outputs[o.proc] = GivenOutput(str(path), o.status)


def _outcome(session: LiveSession, epoch: int, tape: Path, started: dict[str, Any],
             held: HeldSeal | MappedHold, out: dict[str, Any]) -> None:
    """Run the program in the sealed namespace; how it ended, into ``out``."""
    t0 = time.monotonic()
    cwd = started.get("cwd")
    env = prepare.environ(started, str(session.store.path))
    try:
        result = session.run(
            [str(a) for a in started["argv"]],
            session.settings("replay", tape=tape, resume=True, epoch=epoch,
                             asyncio=bool(started.get("asyncio"))), env,
            cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
            passthrough=True, held=held)
    finally:
        out["seconds"] = round(time.monotonic() - t0, 3)
    out["status"] = result.status
    refused = TapeFiles(tape).refused_lines()
    if refused:  # the prefix's own connections, refused rather than made again
        out["refused"] = refused
    divs = [d for d in read_divergences(tape) if d.kind == "divergence"]
    attention = tape / resume_plan.ATTENTION
    if attention.exists():
        out["attention"] = json.loads(attention.read_text())
        return
    if divs:
        out["divergences"] = [d.to_json() for d in divs]
        return
    if (h := session.held) is not None:
        if h.drained:
            out["drained"] = True
        elif h.paused_for is not None:
            out["paused"] = h.paused_for
            out["paused_call"] = h.paused_call
        else:
            out["stopped"] = h.stopped_for
            out["stopped_at"] = h.stopped_at
        return
    session.ended(tmp_created={}, resumed=epoch)
    out["ended"] = True


def _seal(started: dict[str, Any], tape: Path, sock_dir: Path, store: Path,
          sw: SealedWorkspace | None) -> Any:
    """/tmp, /var/tmp and $TMPDIR as the run found them: what was made there since it
    started is hidden (the replayed prefix makes the same names again), except the
    directories this resume needs (the store, the working directory, its own); each
    workspace root an overlay of its start snapshot, written in ``sw.writes``."""
    before: Any = None
    with contextlib.suppress(OSError, ValueError, AttributeError, StenographError):
        before = json.loads(BlobStore(store / "blobs").get(
            BlobRef.from_body(started.get("tmp_names"))))
    needed = [os.path.realpath(p) for p in (tape, sock_dir, store,
                                             str(started.get("cwd") or "/"))]
    hide: dict[str, list[str]] = {}
    for root in seal_roots(os.environ) if isinstance(before, dict) else []:
        try:
            names = set(os.listdir(root)) - set(before.get(root) or [])
        except OSError:
            continue
        names = {n for n in names if not any(
            p == os.path.join(root, n) or p.startswith(os.path.join(root, n) + "/")
            for p in needed)}
        if names:
            hide[root] = sorted(names)
    # the real directories stay the real ones where they lie under a temporary root:
    # the store, the tape (a snapshotted workspace has its own overlay)
    temps = seal_roots(os.environ)
    under_temp = [os.path.realpath(r) for r in [str(store)] + (
        [] if sw is not None else [r for r in recorded_rules(started) if os.path.isdir(r)])]
    keep = [tape, sock_dir,
            *(Path(r) for r in under_temp if any(r.startswith(t + "/") for t in temps))]
    cwd = started.get("cwd")
    return prepare.seal(started, tape, hide=hide, keep=keep, since_recorded=False,
                        workspaces=sw.mounts if sw is not None else (),
                        keep_writes=sw.writes if sw is not None else None,
                        cwd=cwd if sw is not None and isinstance(cwd, str) else None)


@dataclass
class SealedWorkspace:
    """The workspace a resume runs in: each recorded root an overlay of its start snapshot
    (``workspace.prepare``), the program's writes collected in ``writes/<name>`` and put
    into the real roots when it ends (``runner.writeback``)."""

    mounts: list[WorkspaceMount]
    roots: list[str]
    writes: Path
    checkpoints: Checkpointer
    known: dict[str, dict[str, set[str]]]
    """root -> relative path -> sha256 of every version the run had there (the start
    snapshot's and the crashed run's checkpoints'): not set aside when replaced."""


def _seal_workspace(s: Store, store: Path, traj: str, rp: ResumePlan, tape: Path,
                    all_events: list[Event], out: dict[str, Any]) -> SealedWorkspace | None:
    """What the crash left is snapshotted first (a ``pre-resume`` checkpoint: nothing in
    it is lost whatever happens next); the start snapshot is restored under the tape for
    the overlays. The real roots are not touched."""
    snap = start_snapshot(rp.events)
    ws = rp.started.get("workspace")
    if snap is None or not isinstance(ws, dict):
        return None
    blobs = BlobStore(store / "blobs")
    rules = recorded_rules(rp.started)
    roots = [r for r in rules if os.path.isdir(r)]
    limits = Limits(files=1 << 40, bytes=1 << 62)
    secrets = recorded_secrets(rp.started, keyshapes.for_run(rp.started))
    pre = Snapshotter(blobs, roots, rules, limits, secrets=secrets)
    before = pre.take()
    write_values(pre.secret_values, tape)  # the live files' secrets: the hooks learn them
    s.append(traj, "Checkpoint", {
        "at": "pre-resume", "turn": rp.state.turns, "covers_lsn": s.synced_lsn,
        "snapshot": before.ref.to_body(), "files": before.files,
        "bytes_added": before.bytes_added, "full": before.full,
        "seconds": round(before.seconds, 6)}, durable=True)
    manifest = load_manifest(blobs, snap)
    mounts = prepare_workspace(manifest, blobs, rules, tape / "ws")
    known: dict[str, dict[str, set[str]]] = {}
    ran = [BlobRef.from_body(e.body["snapshot"]) for e in all_events
           if e.kind == "Checkpoint" and "snapshot" in e.body
           and e.body.get("at") not in ("pre-resume", "start")]
    refs = [snap, *ran[-3:]]
    for ref in refs:
        with contextlib.suppress(OSError, KeyError, ValueError, StenographError):
            m = load_manifest(blobs, ref)
            for root, tree in m.trees.items():
                for rel, e in tree.items():
                    if e.kind == "f":
                        known.setdefault(root, {}).setdefault(rel, set()).add(e.sha256)
    checkpoints = Checkpointer(s, traj, Snapshotter(blobs, list(manifest.roots), rules, limits,
                                                    secrets=secrets), Cadence())
    checkpoints.turns = rp.state.turns
    writes = tape / "writes"
    writes.mkdir()
    out["workspace_sealed"] = len(mounts)
    return SealedWorkspace(mounts, list(manifest.roots), writes, checkpoints, known)


def _write_back(sw: SealedWorkspace, store: Path, traj: str, epoch: int,
                out: dict[str, Any]) -> None:
    """The resumed program's writes into the real roots; what was in their way set aside
    under ``STORE/set-aside/TRAJ/e<epoch>/``."""
    aside_base = store / "set-aside" / traj / f"e{epoch}"
    written = removed = 0
    aside: list[str] = []
    for m in sw.mounts:
        upper = sw.writes / m.name
        if not upper.is_dir():
            continue
        for root in (r for r in sw.roots if r == m.target or r.startswith(m.target + "/")):
            # an overlay mounted on an ancestor (the root was gone) holds the root under it
            src = upper / os.path.relpath(root, m.target) if root != m.target else upper
            if not src.is_dir():
                continue
            known = sw.known.get(root, {})
            done = write_back(src, root, aside_base / m.name,
                              lambda rel, k=known: k.get(rel, set()))
            written += done.written
            removed += done.removed
            aside += [os.path.join(root, p) for p in done.set_aside]
    out["workspace_written"] = written
    out["workspace_removed"] = removed
    if aside:
        out["set_aside"] = {"dir": str(aside_base), "paths": aside}
