"""Open a store for writing: through its host recorder when one serves it (or when a
recording starts one), else directly.

``stenograph record --store S`` (and ``resume``) writes through the store's host recorder
(``recorder/hostserver.py``), starting one if none serves the store: detached, in its own
session, its output in ``STORE/serve.log``, ending after ``IDLE`` seconds with no client.
So many recordings share the store and its one group commit, and a user who never heard
of ``stenograph serve`` changes nothing. A short command (``settle``, ``approve``, ``log
append``) writes through a running one, and opens the store itself when none runs.
``STENO_HOST_RECORDER=off`` keeps a recording from starting one (it then holds the
store alone, as a worker's shared writer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import StenographError, StoreLocked
from stenograph.recorder.hostclient import RemoteStore, serving
from stenograph.recorder.hostwire import LOG_NAME, host_serves
from stenograph.recorder.store import Store

IDLE = 30.0
"""Seconds a host recorder a recording started waits with no client before it ends."""

START_WAIT = 15.0


def enabled() -> bool:
    return os.environ.get("STENO_HOST_RECORDER", "").lower() not in ("off", "0", "no")


def open_writer(store: Path, *, lease: Any = None, start: bool = False,
                on_lost: Callable[[StenographError], None] | None = None,
                shared: bool = False) -> Store | RemoteStore:
    """``store`` for writing: a ``RemoteStore`` through its host recorder (started first
    when ``start`` and none serves), else the ``Store`` itself (``shared``: as a worker
    holding a lease)."""
    if enabled() and (serving(store) or (start and _start(store))):
        try:
            return RemoteStore(store, traj=getattr(lease, "traj", None),
                               token=getattr(lease, "token", None),
                               epoch=int(getattr(lease, "epoch", 0) or 0), on_lost=on_lost)
        except OSError:  # it went away between the look and the connect
            if not start or not _start(store):
                return _local(store, shared)
            return RemoteStore(store, traj=getattr(lease, "traj", None),
                               token=getattr(lease, "token", None),
                               epoch=int(getattr(lease, "epoch", 0) or 0), on_lost=on_lost)
    return _local(store, shared)


def _local(store: Path, shared: bool) -> Store:
    """The store opened here: never beside a host recorder that holds it (two writers
    would each append at what they think is the tail)."""
    if host_serves(store):
        raise StoreLocked("a host recorder holds this store and does not answer: stop it "
                          "(its pid is in serve.lock) or wait for it to end", str(store))
    return Store(store, shared=shared)


def _start(store: Path) -> bool:
    """Start a host recorder for ``store`` and wait until it serves; False if it could
    not start (the store is held by an older writer: the caller opens it itself)."""
    log = os.open(Path(store) / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stenograph", "serve", str(store), "--idle", str(IDLE)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            close_fds=True, env={k: v for k, v in os.environ.items()
                                 if not k.startswith("STENO_") and k != "LD_PRELOAD"})
    finally:
        os.close(log)
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        if serving(store):
            return True
        if proc.poll() is not None and not host_serves(store):
            return serving(store)  # it could not serve (a writer holds the store)
        time.sleep(0.01)  # (or another started first: it serves in a moment)
    return serving(store)


def serve_lost_line(store: str, traj: str, err: StenographError) -> str:
    """The one line a recording stopped by the loss of its host recorder ends with."""
    what = str(err.args[0] if err.args else err)
    return f"{what}; `stenograph resume {store} {traj}` goes on from its last durable event"


def alone(store: Path, what: str) -> None:
    """Before a command that must have the store to itself (``gc``, ``log import``): an
    idle host recorder is asked to end, and waited for; a busy one refuses it, in one
    line."""
    if not host_serves(store):
        return
    try:
        with RemoteStore(store) as rs:
            busy = rs.end_if_idle()
    except (OSError, StenographError):
        busy = 0
    if busy:
        raise StoreLocked(f"a host recorder serves {busy} recording(s) of this store: "
                          f"{what} runs once they have ended", str(store))
    deadline = time.monotonic() + START_WAIT
    while host_serves(store) and time.monotonic() < deadline:
        time.sleep(0.01)
