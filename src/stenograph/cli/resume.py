"""``stenograph resume STORE TRAJ``: a crashed run, replayed up to its crash, then live.

The resume claims the trajectory (``LeaseAcquired``, epoch + 1: effects it sends carry
the new fencing token), puts the workspace back as the run found it (the start snapshot,
restored in place; what the crash left is kept first as a ``pre-resume`` checkpoint),
and runs the recorded command again with the shim in resume mode: everything up to the
cut (``recorder/resumes.py``) is served from the tape -- model replies, tool results,
clocks, entropy; no model call is made, no effect sent -- and where the tape ends each
process goes live (``shim_c/live.c``, ``PyTape.go_live``) and is recorded into the same
trajectory. An effect the crash left in doubt is settled when the program reaches it
(``interpose/resume_plan.py``). The run then ends as a recording does: a last
checkpoint and ``RunEnded``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from stenograph.cli.lines import needs_person_line, paused_line, stopped_line
from stenograph.cli.record import (
    Worker,
    _exit_code,
    _Flusher,
    _shim_env,
    _stalls,
    lease_option,
    make_authorizer,
    policy_options,
    replay_env,
    run_ended,
    sweep_dead_sockets,
)
from stenograph.interpose import resume_plan
from stenograph.recorder import keyshapes
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.checkpoints import Checkpointer
from stenograph.recorder.codec import Event
from stenograph.recorder.drift import signature, tool_calls_of
from stenograph.recorder.errors import (
    BadInput,
    NeedsPerson,
    Paused,
    ReplayDiverged,
    StenographError,
    Stopped,
)
from stenograph.recorder.exchanges import ExchangeServer, prepare_py_tape
from stenograph.recorder.inputs import traj_id
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.resumes import ResumePlan, plan, settled_entry
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
from stenograph.recorder.tape import RecordSession, prepare_tape, read_divergences
from stenograph.runner.launch import HeldSeal, Seal, run_under_shim, seal_roots
from stenograph.runner.shim import PROTOCOL, readable
from stenograph.runner.workspace import WorkspaceMount
from stenograph.runner.workspace import prepare as prepare_workspace
from stenograph.runner.writeback import write_back


@click.command("resume")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("traj")
@click.option("--settle-http", type=click.Choice(["reissue", "escalate"]), default="reissue",
              show_default=True, help="An HTTP effect left in doubt: send it again with its "
              "recorded Idempotency-Key (reissue), or stop for a person (escalate, exit 4).")
@click.option("--escalate", "escalate", multiple=True, metavar="URL_REGEX",
              help="HTTP effects to URLs matching this are escalated whatever --settle-http "
              "says: services known to ignore idempotency keys (repeatable).")
@click.option("--drift", type=click.Choice(["pin", "cross", "refuse"]), default="cross",
              show_default=True, help="When a live model call differs from the recording's "
              "last one (the model that answers, the model asked for, tool schemas, the "
              "system prompt): note it as a Drift event and go on (cross), ask for the "
              "recorded model (pin), or stop (refuse, exit 6). A changed schema of a tool "
              "with an effect in doubt always stops.")
@click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
@policy_options
@lease_option
def resume(store: Path, traj: str, settle_http: str, escalate: tuple[str, ...],
           drift: str, as_json: bool, policy_file: str | None, budget_tokens: int | None,
           budget_usd: float | None, prices_file: str | None, lease_ttl: float) -> None:
    """Resume TRAJ in STORE: replay what it recorded up to the crash, then go on live.

    Nothing recorded is done twice: model replies and tool results come from the log;
    an effect whose intent is durable but whose result is not is settled first (sent
    again with its recorded idempotency key, its tool's probe asked, or left to a
    person: exit 4 and `stenograph settle`). Crash and resume any number of times.
    Exits with the program's status once it ran to its end."""
    traj_id(traj)
    if not (store / "wal").is_dir():
        raise BadInput("not a store (no wal/ directory)", str(store))
    patterns = []
    for p in escalate:
        try:
            patterns.append(re.compile(p))
        except re.error as exc:
            raise BadInput(f"--escalate: not a regular expression: {exc}", p) from None
    authorizer = make_authorizer(policy_file, budget_tokens, budget_usd, prices_file)
    events = list(StoreReader(store).events(traj=traj))
    if not events:
        raise BadInput(f"no trajectory {traj!r} in the store", str(store))
    rp = plan(traj, events)
    if rp.state.state == "ended":
        _say(as_json, {"traj": traj, "resumed": False, "state": "ended",
                       "exit_status": rp.state.exit_status},
             f"stenograph: {traj} already ended (exit {rp.state.exit_status}); nothing to resume")
        return
    started = rp.started
    if not isinstance(started.get("argv"), list) or not started["argv"]:
        raise BadInput(f"{traj} has no RunStarted with a command: nothing to resume from",
                       str(store))
    recorded = str(started.get("shim") or "?").partition("/")[0]
    if readable(started.get("shim")) is None:
        raise BadInput(f"recorded with shim protocol {recorded}; this stenograph speaks "
                       f"{PROTOCOL}", str(store))
    worker = Worker(store, traj, rp.state.epoch + 1, lease_ttl)
    try:
        # read again now that this worker holds the store: nothing can be appended
        # between this plan and the claim (a worker that lost its lease is fenced)
        rp = plan(traj, list(StoreReader(store).events(traj=traj)))
        if rp.state.state == "ended":
            _say(as_json, {"traj": traj, "resumed": False, "state": "ended",
                           "exit_status": rp.state.exit_status},
                 f"stenograph: {traj} already ended (exit {rp.state.exit_status})")
            return
        for d in rp.in_doubt:
            url = d["target"].partition(" ")[2]
            http = not d["target"].startswith("tool ")
            d["settle"] = "person" if http and (settle_http == "escalate" or any(
                p.search(url) for p in patterns)) else "reissue"
        if authorizer is not None:  # what the prefix spent counts
            for ev in rp.events:
                if ev.kind == "Exchange" and ev.body.get("channel") == "model":
                    ExchangeServer.spend_into(authorizer, ev.body, BlobStore(store / "blobs"))
        outcome = _run(store, traj, rp, worker, events, authorizer,
                       _drift_plan(rp, drift, BlobStore(store / "blobs")))
    except StenographError:
        lost = worker.fenced()
        if lost is not None:
            raise lost from None
        raise
    finally:
        worker.close()
    _finish(store, traj, rp, outcome, as_json)


