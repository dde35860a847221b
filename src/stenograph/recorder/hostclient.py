"""A store written through its host recorder (``hostserver.HostRecorder``): what a
recording, a resume or a short command holds in place of ``Store`` while one serves.

The same calls a recorder makes of a ``Store`` -- ``append`` (durable or not),
``queue``, ``flush``, ``synced_lsn``, ``next_seq``, ``blobs``, ``path`` -- sent over the
store's socket. A non-durable append waits only for its LSN; ``queue`` not even for that
(the tape's chunks); a durable one, or a flush, waits for the answer the server sends
once the sync that covers it returned. Answers come back on a reader thread, matched by id, so many
threads of one recorder wait at once.

When the connection ends unasked (the host recorder was killed, or refused this
worker: its lease was taken over) every call from then on raises -- ``StoreFenced``
(exit 8) or ``HostRecorderLost`` (exit 7) -- and ``on_lost`` is called once, so the
recording stops its program with one line instead of going on unrecorded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event, pack_body
from stenograph.recorder.errors import StenographError, StoreFenced, WriteFailed
from stenograph.recorder.hostwire import VERSION, FrameReader, address, pack
from stenograph.recorder.reader import StoreReader

CONNECT_TIMEOUT = 10.0


class HostRecorderLost(WriteFailed):
    """The host recorder went away (or refused this client) while it wrote through it:
    what it had acknowledged is durable; nothing after is."""


class _Pending:
    __slots__ = ("answer", "done")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: dict[str, Any] = {}


class RemoteStore:
    """``path``'s store, written through the host recorder that serves it."""

    def __init__(self, path: str | Path, *, traj: str | None = None,
                 token: str | None = None, epoch: int = 0,
                 on_lost: Callable[[StenographError], None] | None = None) -> None:
        self.path = Path(path)
        self.blobs = BlobStore(self.path / "blobs")
        self.on_lost = on_lost
        self._sock = connect(self.path)
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._plock = threading.Lock()
        self._ids = itertools.count(1)
        self._lost: StenographError | None = None
        self._closing = False
        self._lose_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="steno-host-client",
                                        daemon=True)
        self._reader.start()
        said = self._ask({"op": "hello", "traj": traj, "token": token, "epoch": epoch,
                          "pid": os.getpid(), "version": VERSION})
        self.server_pid = int(said.get("server") or 0)

    # -- the calls a recorder makes

    def append(self, traj: str, kind: str, body: dict[str, Any], *,
               durable: bool = True) -> int:
        return self.append_packed(traj, kind, pack_body(body), durable=durable)

    def append_packed(self, traj: str, kind: str, body: bytes, *,
                      durable: bool = True) -> int:
        doc = {"op": "append", "traj": traj, "kind": kind, "body": body, "durable": durable}
        return int(self._ask(doc)["lsn"])

    def queue(self, traj: str, kind: str, body: dict[str, Any]) -> None:
        """Append without waiting for anything (the recorder's tape chunks: made durable
        by the next sync, in order with what this client sends after)."""
        self._send({"op": "append", "traj": traj, "kind": kind, "body": pack_body(body),
                    "durable": False})

    def flush(self, *, everyone: bool = False) -> None:
        """Everything this client sent is durable (``everyone``: every client's)."""
        self._ask({"op": "flush", **({"all": True} if everyone else {})})

    @property
    def synced_lsn(self) -> int:
        return int(self._ask({"op": "synced"})["synced"])

    def next_seq(self, traj: str) -> int:
        return int(self._ask({"op": "next_seq", "traj": traj})["seq"])

    def sessions(self) -> list[dict[str, Any]]:
        return list(self._ask({"op": "sessions"})["sessions"])

    def end_if_idle(self) -> int:
        """Ask the host recorder to end if no recording uses it: 0 if it ends, else how
        many clients it still serves."""
        said = self._ask({"op": "end_if_idle"})
        return 0 if said.get("ending") else int(said.get("clients") or 1)

    def events(self, *, traj: str | None = None, from_lsn: int = 0) -> list[Event]:
        self.flush()
        return list(StoreReader(self.path).events(traj=traj, from_lsn=from_lsn))

    def close(self, *, flush: bool = True) -> None:
        """Make what was sent durable (unless ``flush`` is False: a reader that sent
        nothing, asking only how far the log is synced), then let go."""
        if self._closing:
            return
        try:
            if self._lost is None and flush:
                self.flush()
        finally:
            self._closing = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._reader.join(timeout=5)

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire

    def _send(self, doc: dict[str, Any]) -> None:
        if self._lost is not None:
            raise self._lost
        data = pack(doc)
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError:
            self._lose(None)
            assert self._lost is not None
            raise self._lost from None

    def _ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        rid = next(self._ids)
        wait = _Pending()
        with self._plock:
            self._pending[rid] = wait
        try:
            self._send({**doc, "id": rid})
            while not wait.done.wait(1.0):
                if self._lost is not None:
                    raise self._lost
        finally:
            with self._plock:
                self._pending.pop(rid, None)
        if self._lost is not None and not wait.answer:
            raise self._lost
        if wait.answer.get("errno"):  # a write the system refused: as the store says it
            raise OSError(int(wait.answer["errno"]), str(wait.answer["error"]),
                          wait.answer.get("filename") or str(self.path))
        if "error" in wait.answer:
            raise self._lost or HostRecorderLost(str(wait.answer["error"]), str(self.path))
        return wait.answer

    def _read(self) -> None:
        reader = FrameReader()
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._lose(None)
                return
            for doc in reader.feed(data):
                if "error" in doc and "id" not in doc:
                    self._lose(doc)
                    continue
                with self._plock:
                    wait = self._pending.get(doc.get("id"))  # type: ignore[arg-type]
                if wait is not None:
                    wait.answer = doc
                    wait.done.set()

    def _lose(self, doc: dict[str, Any] | None) -> None:
        """The connection ended unasked. ``on_lost`` runs before any waiting call is
        released: a recording stops its program first, so no thread of it is told its
        write failed (a refused intent, say) and acts on that before the stop. A second
        caller waits for the first (the lock), so it returns with ``_lost`` set."""
        with self._lose_lock:
            if self._lost is not None or self._closing:
                return
            if doc is not None and doc.get("fenced"):
                lost: StenographError = StoreFenced(str(doc["error"]), str(self.path))
            elif doc is not None:
                lost = HostRecorderLost(f"the host recorder refused this recording: "
                                        f"{doc['error']}", str(self.path))
            else:
                lost = HostRecorderLost(
                    f"the host recorder of this store (pid "
                    f"{getattr(self, 'server_pid', '?')}) stopped: what it acknowledged is "
                    "durable, this recording stopped there", str(self.path))
            if self.on_lost is not None:
                with contextlib.suppress(Exception):  # (the loss itself is what is reported)
                    self.on_lost(lost)
            self._lost = lost
        with self._plock:
            waits = list(self._pending.values())
        for w in waits:
            w.done.set()


def connect(store: Path, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A connection to ``store``'s host recorder (``OSError`` if none serves it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address(store))
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def synced_lsn(store: Path) -> int | None:
    """How far ``store``'s log is synced, as its host recorder says; None when none
    serves it (then no writer is at work, and what a reader reads is all there is)."""
    try:
        rs = RemoteStore(store)
    except (OSError, StenographError):
        return None
    try:
        return rs.synced_lsn
    except (OSError, StenographError):
        return None
    finally:
        rs.close(flush=False)


def serving(store: Path) -> bool:
    """Does a host recorder serve ``store`` now?"""
    try:
        connect(store, timeout=2.0).close()
    except OSError:
        return False
    return True


def caught_up(store: Path) -> None:
    """Before ``store`` is read to decide something (status, settle, resume): everything
    its host recorder took from any client is on disk, so what a person reads after a
    crash is what the next command sees. Nothing to do when none serves it."""
    if not serving(store):
        return
    with contextlib.suppress(OSError, StenographError), RemoteStore(store) as rs:
        rs.flush(everyone=True)
