"""Fork a recording at turn N: what would the run have done if turn N went otherwise?

The fork is a resume of the parent's prefix (``harness/fork.py`` picks the cut) into a
store of its own, sealed like a replay: the recorded workspace is an overlay (nothing
reaches the real files), /tmp is private. The prefix is served from the tape (no model
call, no effect, no tool re-run); from turn N the program is live in a ``LiveSession``
with the one change: the reply of turn N, where model calls go from turn N on, or
another build of the harness (its prefix build-replayed). Live effects go to the
``effects_url`` or are refused; the program sees the refusal as its HTTP library's
connection error. The fork is then exported as a recording of its own, whose header (and
``RunStarted``) names its parent.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stenograph.harness import fork as forking
from stenograph.harness.source import open_recording
from stenograph.interpose import resume_plan
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.recorder.tape import read_divergences
from stenograph.recorder.trajfile import write_trajectory
from stenograph.runner import buildreplay, prepare
from stenograph.runner.session import LiveSession, socket_dir, sweep_dead_sockets


@dataclass
class ForkRequest:
    """What ``stenograph fork`` was asked (at least one change)."""

    file: str
    at: int
    out: Path
    reply: Any = None
    """The reply of turn N instead of the recorded one (``harness.fork.load_reply``)."""
    reply_name: str | None = None
    model_url: str | None = None
    effects_url: str | None = None
    cmd: list[str] | None = None
    """Another build of the harness to run (empty: the recorded command)."""
    passthrough: bool = True


def fork(req: ForkRequest) -> dict[str, Any]:
    """Run the fork; its outcome (``fork``, ``parent``, ``status``, ``turns``,
    ``live_turns``; ``divergences`` when the prefix did not replay: no fork written)."""
    rec = open_recording(req.file)
    tr = rec.trajectory()
    # (another harness, -- CMD, runs the prefix as a build replay does: any protocol)
    prepare.protocol(tr.started, req.file, build=bool(req.cmd), offer_build=False)
    argv = prepare.here(list(req.cmd), tr.started.get("cwd")) if req.cmd else None
    change = " and ".join(x for x in (
        f"reply from {req.reply_name}" if req.reply is not None else "",
        f"model at {req.model_url}" if req.model_url else "",
        f"harness {shlex.join(argv)}" if argv else "") if x)
    fp = forking.plan(tr, os.path.abspath(req.file), req.at, change)
    extra: list[dict[str, Any]] = []
    if req.reply is not None:
        extra.append(forking.reply_entry(fp.turn_event, req.reply, rec.body, req.file))
    outcome = _run(req, rec, fp, extra, argv)
    return {"fork": str(req.out), "parent": fp.parent, "change": change, **outcome}


def _traj_name(turn: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"fork-{stamp}-{os.getpid()}-t{turn}"


def _run(req: ForkRequest, rec: Any, fp: forking.ForkPlan, extra: list[dict[str, Any]],
         argv: list[str] | None) -> dict[str, Any]:
    """The prefix into a private store, the program under the shim (resume mode; build
    mode too for another build), the result exported."""
    started = next(e.body for e in fp.prefix if e.kind == "RunStarted")
    recorded_argv = [str(a) for a in started["argv"]]
    ended = next((e.body for e in rec.events if e.kind == "RunEnded"), {})
    traj = _traj_name(fp.turn)
    sweep_dead_sockets()
    work = Path(tempfile.mkdtemp(prefix="steno-fork-"))
    sock_dir = socket_dir()
    tape, store_dir = work / "tape", work / "store"
    tape.mkdir()
    try:
        with Store(store_dir) as s:
            blobs = BlobStore(store_dir / "blobs")
            for data in rec.blobs.values():
                blobs.put(data)
            for ev in fp.prefix:
                body = ev.body
                if "$frame" in body:  # a chunk the lazy reader left in the file
                    body = body["$frame"].body()
                if ev.kind == "RunStarted":  # another build: its replays run that command
                    body = {**body, "parent": fp.parent, **(
                        {"argv": argv, "build_of": recorded_argv} if argv else {})}
                s.append(traj, ev.kind, body, durable=False)
            s.flush()
            cut = s.next_seq(traj) - 1
            s.append(traj, "LeaseAcquired", {"epoch": 1, "pid": os.getpid(), "by": "fork",
                                             "host": os.uname().nodename, "resumed_at": cut})
            for entry in extra:
                s.append(traj, "Exchange", entry)
            prepare.fill_tape(tape, started, fp.prefix, rec.blobs,
                              protocol=prepare.protocol(started, req.file, build=bool(argv)),
                              extra=[Event(0, traj, 1 << 60, None, "Exchange", e)
                                     for e in extra])
            (tape / "py" / resume_plan.FILE).write_text(json.dumps(
                {"in_doubt": {}, "approvals": {}, "drift": {}}))
            ws = prepare.restore_workspace(
                tape, started, fp.prefix, rec.blobs,
                live=[a for a in argv if os.path.exists(a)] if argv else [],
                code_globs=() if argv else None)  # another build's code is the one on disk
            session = LiveSession(s, traj, sock_dir)
            env = prepare.environ(started, req.file)
            settings = session.settings(
                "replay", tape=tape, resume=True, fork=True, epoch=1,
                model_url=req.model_url, effects_url=req.effects_url, build=bool(argv),
                edited=bool(argv) and argv != recorded_argv,
                asyncio=not argv and bool(started.get("asyncio")))
            cwd = started.get("cwd")
            seal = prepare.seal(started, tape, hide=ended.get("tmp_created"),
                                keep=[work, sock_dir], workspaces=ws.mounts,
                                cwd=cwd if isinstance(cwd, str) and ws.mounts else None,
                                blobs=rec.blobs)
            t0 = time.monotonic()
            result = session.run(
                argv or recorded_argv, settings, env,
                cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
                passthrough=req.passthrough, seal=seal)
            outcome: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 3),
                                       "status": result.status, "traj": traj}
            divs = [d.to_json() for d in read_divergences(tape) if d.kind == "divergence"]
            if argv:  # another build: the prefix is judged as a build replay judges it
                divs += buildreplay.read_jsonl(tape / "build-divergence.jsonl")
            if divs:
                outcome["divergences"] = divs
                return outcome
            session.ended(tmp_created=ended.get("tmp_created") or {}, forked=True)
        events = list(StoreReader(store_dir).events(traj=traj))
        write_trajectory(req.out, traj, events, blobs=BlobStore(store_dir / "blobs"),
                         extra={"parent": fp.parent})
        turns = sum(1 for e in events if e.kind == "Exchange"
                    and e.body.get("channel") == "model")
        outcome.update(turns=turns, live_turns=turns - fp.turn + (0 if extra else 1))
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
