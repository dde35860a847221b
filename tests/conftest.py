"""Shared helpers for the recorder tests.

Everything here works on real files with real ``fdatasync``: stores live under
pytest's temporary directory. Hypothesis tests cannot use the function-scoped
``tmp_path`` fixture (one directory would be shared by every example), so they
take fresh directories from ``scratch``.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from warm import db, pg, s3  # noqa: F401 (the warm tier's servers: test_ship, test_fleet)

from stenograph.recorder.codec import Event
from stenograph.recorder.group_commit import CommitSettings
from stenograph.recorder.store import StoreSettings

SEGMENT_BYTES = 64 * 1024
SMALL = StoreSettings(segment_bytes=SEGMENT_BYTES)
"""Small segments, so that a few hundred events rotate through several files."""


def small_settings(**commit: Any) -> StoreSettings:
    return StoreSettings(segment_bytes=SEGMENT_BYTES, commit=CommitSettings(**commit))


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """A factory of fresh, not yet existing directory paths (usable in hypothesis)."""
    base = tmp_path_factory.mktemp("scratch")
    counter = itertools.count()

    def fresh() -> Path:
        return base / f"d{next(counter)}"

    return fresh


class Model:
    """The events a test expects, built from what it appended, independently of the store.

    ``add`` must be called in LSN order; ``seq`` and ``prev`` follow from that order
    alone (``seq`` counts from 0 per trajectory, ``prev`` is the LSN of the
    trajectory's previous event).
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._last: dict[str, tuple[int, int]] = {}

    def add(self, lsn: int, traj: str, kind: str, body: dict[str, Any]) -> Event:
        assert lsn == len(self.events) + 1, "model events must be added in LSN order"
        seq, prev = self._last.get(traj, (-1, None))
        ev = Event(lsn, traj, seq + 1, prev, kind, body)
        self._last[traj] = (seq + 1, lsn)
        self.events.append(ev)
        return ev

    def truncated(self, n: int) -> Model:
        """The model of the first ``n`` events."""
        m = Model()
        for ev in self.events[:n]:
            m.add(ev.lsn, ev.traj, ev.kind, ev.body)
        return m

    @classmethod
    def from_appends(cls, appends: Iterable[tuple[int, str, str, dict[str, Any]]]) -> Model:
        """Build from ``(lsn, traj, kind, body)`` in any order (e.g. from many threads)."""
        m = cls()
        for lsn, traj, kind, body in sorted(appends, key=lambda a: a[0]):
            m.add(lsn, traj, kind, body)
        return m


def dir_digest(root: Path, *, skip_lock_content: bool = True) -> dict[str, str]:
    """Relative path -> sha256 of every file (and '<dir>' for directories) under ``root``.

    The ``LOCK`` file's *content* (the pid of the last process that took the lock)
    is not data; only its existence is compared when ``skip_lock_content``.
    """
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = "<dir>"
        elif skip_lock_content and rel == "LOCK":
            out[rel] = "<lock>"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def segments(store: Path) -> list[Path]:
    return sorted((store / "wal").glob("*.seg"))


def flip_bit(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1, f"offset {offset} is past the end of {path}"
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


class _CountingHandler(BaseHTTPRequestHandler):
    """Answers every GET and POST with ``got N`` (N: request body bytes)."""

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = f"got {len(self.rfile.read(n))}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def counting_server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 for programs under record; its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
