"""Record one program: ``RunStarted``, the start checkpoint, the run under the shim, the
end checkpoint, ``RunEnded``, and the trajectory exported to a ``.steno`` file.

The run is recorded into a store beside the output (or the one asked for) and synced at
least every ``session.FLUSH_EVERY`` seconds, so a killed recorder leaves a readable prefix
there; the recorder holds the trajectory's first lease (epoch 0) while it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from stenograph import __version__
from stenograph.interpose.redact import RedactionRules
from stenograph.recorder import keyshapes
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.checkpoints import Checkpointer
from stenograph.recorder.errors import WRITE_ERRNOS, BadInput, StenographError, WriteFailed
from stenograph.recorder.hostclient import HostRecorderLost
from stenograph.recorder.keyshapes import KeyShapes
from stenograph.recorder.secretfiles import write_values
from stenograph.recorder.snapshots import Cadence, Snapshotter
from stenograph.recorder.trajfile import export_trajectory
from stenograph.runner.env import recorded_argv, recorded_env
from stenograph.runner.hostrecorder import open_writer, serve_lost_line
from stenograph.runner.launch import RunResult, check_dynamic, env_size, resolve_program
from stenograph.runner.seal import (
    created_names,
    listing,
    seal_roots,
    snapshot_state,
    start_tree,
)
from stenograph.runner.session import Held, LiveSession, socket_dir, sweep_dead_sockets
from stenograph.runner.settings import Settings, base_env
from stenograph.runner.shim import shim_version
from stenograph.runner.worker import Worker
from stenograph.runner.workspace import WorkspacePlan

TMP_NAMES_MAX = 20_000


@dataclass
class RecordRequest:
    """What ``stenograph record`` was asked."""

    argv: list[str]
    traj: str
    out: Path
    store: Path
    keep_store: bool
    """The store was named (``--store``): kept; else removed once the file is written."""
    asyncio: bool = True
    workspace: WorkspacePlan | None = None
    cadence: Cadence = field(default_factory=Cadence)
    authorizer: Any = None
    lease_ttl: float = 30.0
    shapes: KeyShapes | None = None
    db: str | None = None
    """``--db``: the lease is the trajectory's row in the warm tier, which the store
    ships to as it commits."""
    blobs: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    """``--label k=v``: who the run is for (tenant, team...), kept in ``RunStarted``;
    ``status`` filters on them and ``archive`` partitions by ``tenant``."""


@dataclass
class Recorded:
    """How a recording went: the program's status and what the recorder took."""

    traj: str
    out: Path
    store: Path
    result: RunResult
    chunks: int
    processes: int
    exchanges: int
    loss: str | None
    """The exchange server's note of what it could not keep, if anything."""
    checkpoints: Checkpointer | None
    stalls: list[dict[str, str]]
    held: Held | None
    """The run stopped for a person or a policy: the store is kept for the resume."""


def check_request(argv: list[str], out: Path, store: Path, named: bool) -> None:
    """Refuse before anything is created: a program the shim cannot follow, an output in
    its own store, a store left by an interrupted recording."""
    if named and store.resolve() in (out.resolve(), *out.resolve().parents):
        raise BadInput("output is inside the store", str(out))
    check_dynamic(resolve_program(argv, base_env()))
    if not named and store.exists():
        raise BadInput("an interrupted recording is in the way: resume it with `stenograph "
                       "resume` (see `stenograph status`), export it with `stenograph log "
                       "export`, or remove it", str(store))


def record(req: RecordRequest) -> Recorded:
    """Record ``req.argv`` into ``req.store`` and export it to ``req.out`` (see the module
    docstring). A run held for a person or a policy is exported too, and its store kept."""
    sweep_dead_sockets()
    tmp = socket_dir()
    existed = req.store.exists()
    ran: dict[str, Any] = {}
    try:
        try:
            rec = _record_into(req, tmp, ran)
            export_trajectory(req.store, req.traj, req.out)
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            _record_failed(exc, req, existed, ran.get("result"), ran.get("loss"))
        if rec.held is None and not req.keep_store:
            shutil.rmtree(req.store, ignore_errors=True)
        return rec
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _record_failed(exc: OSError, req: RecordRequest, existed: bool,
                   result: RunResult | None, loss: str | None) -> NoReturn:
    """A write refused mid-record: say what survived and what to do with it. Once the
    program has run, what was durable is exported to the output if it can be (the output
    may be on a disk with room); the recorder's own store then goes."""
    store, traj = req.store, req.traj
    what = f"{exc.strerror} ({exc.filename or store})" + (f"; {loss}" if loss else "")
    if result is None:
        if not existed:  # nothing the program did is in it: leave no half store
            shutil.rmtree(store, ignore_errors=True)
        raise WriteFailed(f"{what}: the recording stopped before the program finished; "
                          f"what was durable is in {store} (export it with `stenograph "
                          f"log export {store} {traj} -o FILE`, or remove it)"
                          if existed or store.exists() else
                          f"{what}: nothing was recorded") from None
    try:
        export_trajectory(store, traj, req.out)
    except (OSError, StenographError):
        pass
    else:
        if not req.keep_store:
            shutil.rmtree(store, ignore_errors=True)
        raise WriteFailed(f"{what}: the program exited {result.status}; the run up to "
                          f"the last durable event is in {req.out} (cut short: `stenograph "
                          "log cat` reads it, a replay needs a complete run)") from None
    raise WriteFailed(f"{what}: the program exited {result.status}; the run up to the last "
                      f"durable event is in {store}: `stenograph log export {store} "
                      f"{traj} -o FILE` writes it out, or remove it") from None


