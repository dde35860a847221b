"""``stenograph record`` and ``stenograph replay``: run a program under the process tape.

record: RunStarted (argv, cwd, an environment whitelist, shim and stenograph versions,
redaction rules), then the shim's TapeChunks as the program runs and the Python hooks'
Exchange events (each durable before the program sees its result), then RunEnded (exit
status, sha256 of stdout and stderr); the trajectory is exported to a ``.steno`` file.
The run is recorded into a store beside the output and synced at least every
``FLUSH_EVERY`` seconds, so a killed recorder leaves a readable prefix there.

replay: prepares the tape from the file, re-runs the recorded command (or the one given)
with the shim serving every recorded value, and reports either the divergences the shim
found (exit 1) or whether stdout, stderr and the exit status were bit-identical (exit 0;
a replay that is not bit-identical exits 1 too, so a script or CI step cannot take it for
a pass).
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
from pathlib import Path
from typing import Any, NoReturn

import click

from stenograph import __version__
from stenograph.cli.lines import fenced_line, paused_line, stopped_line
from stenograph.interpose.redact import NAME_PATTERN, RedactionRules
from stenograph.recorder import keyshapes
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.checkpoints import Checkpointer
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import (
    WRITE_ERRNOS,
    BadInput,
    CorruptLog,
    Paused,
    ReplayDiverged,
    StenographError,
    Stopped,
    StoreFenced,
    WriteFailed,
)
from stenograph.recorder.exchanges import ExchangeServer, prepare_py_tape
from stenograph.recorder.inputs import input_file, output_file, traj_id
from stenograph.recorder.keyshapes import KeyShapes
from stenograph.recorder.resumes import view
from stenograph.recorder.secretfiles import recorded_secrets, write_values
from stenograph.recorder.snapshots import (
    Cadence,
    MapBlobs,
    Snapshotter,
    load_manifest,
    recorded_rules,
    start_snapshot,
)
from stenograph.recorder.store import Store
from stenograph.recorder.tape import (
    RecordSession,
    describe,
    prepare_tape,
    python_stacks,
    read_divergences,
    stream_records,
)
from stenograph.runner import buildreplay
from stenograph.runner.launch import (
    RunResult,
    Seal,
    check_dynamic,
    created_names,
    listing,
    resolve_program,
    run_under_shim,
    seal_roots,
    snapshot_state,
)
from stenograph.runner.pyenv import hook_env
from stenograph.runner.shim import PROTOCOL, readable, shim_path, shim_version
from stenograph.runner.workspace import SecretServed, WorkspaceMount, WorkspacePlan
from stenograph.runner.workspace import plan as plan_workspace
from stenograph.runner.workspace import prepare as prepare_workspace

SECRET_NAME = re.compile(NAME_PATTERN, re.IGNORECASE)
"""Environment variables whose values are never written; replay supplies its own or
``REDACTED``. A program's behaviour rarely depends on a key's value once its model and
tool calls are served from the tape. The same names as every other redaction
(``interpose/redact.py``), plus ``STENO_REDACT_NAMES``."""

REDACTED_ENV = "<redacted>"


def recorded_env(environ: dict[str, str], shapes: KeyShapes | None = None) -> dict[str, str]:
    """The program's whole environment as recorded: the replay restores exactly this, so
    e.g. ``OPENAI_BASE_URL`` (part of every request fingerprint) is the recorded one. A
    secret-named variable's value, a URL's password, a value in a known key's shape and
    copies of any of them are redacted."""
    rules = RedactionRules.from_env(environ, [], shapes)
    return {k: rules.env_value(k, v) for k, v in environ.items()
            if not k.startswith("STENO_") and k != "LD_PRELOAD"}


def recorded_argv(argv: list[str], environ: dict[str, str],
                  shapes: KeyShapes | None = None) -> list[str]:
    """The command as recorded: values of secret-named flags (``--api-key V``,
    ``--token=V``) and arguments equal to a secret of the environment redacted."""
    return RedactionRules.from_env(environ, [], shapes).argv(argv)


def replay_env(recorded: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """The recorded environment; a redacted secret takes this environment's value if set."""
    out = {}
    for k, v in recorded.items():
        out[k] = environ.get(k, v) if v == REDACTED_ENV else v
    return out

FLUSH_EVERY = 0.2
"""Seconds between syncs of the tape while a run is recorded (barriers sync at once)."""


class _Flusher:
    """Sync the store every ``FLUSH_EVERY`` seconds while the program runs."""

    def __init__(self, store: Store) -> None:
        import threading

        self._store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steno-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_EVERY):
            try:
                self._store.flush()
            except (OSError, StenographError):  # the next append reports it
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _exit_code(status: int) -> int:
    return 128 - status if status < 0 else status


USER_SETTINGS = ("STENO_REDACT_", "STENO_EFFECT_URLS", "STENO_READONLY_URLS")
"""``STENO_*`` variables a user sets for the hooks (docs/record-your-agent.md): passed on
(the shim hides them from the program like the rest); every other one is the harness's."""


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if (not k.startswith("STENO_") or k.startswith(USER_SETTINGS))
            and k != "LD_PRELOAD"}


