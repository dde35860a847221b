"""One program under the shim, recorded into a trajectory: what record, resume and fork
share.

A ``LiveSession`` is an open store, the C tape's recorder (``recorder/tape.RecordSession``,
fed by the shim's rings), the hooks' exchange server (``recorder/exchanges.ExchangeServer``:
every Python-level call appended before the program sees its result; intents,
approvals and an effect's answer synced first), the thread that syncs the store every
``FLUSH_EVERY`` seconds, the worker's lease when there is one, and the ``RunEnded`` that
closes the run. Each caller decides only what differs: what the tape holds before the
program starts (nothing, a replayed prefix), where it runs (the real directory, a sealed
namespace) and what is done with the trajectory after.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.checkpoints import Checkpointer
from stenograph.recorder.errors import Paused, StenographError, Stopped
from stenograph.recorder.exchanges import ExchangeServer
from stenograph.recorder.store import Store
from stenograph.recorder.tape import RecordSession, SessionStats
from stenograph.runner.launch import RunResult, kill_tree, run_under_shim
from stenograph.runner.lines import paused_line, stopped_line
from stenograph.runner.redaction import RunRedactor
from stenograph.runner.settings import Settings
from stenograph.runner.worker import Worker

FLUSH_EVERY = 0.2
"""Seconds between syncs of the tape while a run is recorded (barriers sync at once)."""


class Flusher:
    """Sync the store every ``FLUSH_EVERY`` seconds while the program runs."""

    def __init__(self, store: Store) -> None:
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


def read_stalls(path: Path) -> list[dict[str, str]]:
    """The stalls the shim broke while recording (sched.c ``note_stall``), one per line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [dict(f.split("=", 1) for f in line.split("\t") if "=" in f)
            for line in text.splitlines()][:20]


@dataclass(frozen=True)
class Held:
    """A run that stopped before its end and goes on at a resume: held for a person's
    approval (exit 5) or stopped by its policy or budget (exit 6)."""

    paused_for: str | None = None
    paused_call: dict[str, Any] = field(default_factory=dict)
    stopped_for: str | None = None
    stopped_at: dict[str, Any] = field(default_factory=dict)
    drained: bool = False
    """``stenograph drain`` asked: the run stopped at a turn boundary, its lease let go."""

    def error(self, store: str, traj: str) -> StenographError:
        """The one line that says so, with the command to run next."""
        if self.paused_for is not None:
            return Paused(paused_line(store, traj, self.paused_for, self.paused_call))
        return Stopped(stopped_line(store, traj, str(self.stopped_for), self.stopped_at))


SOCKET_ROOM = 100
"""Bytes an AF_UNIX socket path may take here (108 with its NUL, and room for the
shim's ``net/<key>`` names beside it)."""


