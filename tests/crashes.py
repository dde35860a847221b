"""Crashing a recorded run from outside at a known point, for every test that crashes
agents: the whole process group (the recorder and the program) is killed with SIGKILL.

* ``kill_at_request``: as the model server receives its n-th request;
* ``Run`` / ``service`` / ``go``: at a boundary of the effect sequence, seen by the
  effect service (``("dispatch", n)``: the n-th mutating request arrives, its intent
  durable, not applied; ``("applied", n)``: applied, before its answer; ``("read", n)``:
  the n-th GET arrives) or after a delay (``("timer", seconds)``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.testing.effect_service import Drop, EffectService


def kill_at_request(proc: subprocess.Popen[Any], server: Any, n: int) -> threading.Thread:
    """Watch ``server.requests``; SIGKILL ``proc``'s process group (it must lead one:
    ``start_new_session=True``) once there are ``n``. The server should answer slowly
    (``Knobs(delay_ms=...)``) for the kill to land before the n-th reply."""
    def watch() -> None:
        while proc.poll() is None:
            if len(server.requests) >= n:
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@dataclass
class Run:
    """One record or resume, and where it is to be killed (None: not killed)."""

    kill: tuple[Any, ...] | None
    resume: bool = False
    posts: int = 0
    reads: int = 0
    proc: subprocess.Popen[str] | None = None
    killed: threading.Event = field(default_factory=threading.Event)

    def hit(self, kind: str, n: int) -> None:
        if (self.kill is not None and tuple(self.kill[:2]) == (kind, n)
                and self.proc is not None and not self.killed.is_set()):
            self.killed.set()
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise Drop()


def service(current: list[Run]) -> EffectService:
    """An effect service that kills ``current[0]`` at its boundary (not started)."""
    svc = EffectService()

    def on_effect(path: str, headers: dict[str, str]) -> None:
        run = current[0]
        run.posts += 1
        run.hit("dispatch", run.posts)

    def after_effect(path: str, headers: dict[str, str]) -> None:
        current[0].hit("applied", current[0].posts)

    def on_read(path: str) -> None:
        run = current[0]
        run.reads += 1
        run.hit("read", run.reads)

    def after_answer(path: str, headers: dict[str, str]) -> None:
        run = current[0]
        n = run.posts
        if run.kill is not None and run.kill[0] == "answered" and run.kill[1] == n:
            time.sleep(float(run.kill[2]) if len(run.kill) > 2 else 0.0)
            with contextlib.suppress(Drop):
                run.hit("answered", n)

    svc.on_effect, svc.after_effect, svc.on_read = on_effect, after_effect, on_read
    svc.after_answer = after_answer
    return svc


def started(store: Path, traj: str = "t") -> bool:
    """Does the store hold the trajectory (a kill may land before its first event)?"""
    from stenograph.recorder.reader import StoreReader

    return (store / "wal").is_dir() and any(True for _ in StoreReader(store).events(traj=traj))


def go(run: Run, argv: list[str], cwd: Path, env: dict[str, str],
       stdout: Any = subprocess.PIPE, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``run`` (its own process group), killed as ``run.kill`` says; no
    process of it outlives the call."""
    run.proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                                stdout=stdout, stderr=subprocess.PIPE, text=True)
    timer = None
    if run.kill and run.kill[0] == "timer":
        def fire() -> None:
            if run.proc is not None and run.proc.poll() is None and not run.killed.is_set():
                run.killed.set()
                os.killpg(run.proc.pid, signal.SIGKILL)
        timer = threading.Timer(run.kill[1], fire)
        timer.start()
    try:
        out, err = run.proc.communicate(timeout=timeout)
    finally:
        if timer is not None:
            timer.cancel()
        with contextlib.suppress(ProcessLookupError):  # nothing may outlive its run
            os.killpg(run.proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, run.proc.returncode, out, err)
