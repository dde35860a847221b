"""What the host recorder (``stenograph serve``) and its clients say to each other.

One unix stream socket per store, ``STORE/serve.sock`` (an abstract name derived from
the store when that path is too long for a socket). Each message is a frame: ``u32``
length, little-endian, then one msgpack map. A client says ``hello`` first (who it is,
which trajectory it writes and the lease that lets it), then appends: each a ``kind``
and a msgpack-packed body for its trajectory, ``durable`` or not. The server answers
every request that carries an ``id`` once it is done -- a durable append once the sync
that covers it returned -- in the order the requests came on that connection:

    -> {"op": "hello", "traj", "token", "epoch", "pid", "version"}
    <- {"ok": true, "server": pid}                     or {"error": "..."}
    -> {"op": "append", "kind", "body": packed, "durable": bool, "traj"?, "id"?}
    <- {"id", "lsn"}                                   (when it carried an id)
    -> {"op": "flush" | "synced" | "next_seq" | "sessions", "id", ...}
    <- {"id", "synced" | "seq" | "sessions"}
    -> {"op": "flush", "all": true, "id"}               (a reader: first whatever the
                                                         other clients already sent)
    <- {"error": "...", "fenced": bool}                and the connection closes

A client that loses the connection has lost nothing acknowledged: every answered
durable append was synced before its answer left. A client that goes away (killed) has
what it appended synced at once, not at another client's next sync.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

import msgpack

VERSION = 1
FRAME = struct.Struct("<I")
MAX_FRAME = 64 << 20
SOCKET_NAME = "serve.sock"
LOCK_NAME = "serve.lock"
LOG_NAME = "serve.log"
SOCKET_ROOM = 100
"""Bytes an AF_UNIX path may take here (108 with its NUL)."""


def address(store: Path) -> str | bytes:
    """Where the store's host recorder listens: its socket file, or (a store path too
    deep for one) an abstract name made from the store's device and inode."""
    path = str(Path(store).resolve() / SOCKET_NAME)
    if len(os.fsencode(path)) < SOCKET_ROOM:
        return path
    st = os.stat(store)
    digest = hashlib.sha256(f"{st.st_dev}:{st.st_ino}".encode()).hexdigest()[:24]
    return b"\0stenograph-serve-" + digest.encode()


def pack(doc: dict[str, Any]) -> bytes:
    body = msgpack.packb(doc, use_bin_type=True)
    return FRAME.pack(len(body)) + body


class FrameReader:
    """Frames out of a byte stream, as they complete."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out = []
        while len(self._buf) >= FRAME.size:
            (n,) = FRAME.unpack_from(self._buf)
            if n > MAX_FRAME:
                raise ValueError(f"a frame of {n} bytes")
            if len(self._buf) < FRAME.size + n:
                break
            doc = msgpack.unpackb(bytes(self._buf[FRAME.size:FRAME.size + n]), raw=False)
            del self._buf[:FRAME.size + n]
            if not isinstance(doc, dict):
                raise ValueError("a frame that is not a map")
            out.append(doc)
        return out


def host_serves(store: Path) -> bool:
    """Does a host recorder hold ``store`` now (its ``serve.lock``)? Then the store's
    writer lock is the host recorder's, and says nothing about any one trajectory."""
    import fcntl

    try:
        fd = os.open(Path(store) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
