"""The host recorder: one process per store on a host, the store's one writer, taking the
events of every recording on the host (``stenograph serve STORE``).

Each ``stenograph record`` (or ``resume``, ``fork``, ``settle``...) into a store connects
here instead of opening the store itself (``hostclient.RemoteStore``), so any number of
agents record into one store at once, every trajectory under its own lease, and their
durable events share one group commit: the loop enqueues every append as it arrives,
and a syncer thread makes everything enqueued durable with one ``fdatasync``, answering
each durable append the sync covered; appends that arrive while a sync is in flight
ride the next one. N agents on a host pay one barrier per batch, not N.

Who may write: the socket is the store's own (``STORE/serve.sock``, mode 0600 in a 0700
directory), and each connection's peer credentials (``SO_PEERCRED``) are checked: its
uid must be the store owner's, or one the store's config names (``hostconfig``). A
connection that names a trajectory and its lease writes only that trajectory, and only
while the lease is its own: once another worker has taken it over (epoch + 1) every
write it sends is refused (``fenced``) and the connection closed.

A crash of the host recorder loses no acknowledged event: a durable append is answered
only after its sync returned. Its clients see the connection end and stop, each with one
line (``HostRecorderLost``); the trajectories are resumed as after any crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import StenographError, StoreLocked
from stenograph.recorder.hostconfig import HostConfig
from stenograph.recorder.hostwire import (
    LOCK_NAME,
    VERSION,
    FrameReader,
    address,
    pack,
)
from stenograph.recorder.leases import LocalLeases
from stenograph.recorder.store import Store

LEASE_CHECK = 0.5
"""Seconds between checks of a connection's lease for its non-durable appends (a durable
one -- an intent, an exchange -- is checked every time: it is what fencing is for)."""


@dataclass
class _Conn:
    sock: socket.socket
    pid: int
    uid: int
    reader: FrameReader = field(default_factory=FrameReader)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    traj: str | None = None
    token: str | None = None
    epoch: int = 0
    client_pid: int = 0
    checked: float = 0.0
    appended: int = 0
    last_lsn: int = 0
    since: float = field(default_factory=time.time)
    closed: bool = False

    def send(self, doc: dict[str, Any]) -> None:
        with self.send_lock:
            if self.closed:
                return
            with contextlib.suppress(OSError):
                self.sock.sendall(pack(doc))


class HostRecorder:
    """Serve ``store`` until ``idle`` seconds pass with no client (None: for ever)."""

    def __init__(self, store: Path, *, idle: float | None = 60.0) -> None:
        self.path = Path(store)
        self.idle = idle
        self.config = HostConfig.of(self.path)
        self._lock_fd = _serving_lock(self.path)
        try:
            self.store = Store(self.path, create=False, host=True)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.leases = LocalLeases(self.path)
        self.address = address(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if isinstance(self.address, str):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)
            old = os.umask(0o177)
            try:
                self._sock.bind(self.address)
            finally:
                os.umask(old)
        else:
            self._sock.bind(self.address)
        self._sock.listen(512)
        self._sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._conns: dict[socket.socket, _Conn] = {}
        self._waiters: list[tuple[int, _Conn, Any]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.poisoned: dict[str, Any] | None = None
        """Once a sync failed: the error every request is answered with (its errno, as
        the store would have raised it)."""
        self.syncs = 0
        self._syncer = threading.Thread(target=self._sync_loop, name="steno-host-sync",
                                        daemon=True)
        self._syncer.start()

    # -- the loop

    def serve_forever(self) -> None:
        quiet_since = time.monotonic()
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=1.0):
                    if key.fileobj is self._sock:
                        self._accept()
                    else:
                        assert isinstance(key.fileobj, socket.socket)
                        self._readable(self._conns[key.fileobj])
                if self._conns:
                    quiet_since = time.monotonic()
                elif self.idle is not None and time.monotonic() - quiet_since > self.idle:
                    return
        finally:
            self.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            conn = _Conn(sock, pid, uid)
            if not self.config.admits(uid, self.path):
                conn.send({"error": f"uid {uid} may not write this store (its owner's, "
                                    "or one its config names)"})
                sock.close()
                continue
            sock.setblocking(False)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, None)

    def _readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        try:
            frames = conn.reader.feed(data)
        except ValueError as exc:
            self._refuse(conn, f"a bad frame: {exc}")
            return
        for doc in frames:
            if conn.closed:
                return
            try:
                self._handle(conn, doc)
            except StenographError as exc:
                self._refuse(conn, str(exc))
            except (KeyError, TypeError, ValueError) as exc:
                self._refuse(conn, f"a bad request: {type(exc).__name__}: {exc}")

    def _handle(self, conn: _Conn, doc: dict[str, Any]) -> None:
        op = doc.get("op")
        rid = doc.get("id")
        if self.poisoned is not None:  # a write the system refused: said to each request
            if rid is not None:
                conn.send({"id": rid, **self.poisoned})
        elif op == "append":
            traj = str(doc.get("traj") or conn.traj or "")
            if conn.traj is not None and traj != conn.traj:
                raise StenographError(f"this connection writes {conn.traj}, not {traj}")
            durable = bool(doc.get("durable"))
            self._check_lease(conn, traj, durable)
            lsn = self.store.append_packed(traj, str(doc["kind"]), bytes(doc["body"]),
                                           durable=False)
            conn.appended += 1
            conn.last_lsn = lsn
            if durable:
                self._wait_sync(lsn, conn, rid)
            elif rid is not None:
                conn.send({"id": rid, "lsn": lsn})
        elif op == "flush":
            if doc.get("all"):  # a reader: first what every client already sent
                self._take_pending(conn)
            self._wait_sync(self.store.last_lsn, conn, rid)
        elif op == "synced":
            conn.send({"id": rid, "synced": self.store.synced_lsn})
        elif op == "next_seq":
            conn.send({"id": rid, "seq": self.store.next_seq(str(doc["traj"]))})
        elif op == "sessions":
            conn.send({"id": rid, "sessions": self.sessions()})
        elif op == "end_if_idle":  # a command that needs the store alone (gc, import)
            others = [c for c in self._conns.values() if c is not conn]
            if not others:
                self._stop.set()
            conn.send({"id": rid, "ending": not others, "clients": len(others)})
        elif op == "hello":
            if doc.get("version") != VERSION:
                raise StenographError(f"client speaks version {doc.get('version')}, "
                                      f"this host recorder {VERSION}")
            conn.traj = doc.get("traj") or None
            conn.token = doc.get("token") or None
            conn.epoch = int(doc.get("epoch") or 0)
            conn.client_pid = int(doc.get("pid") or conn.pid)
            if conn.traj is not None and conn.token is not None:
                self._check_lease(conn, conn.traj, True)
            conn.send({"ok": True, "server": os.getpid(), "id": rid})
        else:
            raise StenographError(f"unknown request {op!r}")

    def _take_pending(self, asking: _Conn) -> None:
        """Read what the other clients have sent and this loop not yet taken (a client
        killed a moment ago may have left its last appends in its socket): a reader that
        asks for everything gets them too."""
        others = [c.sock for c in self._conns.values() if c is not asking]
        for _ in range(64):
            ready, _w, _x = select.select(others, [], [], 0) if others else ([], [], [])
            if not ready:
                return
            for sock in ready:
                conn = self._conns.get(sock)
                if conn is not None and not conn.closed:
                    self._readable(conn)
            others = [c.sock for c in self._conns.values() if c is not asking]

    def _check_lease(self, conn: _Conn, traj: str, always: bool) -> None:
        if conn.token is None:
            return
        now = time.monotonic()
        if not always and now - conn.checked < LEASE_CHECK:
            return
        cur = self.leases.current(traj)
        if cur is None or cur.token != conn.token:
            who = f" (now epoch {cur.epoch}, pid {cur.pid} on {cur.host})" if cur else ""
            conn.send({"error": f"{traj}: this worker's lease was taken over{who}",
                       "fenced": True})
            raise _Fenced()
        conn.checked = now

    def _wait_sync(self, lsn: int, conn: _Conn, rid: Any) -> None:
        with self._cond:
            self._waiters.append((lsn, conn, rid))
            self._cond.notify()

    def _refuse(self, conn: _Conn, why: str) -> None:
        conn.send({"error": why})
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        """A client gone (or refused): what it appended is made durable now, not at some
        other client's next sync, so the store a person reads after a crash does not
        change under them."""
        if conn.appended and conn.last_lsn > self.store.synced_lsn:
            self._wait_sync(conn.last_lsn, conn, None)
        with conn.send_lock:
            conn.closed = True
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        self._conns.pop(conn.sock, None)
        conn.sock.close()

    # -- the syncer: one fdatasync for everything enqueued

    def _sync_loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiters and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set() and not self._waiters:
                    return
            try:
                self.store.flush()
                self.syncs += 1
            except Exception as exc:  # the disk refused: nothing more is acknowledged
                self.poisoned = {"error": str(getattr(exc, "strerror", None) or exc),
                                 "errno": getattr(exc, "errno", None),
                                 "filename": getattr(exc, "filename", None)}
                with self._cond:
                    waiters, self._waiters = self._waiters, []
                for _lsn, conn, rid in waiters:
                    if rid is not None:
                        conn.send({"id": rid, **self.poisoned})
                continue
            synced = self.store.synced_lsn
            with self._cond:
                done = [w for w in self._waiters if w[0] <= synced]
                self._waiters = [w for w in self._waiters if w[0] > synced]
            for lsn, conn, rid in done:
                if rid is not None:
                    conn.send({"id": rid, "lsn": lsn, "synced": synced})

    def sessions(self) -> list[dict[str, Any]]:
        """The connections that write a trajectory: what ``status --json`` shows."""
        synced = self.store.synced_lsn
        return [{"traj": c.traj, "pid": c.client_pid, "epoch": c.epoch,
                 "appended": c.appended, "lag": max(0, c.last_lsn - synced),
                 "since": c.since} for c in list(self._conns.values()) if c.traj]

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._syncer.join(timeout=30)
        for conn in list(self._conns.values()):
            self._drop(conn)
        with contextlib.suppress(OSError):
            self._sel.close()
        self._sock.close()
        if isinstance(self.address, str):
            with contextlib.suppress(OSError):
                os.unlink(self.address)
        try:
            self.store.close()
        finally:
            os.close(self._lock_fd)


class _Fenced(StenographError):
    """A write of a worker whose lease another has taken: refused (already answered)."""


def _serving_lock(store: Path) -> int:
    """Hold ``STORE/serve.lock``: one host recorder per store (``StoreLocked`` naming the
    one that serves)."""
    fd = os.open(store / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreLocked(f"a host recorder already serves this store (pid {holder})",
                          str(store)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
