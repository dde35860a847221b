"""The recorder's end of the Python-level tape (``interpose.pytape``).

Record: ``ExchangeServer`` listens on a unix ``SOCK_SEQPACKET`` socket; every
message is one finished call (HTTP exchange, model or tool call) as a msgpack
map. It is appended as an ``Exchange`` event and made durable before the one-byte
acknowledgement goes back, so the program never acts on a result the log could
lose.

Replay: ``prepare_py_tape`` turns a trajectory's ``Exchange`` events into the
per-process files the hooks serve from, and copies the blobs they reference.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.blobs import BlobStore, blob_refs
from stenograph.recorder.codec import Event

MAX_MESSAGE = 1 << 20


class ExchangeServer:
    """Accepts exchange messages from every process of a recorded tree."""

    def __init__(self, store: Any, traj: str, sock_path: str | Path) -> None:
        self.store = store
        self.traj = traj
        self.path = str(sock_path)
        self.count = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._closing = False
        self._accept = threading.Thread(target=self._accept_loop, name="steno-exchanges",
                                        daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    msg = conn.recv(MAX_MESSAGE)
                except OSError:
                    return
                if not msg:
                    return
                try:
                    body = msgpack.unpackb(msg, raw=False, strict_map_key=False)
                    if not isinstance(body, dict):
                        raise ValueError("exchange message is not a map")
                    self.store.append(self.traj, "Exchange", body, durable=True)
                    with self._lock:
                        self.count += 1
                    conn.sendall(b"\x01")
                except Exception as exc:  # report, and let the client fail
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    return

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for t in self._threads:
            t.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def prepare_py_tape(events: Iterable[Event], tape_dir: str | Path,
                    blobs: dict[str, bytes] | BlobStore | None = None) -> dict[str, int]:
    """Write ``tape_dir/py/<proc>.msgpack`` and ``tape_dir/blobs``; return counts per proc."""
    tape_dir = Path(tape_dir)
    by_proc: dict[str, dict[str, list[dict[str, Any]]]] = {}
    out_blobs = BlobStore(tape_dir / "blobs")
    for ev in events:
        if ev.kind != "Exchange":
            continue
        body = ev.body
        by_proc.setdefault(str(body["proc"]), {}).setdefault(str(body["channel"]), []).append(body)
        for ref in blob_refs(body):
            if out_blobs.has(ref.sha256):
                continue
            if isinstance(blobs, dict):
                data = blobs[ref.sha256]
            elif blobs is not None:
                data = blobs.get(ref)
            else:
                raise KeyError(f"blob {ref.sha256} referenced but no blobs were given")
            out_blobs.put(data)
    (tape_dir / "py").mkdir(parents=True, exist_ok=True)
    counts = {}
    for proc, channels in by_proc.items():
        for entries in channels.values():
            entries.sort(key=lambda e: e["pos"])
        (tape_dir / "py" / f"{proc}.msgpack").write_bytes(
            msgpack.packb(channels, use_bin_type=True))
        counts[proc] = sum(len(v) for v in channels.values())
    return counts