def _shim_env(env: dict[str, str], mode: str, **extra: str) -> dict[str, str]:
    so = shim_path()
    env = hook_env(mode, base=env)
    env["LD_PRELOAD"] = so
    env["STENO_MODE"] = mode
    env["STENO_PROC"] = "0"
    env["STENO_SHIM"] = so
    env.update(extra)
    return env


def policy_options(fn: Any) -> Any:
    """``--policy``, ``--budget-tokens``, ``--budget-usd``, ``--prices`` (record, resume)."""
    for opt in reversed([
        click.option("--policy", "policy_file", type=click.Path(dir_okay=False),
                     default=None, help="Rules (TOML or JSON) that allow, deny or hold for "
                     "approval each model call and effect by its target (`METHOD URL`, "
                     "`tool NAME`); see docs/crash-and-resume.md."),
        click.option("--budget-tokens", type=click.IntRange(min=1), default=None,
                     metavar="N", help="Stop the run (exit 6) before a model call or effect "
                     "once its model replies used N tokens."),
        click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True),
                     default=None, metavar="X", help="The same in dollars, by --prices."),
        click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
                     default=None, help="JSON {model: [usd per 1M input tokens, output]} "
                     "over the built-in table."),
    ]):
        fn = opt(fn)
    return fn


class Worker:
    """The lease a worker (record, resume) holds on its store while it runs, renewed by
    a heartbeat; when another worker takes the trajectory over (this one was paused past
    its lease), the program is killed at once and the run ends fenced (exit 8)."""

    def __init__(self, store: Path, traj: str, epoch: int, ttl: float) -> None:
        from stenograph.recorder.leases import Heartbeat, LocalLeases
        from stenograph.recorder.reader import is_store
        from stenograph.recorder.store import init_store

        if not is_store(store):  # the lease lives in the store: make it first
            init_store(store)
        self.store = store
        self.leases = LocalLeases(store)
        self.lease = self.leases.acquire(traj, epoch, ttl)
        self.proc: Any = None
        self.lost_to: Any = None
        self.heartbeat = Heartbeat(self.leases, self.lease, ttl, self._lost)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def started(self, proc: Any) -> None:
        self.proc = proc

    def _lost(self, now: Any) -> None:
        self.lost_to = now
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()

    def fenced(self) -> StoreFenced | None:
        """The error to end with if the lease was lost, else None."""
        if not self.heartbeat.is_lost:
            return None
        who = self.lost_to
        by = f" by pid {who.pid} on {who.host} at epoch {who.epoch}" if who else ""
        return StoreFenced(fenced_line(
            str(self.store), self.lease.traj, f"lost the lease on {self.lease.traj}: taken "
            f"over{by} while this worker was not renewing it; this worker stopped"), None)

    def close(self) -> None:
        self.heartbeat.close()


def lease_option(fn: Any) -> Any:
    return click.option("--lease-ttl", type=click.FloatRange(min=0.1), default=30.0,
                        show_default=True, metavar="SECONDS",
                        help="How long the worker's lease on the store lasts unrenewed: "
                        "after that, a worker that stopped (killed, paused) can be taken "
                        "over by `stenograph resume`.")(fn)


def make_authorizer(policy_file: str | None, budget_tokens: int | None,
                    budget_usd: float | None, prices_file: str | None) -> Any:
    """The recorder's ``Authorizer`` for these options, or None (no checks, no cost)."""
    from stenograph.recorder.policy import Authorizer, Budget, Policy, load_prices

    if policy_file is None and budget_tokens is None and budget_usd is None:
        if prices_file is not None:
            raise BadInput("--prices needs --budget-usd")
        return None
    policy = Policy.load(policy_file) if policy_file else Policy()
    return Authorizer(policy, Budget(budget_tokens, budget_usd, load_prices(prices_file)))


@click.command("record")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Trajectory file to write (default: <trajectory id>.steno).")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Store to record into and keep (default: .<output>.rec beside the output, "
              "removed once the .steno file is written).")
@click.option("--traj", default=None, help="Trajectory id (default: run-<time>-<pid>).")
@click.option("--asyncio/--no-asyncio", "asyncio_loop", default=True, show_default=True,
              help="Put asyncio event loops on the tape: tasks that run while hooked async "
              "requests are in flight (overlapping requests, asyncio.gather of streams, an "
              "async agent framework's graph: pydantic-ai, the OpenAI Agents SDK) replay in "
              "the recorded order. --no-asyncio keeps a hooked async call paused across its "
              "awaits instead, exact only for one request at a time per loop. The replay "
              "follows the recording.")
@click.option("--workspace", "workspaces", multiple=True, metavar="DIR",
              help="Snapshot DIR before the program starts and at checkpoints; a replay "
              "then sees DIR as it was (repeatable; default: the working directory; "
              "`--workspace none`: no snapshots).")
@click.option("--workspace-ignore", "ws_ignore", multiple=True, metavar="GLOB",
              help="Leave paths matching GLOB out of the snapshots (repeatable; like a "
              "line of a .stenoignore). Left-out paths are live at replay.")