def _say(as_json: bool, doc: dict[str, Any], line: str) -> None:
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    click.echo(line, err=True)


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


def _run(store: Path, traj: str, rp: ResumePlan, worker: Worker, all_events: list[Event],
         authorizer: Any = None, drift: dict[str, Any] | None = None) -> dict[str, Any]:
    """Claim, restore, run; the outcome for the report."""
    started = rp.started
    tape = Path(tempfile.mkdtemp(prefix="steno-resume-"))
    sweep_dead_sockets()
    sock_dir = Path(tempfile.mkdtemp(prefix="steno-rec-"))
    epoch = max(worker.epoch, rp.state.epoch + 1)
    out: dict[str, Any] = {"epoch": epoch, "cut": rp.cut,
                           "in_doubt": [d["call_id"] for d in rp.in_doubt]}
    held: HeldSeal | None = None
    try:
        with Store(store, shared=True) as s:
            s.append(traj, "LeaseAcquired", {"epoch": epoch, "pid": os.getpid(),
                                             "host": os.uname().nodename, "by": "resume",
                                             "resumed_at": rp.cut})
            entries = []
            for done in rp.settled_done:  # a person said it happened: the program gets
                entry = settled_entry(done["intent"], done["settled"].get("result"))
                s.append(traj, "Exchange", entry)
                entries.append(entry)
            extra_events = [Event(0, traj, 1 << 60, None, "Exchange", e) for e in entries]
            prepare_tape(rp.events, tape, protocol=readable(started.get("shim")))
            prepare_py_tape([*rp.events, *extra_events], tape, BlobStore(store / "blobs"))
            keys = {str(e.body["idempotency_key"]): str(e.body.get("call_id"))
                    for e in rp.events
                    if e.kind == "ToolIntent" and e.body.get("idempotency_key")}
            (tape / "py" / resume_plan.FILE).write_text(json.dumps(
                {"in_doubt": {d["call_id"]: d for d in rp.in_doubt},
                 "approvals": rp.approvals, "drift": drift or {}, "keys": keys}))
            sw = _seal_workspace(s, store, traj, rp, tape, all_events, out)
            checkpoints = sw.checkpoints if sw is not None else None
            held = HeldSeal(_seal(started, tape, sock_dir, store, sw), os.environ)
            if sw is not None:  # checkpoints of what the program sees
                sw.checkpoints.snap.read_from = held.view
            session = RecordSession(s, traj, sock_dir / "tape.sock")
            exchanges = ExchangeServer(
                s, traj, sock_dir / "py.sock",
                after_model=checkpoints.model_turn if checkpoints else None,
                before_intent=checkpoints.before_effect if checkpoints else None,
                before_append=session.drain_all,
                before_approval=checkpoints.at_approval if checkpoints else None,
                authorizer=authorizer)
            flusher = _Flusher(s)
            rec_env = started.get("env") or {}
            env = replay_env({str(k): str(v) for k, v in rec_env.items()}, dict(os.environ))
            extra = {"STENO_TAPE": str(tape), "STENO_RESUME": "1",
                     "STENO_SOCK": session.sock_path, "STENO_PYSOCK": exchanges.path,
                     "STENO_STORE": str(store.resolve()), "STENO_TRAJ": traj,
                     "STENO_EPOCH": str(epoch)}
            keyshapes.install(keyshapes.for_run(started), tape)
            if started.get("asyncio"):
                extra["STENO_ASYNCIO"] = "1"
            if authorizer is not None:
                extra["STENO_AUTHORIZE"] = "1"
            cwd = started.get("cwd")
            try:
                _outcome(s, traj, epoch, tape, sock_dir, started, env, extra, cwd, held,
                         worker, checkpoints, session, exchanges, flusher, out)
            finally:
                held.close()
            if sw is not None and "divergences" not in out and worker.fenced() is None:
                _write_back(sw, store, traj, epoch, out)
            return out
    finally:
        if held is not None:
            held.close()
        shutil.rmtree(tape, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)