def socket_dir(prefix: str = "steno-rec-") -> Path:
    """A fresh private directory for a live run's sockets: in the temporary directory,
    unless ``$TMPDIR`` is too deep for a socket path there (a test runner's per-worker
    directories), then in /tmp, then /dev/shm."""
    for base in (None, "/tmp", "/dev/shm"):
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        if len(os.fsencode(str(d / "tape.sock"))) < SOCKET_ROOM - 20:
            return d
        d.rmdir()
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class LiveSession:
    """The recorder of one run (see the module docstring): ``run`` once, then ``ended``
    unless the run was ``held``."""

    def __init__(self, store: Store, traj: str, sock_dir: Path, *,
                 checkpoints: Checkpointer | None = None, authorizer: Any = None,
                 worker: Worker | None = None) -> None:
        self.store, self.traj, self.sock_dir = store, traj, sock_dir
        self.checkpoints = checkpoints
        self.authorizer = authorizer
        self.worker = worker
        self.tape = RecordSession(store, traj, sock_dir / "tape.sock",
                                  epoch=worker.epoch if worker is not None else 0)
        self.drained = False
        self.exchanges = ExchangeServer(
            store, traj, sock_dir / "py.sock",
            after_model=self._turn if checkpoints or worker else None,
            before_intent=checkpoints.before_effect if checkpoints else None,
            before_append=self.tape.drain_all,
            before_approval=checkpoints.at_approval if checkpoints else None,
            authorizer=authorizer)
        if worker is not None and worker.following is not None:  # --db: the fleet's barrier
            self.exchanges.after_intent = self.tape.after_intent = worker.intent_barrier
        if authorizer is not None:  # a program's own HTTP effects and commands obey it too
            self.tape.authorize = self.exchanges.decide
            self.tape.commands = authorizer.policy.commands
            self.tape.on_hold = self.hold
        self.proc: subprocess.Popen[bytes] | None = None
        self.flusher: Flusher | None = Flusher(store)
        self.stats: SessionStats | None = None
        self.result: RunResult | None = None
        self.loss: str | None = None

    def settings(self, mode: str, **more: Any) -> Settings:
        """The run's settings, with this session's sockets, store, trajectory and epoch."""
        fields: dict[str, Any] = {
            "sock": self.tape.sock_path, "pysock": self.exchanges.path,
            "store": Path(self.store.path), "traj": self.traj,
            "epoch": self.worker.epoch if self.worker else None,
            "authorize": self.authorizer is not None}
        return Settings(mode, **{**fields, **more})

    def run(self, argv: Sequence[str], settings: Settings, env: dict[str, str],
            **launch: Any) -> RunResult:
        """The program under the shim with ``settings``; the session stops taking records
        when it exits. What the shim tells the recorder is redacted by the rules the
        program's hooks start from (``runner/redaction.py``). A worker that lost its lease
        meanwhile ends fenced (exit 8)."""
        then = launch.get("started") or (self.worker.started if self.worker else None)

        def started(proc: subprocess.Popen[bytes]) -> None:
            self.proc = proc
            if then is not None:
                then(proc)

        launch["started"] = started
        self.tape.redact = RunRedactor.for_run(env, argv, settings)
        try:
            self.result = run_under_shim(argv, settings.environ(env), **launch)
        finally:
            self.close()
        if self.worker is not None and (lost := self.worker.fenced(look=True)) is not None:
            raise lost
        return self.result

    def hold(self, call_id: str, target: str, summary: str) -> None:
        """The policy holds a command or a program's own request for a person: the
        request is made durable after a cut (every ring drained, the log synced), then the
        whole tree is stopped where it stands -- the held call not made. The run ends
        paused (exit 5); ``approve`` and ``resume`` replay it up to the cut and go on
        live from there, where the call is made (or refused) as decided."""
        self.tape.cut()
        self.exchanges.request_approval(call_id, target, summary)
        if self.proc is not None:
            kill_tree(self.proc.pid)

    def _turn(self, proc: str, pos: int, lsn: int) -> None:
        """A model exchange is durable and its program not answered yet: the turn
        boundary. A checkpoint; and if ``stenograph drain`` asked, the tree stops here
        (the answer is in the log: a resume elsewhere hands it over and goes on)."""
        if self.checkpoints is not None:
            self.checkpoints.model_turn(proc, pos, lsn)
        if self.worker is not None and not self.drained and self.worker.drain_asked():
            self.drained = True
            self.stop()

    def stop(self) -> None:
        """Stop the program's whole tree now (its recording can go on no more)."""
        if self.proc is not None:
            kill_tree(self.proc.pid)

    def close(self) -> None:
        """Stop taking the program's records (again: nothing)."""
        if self.flusher is None:
            return
        self.flusher.close()
        self.flusher = None
        try:
            self.exchanges.close()
        finally:
            self.loss = self.exchanges.loss_note()
            self.stats = self.tape.close()

    @property
    def held(self) -> Held | None:
        """How the run stopped short, if it did (no ``RunEnded``: a resume goes on)."""
        ex = self.exchanges
        if self.drained:
            return Held(drained=True)
        if ex.paused_for is None and ex.stopped_for is None:
            return None
        return Held(ex.paused_for, dict(ex.paused_call), ex.stopped_for, dict(ex.stopped_at))

    @property
    def stalls(self) -> list[dict[str, str]]:
        return read_stalls(self.sock_dir / "stalls")

    def ended(self, **extra: Any) -> None:
        """The run is over: a last checkpoint, then ``RunEnded`` (status, output hashes,
        what the recorder took) with ``extra``."""
        assert self.result is not None and self.stats is not None
        if self.checkpoints is not None:
            self.store.flush()
            self.checkpoints.end(self.store.synced_lsn)
        r, st, ex = self.result, self.stats, self.exchanges
        self.store.append(self.traj, "RunEnded", {
            "status": r.status,
            "at": time.time(),
            "stdout_sha256": r.stdout_sha256,
            "stderr_sha256": r.stderr_sha256,
            "stdout_bytes": r.stdout_bytes,
            "stderr_bytes": r.stderr_bytes,
            "chunks": st.chunks,
            "processes": sorted(st.procs),
            "exchanges": ex.count,
            "exchanges_lost": ex.lost,
            "bodies_lost": ex.bodies_lost,
            "errors": (st.errors + ex.errors)[:20],
            "stalls": self.stalls,
            "checkpoints": len(self.checkpoints.taken) if self.checkpoints else 0,
            **extra,
        })


def sweep_dead_sockets(limit: int = 200) -> int:
    """Remove the socket directories of recorders that were killed (SIGKILL leaves them
    in the temporary directory): an hour old, and nothing accepts on their sockets. A
    directory whose recorder is alive (even a stopped one) still accepts, and stays."""
    removed = 0
    found: list[Path] = []
    for root in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/dev/shm")):  # socket_dir's
        try:
            found += [Path(root) / n for n in os.listdir(root) if n.startswith("steno-rec-")]
        except OSError:
            continue
    for d in found:
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