@click.option("--workspace-secret", "ws_secret", multiple=True, metavar="GLOB",
              help="Treat files matching GLOB as secret files too: their values are masked "
              "in every snapshot (repeatable; like a `secret: GLOB` line of a .stenoignore; "
              ".env, keys and credentials files are by default, see "
              "docs/record-your-agent.md).")
@click.option("--workspace-not-secret", "ws_not_secret", multiple=True, metavar="GLOB",
              help="Files matching GLOB are not secret files (still scanned for key shapes; "
              "repeatable; like `!secret: GLOB`).")
@click.option("--workspace-max", "ws_max", metavar="FILES|SIZE|FILES:SIZE", default=None,
              help="Refuse to start when a workspace is bigger (default 100000 files, 2G).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="A checkpoint every N model turns (default: Daly's optimal interval "
              "from the measured snapshot cost and --mtbf).")
@click.option("--mtbf", type=click.FloatRange(min=0.001), default=4.0, show_default=True,
              metavar="HOURS", help="Mean time between failures the checkpoint cadence "
              "is chosen for.")
@policy_options
@lease_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def record(output: str | None, store_dir: str | None, traj: str | None, asyncio_loop: bool,
           workspaces: tuple[str, ...], ws_ignore: tuple[str, ...], ws_secret: tuple[str, ...],
           ws_not_secret: tuple[str, ...], ws_max: str | None,
           checkpoint_every: int | None, mtbf: float, policy_file: str | None,
           budget_tokens: int | None, budget_usd: float | None, prices_file: str | None,
           lease_ttl: float, cmd: tuple[str, ...]) -> None:
    """Run CMD under the tape and record everything it reads from the world.

    The workspace (the working directory unless --workspace says otherwise) is
    snapshotted first, and again at checkpoints between model turns: a replay runs
    against the recorded files in a private mount namespace, and `stenograph checkpoint
    restore` gives the files at any turn."""
    argv = list(cmd)
    traj = traj_id(traj) if traj is not None else (
        f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    out = output_file(output if output else f"{traj}.steno")
    if store_dir and Path(store_dir).resolve() in (out.resolve(), *out.resolve().parents):
        raise BadInput("output is inside the store", str(out))
    check_dynamic(resolve_program(argv, _base_env()))  # refuse before creating anything
    store_path = Path(store_dir) if store_dir else out.parent / f".{out.name}.rec"
    if not store_dir and store_path.exists():
        raise BadInput("an interrupted recording is in the way: resume it with `stenograph "
                       "resume` (see `stenograph status`), export it with `stenograph log "
                       "export`, or remove it", str(store_path))
    shapes = keyshapes.for_run()
    ws = plan_workspace(workspaces, ws_ignore, ws_max, os.getcwd(),
                        exclude=[str(store_path), str(out)], secret=ws_secret,
                        not_secret=ws_not_secret, shapes=shapes)
    authorizer = make_authorizer(policy_file, budget_tokens, budget_usd, prices_file)
    cadence = Cadence(mtbf=mtbf * 3600, every=checkpoint_every)
    sweep_dead_sockets()
    tmp = tempfile.mkdtemp(prefix="steno-rec-")
    existed = store_path.exists()
    ran: dict[str, Any] = {}
    try:
        env = _base_env()
        try:
            stats, exchanges, stalls, result = _record_into(
                store_path, traj, argv, env, tmp, asyncio_loop, ran, ws, cadence, authorizer,
                lease_ttl, shapes)
            from stenograph.recorder.trajfile import export_trajectory

            export_trajectory(store_path, traj, out)
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            _record_failed(exc, store_path, existed, traj, ran.get("result"), ran.get("lost"),
                           out, keep_store=bool(store_dir))
        if exchanges.paused_for is not None:
            raise Paused(paused_line(str(store_path), traj, exchanges.paused_for,
                                     exchanges.paused_call))
        if exchanges.stopped_for is not None:
            raise Stopped(stopped_line(str(store_path), traj, exchanges.stopped_for,
                                       exchanges.stopped_at))
        if not store_dir:
            shutil.rmtree(store_path, ignore_errors=True)
        click.echo(
            f"stenograph: recorded {traj}: exit {result.status}, {stats.chunks} tape chunks "
            f"from {len(stats.procs)} process(es), {exchanges.count} exchanges -> {out}",
            err=True)
        if ran.get("lost"):
            click.echo(f"stenograph: warning: {ran['lost']}", err=True)
        if ran.get("checkpoints"):
            cp = ran["checkpoints"]
            click.echo(f"stenograph: workspace: {cp.taken[0].files} files in "
                       f"{len(cp.snap.roots)} root(s), {len(cp.taken)} checkpoint(s)"
                       f"{_redacted_note(cp.snap.redacted)}", err=True)
            for e in cp.errors:
                click.echo(f"stenograph: warning: {e}", err=True)
        for s in stalls:
            click.echo(
                f"stenograph: warning: process {s.get('proc')} thread {s.get('thread')} waited "
                f"past the stall limit while thread {s.get('holder')} held the tape's scheduler "
                "without blocking (a busy-wait, or a blocking call the shim does not see): the "
                f"rest of that process ran unscheduled, and its replay will stop at turn "
                f"{s.get('turn')}", err=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(_exit_code(result.status))


def sweep_dead_sockets(limit: int = 200) -> int:
    """Remove the socket directories of recorders that were killed (SIGKILL leaves them
    in the temporary directory): an hour old, and nothing accepts on their sockets. A
    directory whose recorder is alive (even a stopped one) still accepts, and stays."""
    import socket
    import time

    root = Path(tempfile.gettempdir())
    removed = 0
    try:
        names = [n for n in os.listdir(root) if n.startswith("steno-rec-")]
    except OSError:
        return 0
    for name in names:
        d = root / name
        try:
            if time.time() - d.stat().st_mtime < 3600 or not d.is_dir():
                continue
        except OSError:
            continue
        alive = False
        try:  # another recorder may be sweeping the same directory away
            socks = list(d.glob("*.sock"))
        except OSError:
            continue
        for sock in socks:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
                try:
                    c.connect(str(sock))
                    alive = True
                except OSError:
                    pass
        if not alive:
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
            if removed >= limit:
                break
    return removed


def _record_failed(exc: OSError, store_path: Path, existed: bool, traj: str,
                   result: RunResult | None, lost: str | None = None,
                   out: Path | None = None, keep_store: bool = True) -> NoReturn:
    """A write refused mid-record: say what survived and what to do with it. Once the
    program has run, what was durable is exported to ``out`` if it can be (the output
    may be on a disk with room); the recorder's own store then goes."""
    what = f"{exc.strerror} ({exc.filename or store_path})" + (f"; {lost}" if lost else "")
    if result is None:
        if not existed:  # nothing the program did is in it: leave no half store
            shutil.rmtree(store_path, ignore_errors=True)
        raise WriteFailed(f"{what}: the recording stopped before the program finished; "
                          f"what was durable is in {store_path} (export it with `stenograph "
                          f"log export {store_path} {traj} -o FILE`, or remove it)"
                          if existed or store_path.exists() else
                          f"{what}: nothing was recorded") from None
    if out is not None:
        from stenograph.recorder.trajfile import export_trajectory

        try:
            export_trajectory(store_path, traj, out)
        except (OSError, StenographError):
            pass
        else:
            if not keep_store:
                shutil.rmtree(store_path, ignore_errors=True)
            raise WriteFailed(f"{what}: the program exited {result.status}; the run up to "
                              f"the last durable event is in {out} (cut short: `stenograph "
                              "log cat` reads it, a replay needs a complete run)") from None
    raise WriteFailed(f"{what}: the program exited {result.status}; the run up to the last "
                      f"durable event is in {store_path}: `stenograph log export {store_path} "
                      f"{traj} -o FILE` writes it out, or remove it") from None


def _record_into(store_path: Path, traj: str, argv: list[str], env: dict[str, str],
                 tmp: str, asyncio_loop: bool, ran: dict[str, Any],
                 ws: WorkspacePlan | None = None, cadence: Cadence | None = None,
                 authorizer: Any = None, lease_ttl: float = 30.0,
                 shapes: KeyShapes | None = None,
                 ) -> tuple[Any, Any, list[dict[str, str]], RunResult]:
    """Run ARGV under the tape into STORE_PATH: RunStarted, the start checkpoint, the
    run, the end checkpoint, RunEnded. The program's result goes into ``ran`` as soon as
    it has one (a failure after it must still report the program's exit status)."""
    worker = Worker(store_path, traj, 0, lease_ttl)
    try:
        return _record_leased(store_path, traj, argv, env, tmp, asyncio_loop, ran, ws,
                              cadence, authorizer, worker,
                              shapes if shapes is not None else keyshapes.for_run())
    except StenographError:
        lost = worker.fenced()  # the store refused this writer: say why, in one line
        if lost is not None:
            raise lost from None
        raise
    finally:
        worker.close()


def _record_leased(store_path: Path, traj: str, argv: list[str], env: dict[str, str],
                   tmp: str, asyncio_loop: bool, ran: dict[str, Any],
                   ws: WorkspacePlan | None, cadence: Cadence | None, authorizer: Any,
                   worker: Worker, shapes: KeyShapes,
                   ) -> tuple[Any, Any, list[dict[str, str]], RunResult]:
    keyshapes.install(shapes, tmp)  # beside the exchange socket
    with Store(store_path, shared=True) as store:
        first = store.append(traj, "RunStarted", {
            "argv": recorded_argv(argv, dict(os.environ), shapes),
            "cwd": os.getcwd(),
            "env": recorded_env(dict(os.environ), shapes),
            "shim": shim_version(),
            "stenograph": __version__,
            "started": time.time(),
            "redaction": RedactionRules.from_env(shapes=shapes).to_body(),
            "sealed_state": snapshot_state(),  # what replay puts back (launch.Seal)
            "asyncio": asyncio_loop,
            "workspace": ws.to_body() if ws else None,
            "tmp_names": _tmp_names(env, store.blobs),  # what a resume leaves in /tmp
        })
        # the recording is the trajectory's first lease: epoch 0, this recorder
        store.append(traj, "LeaseAcquired", {"epoch": worker.epoch, "pid": os.getpid(),
                                             "host": os.uname().nodename, "by": "record"})
        checkpoints = None
        if ws is not None:
            checkpoints = Checkpointer(
                store, traj, Snapshotter(BlobStore(store_path / "blobs"), ws.roots, ws.rules,
                                         ws.limits, secrets=ws.secrets), cadence or Cadence())
            checkpoints.start(first)
            ran["checkpoints"] = checkpoints
            write_values(checkpoints.snap.secret_values, tmp)  # for the hooks to learn
        session = RecordSession(store, traj, Path(tmp) / "tape.sock")
        exchanges = ExchangeServer(store, traj, Path(tmp) / "py.sock",
                                   after_model=checkpoints.model_turn if checkpoints else None,
                                   before_intent=_before_intent(checkpoints),
                                   before_append=session.drain_all,
                                   before_approval=checkpoints.at_approval if checkpoints
                                   else None, authorizer=authorizer)
        flusher = _Flusher(store)
        tmp_before = listing(seal_roots(env))
        try:
            loop_env = {"STENO_ASYNCIO": "1"} if asyncio_loop else {}
            result = run_under_shim(argv, _shim_env(
                env, "record", STENO_SOCK=session.sock_path,
                STENO_PYSOCK=exchanges.path, STENO_STORE=str(store_path.resolve()),
                STENO_TRAJ=traj, STENO_EPOCH=str(worker.epoch),
                **loop_env, **({"STENO_AUTHORIZE": "1"} if authorizer else {})),
                started=worker.started)
            ran["result"] = result
        finally:
            flusher.close()
            exchanges.close()
            ran["lost"] = exchanges.loss_note()
            stats = session.close()
        stalls = _stalls(Path(session.sock_path).parent / "stalls")
        if (lost := worker.fenced()) is not None:
            raise lost
        if exchanges.paused_for is not None or exchanges.stopped_for is not None:
            return stats, exchanges, stalls, result  # not ended: it goes on at a resume
        if checkpoints is not None:
            store.flush()
            checkpoints.end(store.synced_lsn)
        store.append(traj, "RunEnded", {
            **run_ended(result, stats, exchanges, checkpoints, stalls),
            # names the run created in /tmp, /var/tmp, $TMPDIR: hidden at replay
            "tmp_created": created_names(tmp_before, listing(list(tmp_before))),
            "checkpoint_errors": checkpoints.errors[:20] if checkpoints else [],
        })
    return stats, exchanges, stalls, result


TMP_NAMES_MAX = 20_000


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


def run_ended(result: RunResult, stats: Any, exchanges: ExchangeServer,
              checkpoints: Checkpointer | None, stalls: list[dict[str, str]]) -> dict[str, Any]:
    """What ``RunEnded`` says of every run, recorded or resumed."""
    return {
        "status": result.status,
        "stdout_sha256": result.stdout_sha256,
        "stderr_sha256": result.stderr_sha256,
        "stdout_bytes": result.stdout_bytes,
        "stderr_bytes": result.stderr_bytes,
        "chunks": stats.chunks,
        "processes": sorted(stats.procs),
        "exchanges": exchanges.count,
        "exchanges_lost": exchanges.lost,
        "bodies_lost": exchanges.bodies_lost,
        "errors": (stats.errors + exchanges.errors)[:20],
        "stalls": stalls,
        "checkpoints": len(checkpoints.taken) if checkpoints else 0,
    }


def _before_intent(checkpoints: Checkpointer | None) -> Any:
    """What the recorder does before an effect's intent: a checkpoint of the files the
    effect may change (forced, whatever the cadence). (Every ring of the tree is drained
    before any entry, the intent too: its sync covers all that was taped before it.)"""
    def run() -> None:
        if checkpoints is not None:
            checkpoints.before_effect()
    return run


def _stalls(path: Path) -> list[dict[str, str]]:
    """The stalls the shim broke while recording (sched.c ``note_stall``), one per line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [dict(f.split("=", 1) for f in line.split("\t") if "=" in f)
            for line in text.splitlines()][:20]


def _load(path: str) -> tuple[dict[str, Any], dict[str, Any], list[Event], dict[str, bytes]]:
    from stenograph.recorder.trajfile import read_trajectory

    tf = read_trajectory(path)
    tf.events = view(tf.events)  # a resumed run: each resume's re-run edge dropped
    started = next((e.body for e in tf.events if e.kind == "RunStarted"), None)
    ended = next((e.body for e in tf.events if e.kind == "RunEnded"), None)
    if started is None:
        raise BadInput("not a recorded run (no RunStarted event)", path)
    if ended is None:
        raise CorruptLog("recorded run has no RunEnded event (recorder killed?)", path, 0)
    if not isinstance(started.get("argv"), list) or not started["argv"]:
        raise CorruptLog("RunStarted has no argv", path, 0)
    return started, ended, tf.events, tf.blobs


@click.command("replay")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--lenient", is_flag=True, help="Serve live values past a divergence; list all.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (program output "
              "is not passed through).")
@click.option("--allow-network", is_flag=True, help="Let the replay open AF_INET sockets.")
@click.option("--unsealed", is_flag=True, help="Replay against the live /tmp, /var/tmp, "
              "$TMPDIR and workspace (no private mount namespace): names the recording "
              "created there are taken, and the program reads and writes today's files.")
@click.option("--keep-tape", type=click.Path(file_okay=False), default=None,
              help="Prepare the tape in this directory and keep it.")
@click.option("--keep-writes", type=click.Path(file_okay=False), default=None,
              help="Keep what the program wrote to its workspace here (an overlay's upper "
              "layer per workspace root; deleted files are overlayfs whiteouts). The real "
              "workspace is never written.")
@click.option("--live", "live", multiple=True, type=click.Path(exists=True), metavar="PATH",
              help="Show PATH (a file or directory in the workspace) as it is now, not as "
              "recorded: the code of a program you changed. Files named on an edited "
              "command line (`-- CMD`) are live anyway.")
@click.option("--build", "build", is_flag=True,
              help="Judge another build of the program (CI, regress, bisect): model "
              "requests, tool calls, effects and the exit status are strict; clocks, "
              "entropy, listings, identity, waits, pipe shape and threads are served "
              "while they fit, then live, and counted as drift. The workspace's code "
              "(--code) is live, its other files as recorded; stdout is not compared.")
@click.option("--compare-output", is_flag=True,
              help="With --build: stdout and stderr must be identical too.")
@click.option("--code", "code_globs", multiple=True, metavar="GLOB",
              help="With --build: workspace files that are the build's code, shown as "
              "they are now (default: *.py, *.pyi, *.so, pyproject.toml, setup.py, lock "
              "files...; repeatable; `none`: every file as recorded).")
@click.option("--env", "env_set", multiple=True, metavar="NAME=VALUE",
              help="With --build: set NAME in the program's environment (which is "
              "otherwise the recorded one), e.g. PYTHONPATH for the build under test.")
@click.option("--stop-at", hidden=True, default=None, metavar="PROC:POS",
              help="Snapshot the workspace at this model request into KEEP_TAPE/stop and "
              "end there (`stenograph checkpoint restore`).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def replay(file: str, lenient: bool, as_json: bool, allow_network: bool, unsealed: bool,
           keep_tape: str | None, keep_writes: str | None, live: tuple[str, ...],
           build: bool, compare_output: bool, code_globs: tuple[str, ...],
           env_set: tuple[str, ...], stop_at: str | None, cmd: tuple[str, ...]) -> None:
    """Re-run a recorded command, serving every recorded clock, byte and listing.

    Sealed (the default): the program runs in a private mount namespace where /tmp is
    fresh and each recorded workspace directory holds the files it held when the
    recording started, whatever it holds now; nothing it writes reaches the real files."""
    input_file(file)
    if build and lenient:
        raise BadInput("--lenient and --build do not mix (build replay serves live values "
                       "wherever the tape does not fit)")
    if not build and (compare_output or code_globs or env_set):
        raise BadInput("--compare-output, --code and --env need --build")
    overrides = {}
    for item in env_set:
        name, eq, value = item.partition("=")
        if not eq or not name or name.startswith("STENO_") or "\0" in item:
            raise BadInput("--env wants NAME=VALUE (not a STENO_ variable)", item)
        overrides[name] = value
    if keep_tape is not None:
        kt = Path(keep_tape)
        if kt.exists() and (not kt.is_dir() or any(kt.iterdir())):
            raise BadInput("--keep-tape: not an empty directory (the tape is prepared in "
                           "it, and nothing of yours may be mixed in or overlaid)", keep_tape)
    if keep_writes is not None:
        if unsealed:
            raise BadInput("--keep-writes needs a sealed replay (drop --unsealed)")
        kw = Path(keep_writes)
        if kw.exists() and (not kw.is_dir() or any(kw.iterdir())):
            raise BadInput("--keep-writes: not an empty directory", keep_writes)
    started, ended, events, blobs = _load(file)
    if started.get("build_of") and not build:
        raise BadInput("a fork of another build (its prefix was recorded by the parent's "
                       "build): replay it with --build", file)
    recorded = str(started.get("shim") or "?").partition("/")[0]
    protocol = readable(started.get("shim"))
    old_tape = protocol is None
    if old_tape and not build:
        raise BadInput(f"recorded with shim protocol {recorded}; this stenograph speaks "
                       f"{PROTOCOL} (a build replay, --build, still reads it)", file)
    argv = _here(list(cmd), started.get("cwd")) or [str(a) for a in started["argv"]]
    tape = Path(keep_tape) if keep_tape else Path(tempfile.mkdtemp(prefix="steno-tape-"))
    try:
        if keep_tape:
            tape.mkdir(parents=True, exist_ok=True)
            (tape / "divergence").unlink(missing_ok=True)
        killed = _killed_by(ended)
        if not old_tape:  # another protocol's C tape: all incidental, all live
            prepare_tape(events, tape, killed=killed, protocol=protocol)
        prepare_py_tape(events, tape, blobs)
        rec_env = started.get("env") or {}
        if not isinstance(rec_env, dict):
            raise CorruptLog("RunStarted has no environment map", file, 0)
        env = replay_env({str(k): str(v) for k, v in rec_env.items()}, dict(os.environ))
        env.update(overrides)
        keyshapes.install(keyshapes.for_run(started), tape)
        extra = {"STENO_TAPE": str(tape)}
        if build:
            extra["STENO_BUILD"] = "1"  # and no loop tape: another build's ticks differ
        elif started.get("asyncio"):
            extra["STENO_ASYNCIO"] = "1"
        if argv != [str(a) for a in started["argv"]]:
            extra["STENO_EDITED"] = "1"  # another command: its own paths are not divergences
        if lenient:
            extra["STENO_LENIENT"] = "1"
        if stop_at:
            (tape / "stop").mkdir(exist_ok=True)
            (tape / "stop" / "spec.json").write_text(json.dumps(started.get("workspace")))
            extra["STENO_STOP_AT"] = stop_at
        if not allow_network:
            extra["STENO_NONET"] = "1"
        cwd = started.get("cwd")
        mounts = []
        secret_files: list[SecretServed] = []
        snap = start_snapshot(events)
        if snap is not None and not unsealed:
            blob_map = MapBlobs(blobs)
            named = [a for a in argv if os.path.exists(a)] if cmd else []
            manifest = load_manifest(blob_map, snap)
            if build and code_globs != ("none",):
                named += buildreplay.code_paths(
                    {r: manifest.trees.get(r, {}) for r in manifest.roots},
                    recorded_rules(started), code_globs or buildreplay.CODE_GLOBS)
            mounts = prepare_workspace(manifest, blob_map, recorded_rules(started),
                                       tape / "ws", live=[*live, *named],
                                       secrets=secret_files,
                                       secret_rules=recorded_secrets(
                                           started, keyshapes.for_run(started)))
            write_values({v for n in secret_files for v in n.values}, tape)
        sealed_cwd = cwd if isinstance(cwd, str) and mounts else None
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            cwd = None
        if keep_writes is not None:
            Path(keep_writes).mkdir(parents=True, exist_ok=True)
        cut = (ended.get("stdout_bytes"), ended.get("stderr_bytes"))
        result = run_under_shim(argv, _shim_env(env, "replay", **extra),
                                cwd=cwd, passthrough=not as_json,
                                seal=None if unsealed else _seal(
                                    started, ended, tape, mounts, keep_writes, sealed_cwd),
                                cut=cut if killed and all(isinstance(n, int) for n in cut)
                                else None,
                                stop_on=None if lenient else tape / "divergence")
        if build:
            report = buildreplay.report(file, tape, events, ended, result, argv,
                                        compare_output)
            if old_tape:
                report["notes"] = [f"recorded with shim protocol {recorded}: its C tape is "
                                   "not served (every clock, entropy and listing read ran "
                                   "live)"]
        else:
            report = _report(file, tape, started, ended, result, argv)
        if protocol is not None and protocol != PROTOCOL:
            report.setdefault("notes", []).append(
                f"recorded with shim protocol {recorded}, read as protocol {PROTOCOL} (the "
                "records it no longer serves left out)")
        if secret_files:
            report["secret_files"] = [n.to_json() for n in secret_files]
    finally:  # (the values the hooks learnt go with the tape)
        if not keep_tape:
            shutil.rmtree(tape, ignore_errors=True)
        if keep_writes is not None:  # overlayfs's work directories: nothing to keep
            for w in Path(keep_writes).glob(".work-*"):
                shutil.rmtree(w, ignore_errors=True)
    if build:
        if as_json:
            click.echo(json.dumps(report, sort_keys=True, default=str))
        else:
            buildreplay.print_report(report, lambda line: click.echo(line, err=True))
        if report["divergences"]:
            if not as_json:
                raise ReplayDiverged(f"build replay diverged ({len(report['divergences'])} "
                                     "divergence(s))", file)
            sys.exit(ReplayDiverged.exit_code)
        return
    _print_report(report, as_json)
    if report["divergences"]:
        if not as_json:
            raise ReplayDiverged(f"replay diverged ({len(report['divergences'])} divergence(s))",
                                 file)
        sys.exit(ReplayDiverged.exit_code)
    if not all(report["identical"].values()):
        different = ", ".join(k for k, v in report["identical"].items() if not v)
        if not as_json:
            raise ReplayDiverged(f"replay is not bit-identical ({different} differ)", file)
        sys.exit(ReplayDiverged.exit_code)


def _redacted_note(redacted: list[tuple[str, Any]]) -> str:
    """What the record's summary line says of the files stored masked."""
    files = {rel for rel, s in redacted if s.why == "file"}
    scanned = {rel: s.hits for rel, s in redacted if s.why == "content"}
    parts = []
    if files:
        parts.append(f"{len(files)} secret file(s) masked ({', '.join(sorted(files)[:3])}"
                     f"{' ...' if len(files) > 3 else ''})")
    if scanned:
        parts.append(f"{sum(scanned.values())} secret value(s) masked in {len(scanned)} "
                     "other file(s)")
    return "; " + ", ".join(parts) if parts else ""


def _here(cmd: list[str], recorded_cwd: Any) -> list[str]:
    """A command typed here runs in the recorded working directory: if that is not this
    one, its relative paths that name files here (the program, a script) are made
    absolute first."""
    if not isinstance(recorded_cwd, str) or os.path.realpath(recorded_cwd) == os.getcwd():
        return cmd
    out = []
    for i, a in enumerate(cmd):
        if not os.path.isabs(a) and ((i == 0 and "/" in a) or i > 0) and os.path.isfile(a):
            a = os.path.abspath(a)
        out.append(a)
    return out


def _killed_by(ended: dict[str, Any]) -> int | None:
    """The signal that ended the recorded run, if one did (exit status ``-signal``)."""
    status = ended.get("status")
    return -status if isinstance(status, int) and status < 0 else None


def _seal(started: dict[str, Any], ended: dict[str, Any], tape: Path,
          workspaces: list[WorkspaceMount] | None = None, keep_writes: str | None = None,
          cwd: str | None = None) -> Seal:
    """The replay's private view of /tmp, host state and the workspace (``launch.Seal``)."""
    hide = ended.get("tmp_created") or {}
    state = started.get("sealed_state") or {}
    stage = tape / ".seal"
    stage.mkdir(exist_ok=True)
    return Seal(
        hide={str(k): [str(n) for n in v] for k, v in hide.items() if isinstance(v, list)},
        state={str(k): v for k, v in state.items() if v is None or isinstance(v, dict)},
        keep=[str(tape.resolve())], stage=str(stage.resolve()),
        workspaces=workspaces or [], cwd=cwd,
        keep_writes=str(Path(keep_writes).resolve()) if keep_writes else None)


def _report(file: str, tape: Path, started: dict[str, Any], ended: dict[str, Any],
            result: RunResult, argv: list[str]) -> dict[str, Any]:
    found = read_divergences(tape)
    divs, drift = [], []
    stacks = python_stacks(tape)
    for d in found:
        entry = d.to_json()
        if d.kind == "divergence" and d.proc in stacks:
            entry["python_stack"] = stacks.pop(d.proc)
        if d.kind == "divergence" and d.detail:
            divs.append(entry)  # a Python hook's call: its report carries the diff
        elif d.kind == "divergence":
            before = stream_records(tape, d.proc, d.thread, d.channel)[max(0, d.pos - 5):d.pos]
            entry["before"] = [describe(ch, op, p) for ch, op, p in before]
            divs.append(entry)
        else:
            drift.append(entry)
    same = {
        "stdout": result.stdout_sha256 == ended.get("stdout_sha256"),
        "stderr": result.stderr_sha256 == ended.get("stderr_sha256"),
        "exit_status": result.status == ended.get("status"),
    }
    report: dict[str, Any] = {
        "file": file,
        "argv": argv,
        "divergences": divs,
        "drift": drift,
        "exit_status": {"recorded": ended.get("status"), "replayed": result.status},
        "identical": same,
    }
    killed = _killed_by(ended)
    if killed is not None:
        # A kill lands between two taped calls; the replay ends at the next one, so it
        # may print what the recorded run was killed before printing. What the recorded
        # run printed must come out first, byte for byte.
        past = {}
        for name, prefix, n in (("stdout", result.stdout_prefix_sha256, result.stdout_bytes),
                                ("stderr", result.stderr_prefix_sha256, result.stderr_bytes)):
            recorded_n = ended.get(f"{name}_bytes")
            if not same[name] and prefix is not None and prefix == ended.get(f"{name}_sha256"):
                same[name] = True
                past[name] = n - int(recorded_n or 0)
        report["killed"] = {"signal": killed, "after_kill_bytes": past}
    return report


def _print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=None, sort_keys=True))
        return
    err = True
    for d in report["drift"]:
        click.echo(f"stenograph: drift: process {d['proc']} thread {d['thread']} "
                   f"{d['channel']}#{d['position']}: {d['asked']}", err=err)
    for d in report["divergences"]:
        if d.get("detail"):
            click.echo(f"stenograph: divergence: process {d['proc']} channel {d['channel']} "
                       f"position {d['position']}", err=err)
            for line in d["detail"]:
                click.echo(f"  {line}", err=err)
            continue
        click.echo(f"stenograph: divergence: process {d['proc']} thread {d['thread']} "
                   f"channel {d['channel']} position {d['position']}", err=err)
        click.echo(f"  recorded: {d['recorded']}", err=err)
        click.echo(f"  asked:    {d['asked']}", err=err)
        for line in d.get("before", []):
            click.echo(f"  before:   {line}", err=err)
        for line in d.get("python_stack", []):
            click.echo(f"  where:    {line}", err=err)
    if report["divergences"] or not all(report["identical"].values()):
        for n in report.get("secret_files", []):  # a masked secret file may be why
            if n["served"] == "masked" or n["same"] is False:
                click.echo(f"stenograph: note: {SecretServed(**n).line()}", err=err)
    if not report["divergences"]:
        same = report["identical"]
        verdict = "bit-identical" if all(same.values()) else "DIFFERENT"
        if report.get("killed") and all(same.values()):
            verdict += f" up to the kill (signal {report['killed']['signal']})"
            past = report["killed"]["after_kill_bytes"]
            verdict += "".join(f"; {n} byte(s) of {k} after the point the recorded run "
                               f"was killed at" for k, n in past.items() if n)
        parts = ", ".join(f"{k} {'identical' if v else 'differs'}" for k, v in same.items())
        click.echo(f"stenograph: replay {verdict}: {parts}", err=err)