def _outcome(s: Store, traj: str, epoch: int, tape: Path, sock_dir: Path,
             started: dict[str, Any], env: dict[str, str], extra: dict[str, str], cwd: Any,
             held: HeldSeal, worker: Worker, checkpoints: Checkpointer | None,
             session: RecordSession, exchanges: ExchangeServer, flusher: _Flusher,
             out: dict[str, Any]) -> None:
    """Run the program in the sealed namespace; how it ended, into ``out``."""
    t0 = time.monotonic()
    try:
        result = run_under_shim(
            [str(a) for a in started["argv"]], _shim_env(env, "replay", **extra),
            cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
            passthrough=True, held=held, started=worker.started)
    finally:
        flusher.close()
        exchanges.close()
        stats = session.close()
    out["seconds"] = round(time.monotonic() - t0, 3)
    if (lost := worker.fenced()) is not None:
        raise lost
    out["status"] = result.status
    divs = [d for d in read_divergences(tape) if d.kind == "divergence"]
    attention = tape / resume_plan.ATTENTION
    if attention.exists():
        out["attention"] = json.loads(attention.read_text())
        return
    if divs:
        out["divergences"] = [d.to_json() for d in divs]
        return
    if exchanges.paused_for is not None:
        out["paused"] = exchanges.paused_for
        out["paused_call"] = exchanges.paused_call
        return
    if exchanges.stopped_for is not None:
        out["stopped"] = exchanges.stopped_for
        out["stopped_at"] = exchanges.stopped_at
        return
    if checkpoints is not None:
        s.flush()
        checkpoints.end(s.synced_lsn)
    s.append(traj, "RunEnded", {
        **run_ended(result, stats, exchanges, checkpoints, _stalls(sock_dir / "stalls")),
        "tmp_created": {}, "resumed": epoch})
    out["ended"] = True


def _seal(started: dict[str, Any], tape: Path, sock_dir: Path, store: Path,
          sw: SealedWorkspace | None) -> Seal:
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
    state = started.get("sealed_state") or {}
    stage = tape / ".seal"
    stage.mkdir(exist_ok=True)
    # the real directories stay the real ones where they lie under a temporary root:
    # the store, the tape (a snapshotted workspace has its own overlay)
    temps = seal_roots(os.environ)
    under_temp = [os.path.realpath(r) for r in [str(store)] + (
        [] if sw is not None else [r for r in recorded_rules(started) if os.path.isdir(r)])]
    keep = [str(tape.resolve()), str(sock_dir.resolve()),
            *(r for r in under_temp if any(r.startswith(t + "/") for t in temps))]
    cwd = started.get("cwd")
    return Seal(hide=hide,
                state={str(k): v for k, v in state.items() if v is None or isinstance(v, dict)},
                keep=keep, stage=str(stage.resolve()),
                workspaces=sw.mounts if sw is not None else (),
                keep_writes=str(sw.writes.resolve()) if sw is not None else None,
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
           if e.kind == "Checkpoint" and e.body.get("at") not in ("pre-resume", "start")]
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


def _finish(store: Path, traj: str, rp: ResumePlan, out: dict[str, Any],
            as_json: bool) -> None:
    doc = {"traj": traj, "resumed": True, **out}
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True, default=str))
    if out.get("set_aside"):
        paths = out["set_aside"]["paths"]
        click.echo(f"stenograph: set aside {len(paths)} file(s) the resumed run replaced "
                   f"(changed since the crash): {', '.join(paths[:5])}"
                   f"{' ...' if len(paths) > 5 else ''} -> {out['set_aside']['dir']}",
                   err=True)
    if "attention" in out:
        raise NeedsPerson(needs_person_line(str(store), traj, out["attention"]["line"]))
    if "paused" in out:
        raise Paused(paused_line(str(store), traj, out["paused"], out.get("paused_call", {})))
    if "stopped" in out:
        raise Stopped(stopped_line(str(store), traj, out["stopped"],
                                   out.get("stopped_at", {})))
    if "divergences" in out:
        for d in out["divergences"][:5]:
            if d.get("detail"):  # a Python hook's call: its report is the diff
                continue  # (the program printed it already)
            click.echo(f"stenograph: divergence: process {d['proc']} thread {d['thread']} "
                       f"channel {d['channel']} position {d['position']}: recorded "
                       f"{d['recorded']}, asked {d['asked']}", err=True)
        raise ReplayDiverged("the resumed prefix diverged from the recording: nothing past "
                             "it was run", traj)
    click.echo(f"stenograph: resumed {traj} at epoch {out['epoch']}: the recorded prefix "
               f"replayed, then live; {len(out['in_doubt'])} effect(s) were in doubt; "
               f"exit {out['status']}", err=True)
    sys.exit(_exit_code(out["status"]))