def _record_into(req: RecordRequest, tmp: Path, ran: dict[str, Any]) -> Recorded:
    """The run under the worker's lease. The program's result goes into ``ran`` as soon
    as it has one (a failure after it must still report the program's exit status)."""
    worker = Worker(req.store, req.traj, 0, req.lease_ttl, db=req.db, blobs=req.blobs)
    try:
        return _record_leased(req, tmp, ran, worker)
    except StenographError as exc:
        lost = worker.fenced(look=True)  # the store refused this writer: say why, in one line
        if lost is not None:
            raise lost from None
        if isinstance(exc, HostRecorderLost) and "stenograph resume" not in str(exc.args[0]):
            raise HostRecorderLost(serve_lost_line(str(req.store), req.traj, exc),
                                   str(req.store)) from None
        raise
    finally:
        worker.close()


def _record_leased(req: RecordRequest, tmp: Path, ran: dict[str, Any],
                   worker: Worker) -> Recorded:
    shapes = req.shapes if req.shapes is not None else keyshapes.for_run()
    keyshapes.install(shapes, tmp)  # beside the exchange socket
    env = base_env()
    ws, traj = req.workspace, req.traj
    lost: list[StenographError] = []
    live: list[LiveSession] = []

    def on_lost(err: StenographError) -> None:  # the host recorder went away: stop
        lost.append(err)
        for s in live:
            s.stop()

    with open_writer(req.store, lease=worker.lease, start=req.keep_store, on_lost=on_lost,
                     shared=True) as store:
        first = store.append(traj, "RunStarted", {
            "argv": recorded_argv(req.argv, dict(os.environ), shapes),
            "cwd": os.getcwd(),
            "env": recorded_env(dict(os.environ), shapes),
            "shim": shim_version(),
            "stenograph": __version__,
            "started": time.time(),
            **({"labels": dict(req.labels)} if req.labels else {}),
            "redaction": RedactionRules.from_env(shapes=shapes).to_body(),
            "sealed_state": snapshot_state(),  # what replay puts back (runner.seal.Seal)
            "asyncio": req.asyncio,
            "workspace": ws.to_body() if ws else None,
            "tmp_names": _tmp_names(env, store.blobs),  # what a resume leaves in /tmp
            "tmp_tree": _tmp_tree(env, store.blobs),  # what a replay gives back in /tmp
            "stack": dict(zip(("env_bytes", "env_vars"),
                              env_size(Settings("record").environ(env)), strict=True)),
        })
        # the recording is the trajectory's first lease: epoch 0, this recorder
        store.append(traj, "LeaseAcquired", {"epoch": worker.epoch, "pid": os.getpid(),
                                             "host": os.uname().nodename, "by": "record"})
        checkpoints = None
        if ws is not None:
            checkpoints = Checkpointer(
                store, traj, Snapshotter(BlobStore(req.store / "blobs"), ws.roots, ws.rules,
                                         ws.limits, secrets=ws.secrets), req.cadence)
            checkpoints.start(first)
            write_values(checkpoints.snap.secret_values, tmp)  # for the hooks to learn
        session = LiveSession(store, traj, tmp, checkpoints=checkpoints,
                              authorizer=req.authorizer, worker=worker)
        live.append(session)
        tmp_before = listing(seal_roots(env))
        try:
            result = session.run(req.argv, session.settings("record", asyncio=req.asyncio),
                                 env)
        finally:  # a write refused as the session closes: the program's status stands
            ran["result"] = session.result
            session.close()
            ran["loss"] = session.loss
        if lost:  # (its store is what it was when the host recorder went: resumable)
            raise worker.fenced(look=True) or type(lost[0])(
                serve_lost_line(str(req.store), traj, lost[0]), str(req.store)) from None
        stats = session.stats
        assert stats is not None
        rec = Recorded(traj, req.out, req.store, result, stats.chunks, len(stats.procs),
                       session.exchanges.count, session.loss, checkpoints, session.stalls,
                       session.held)
        if rec.held is None:  # a held run is not ended: it goes on at a resume
            session.ended(
                # names the run created in /tmp, /var/tmp, $TMPDIR: hidden at replay
                tmp_created=created_names(tmp_before, listing(list(tmp_before))),
                checkpoint_errors=checkpoints.errors[:20] if checkpoints else [])
    return rec


def _tmp_tree(env: dict[str, str], blobs: BlobStore) -> dict[str, Any] | None:
    """A blob of the names under /tmp, /var/tmp and $TMPDIR as the run starts
    (``seal.start_tree``, zlib-compressed JSON): a sealed replay gives back, empty, those
    removed since. None when the blob cannot be written."""
    data = zlib.compress(json.dumps(start_tree(seal_roots(env))).encode(), 6)
    try:
        return blobs.put(data).to_body()
    except OSError:
        return None


def _tmp_names(env: dict[str, str], blobs: BlobStore) -> dict[str, Any] | None:
    """A blob of the names in /tmp, /var/tmp and $TMPDIR as the run starts (JSON ``{root:
    [name...]}``): a resume hides what appeared since (the replayed prefix makes those
    names again). A busy /tmp holds thousands of names: they go to the blob store, not
    into RunStarted. None past ``TMP_NAMES_MAX`` names, or when the blob cannot be
    written: the resume then hides nothing."""
    names = listing(seal_roots(env))
    if sum(len(v) for v in names.values()) > TMP_NAMES_MAX:
        return None
    data = json.dumps({root: sorted(v) for root, v in names.items()}).encode()
    try:
        return blobs.put(data).to_body()
    except OSError:
        return None
