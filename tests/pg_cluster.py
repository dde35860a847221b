"""A private PostgreSQL 15 cluster for the tests that record ``psql`` against a real
database (``stenograph.testing.postgres``; durability off: these tests kill clients,
not the server), with a ``payments`` table."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stenograph.testing.postgres import cluster, installed


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, int, Path]]:
    """A private cluster on a free port with a ``payments`` table; removed after."""
    if not installed():
        pytest.skip("PostgreSQL 15 is not installed")
    base = Path(tempfile.mkdtemp(prefix="steno-pg-"))
    try:
        with cluster(base, options="-c fsync=off") as port:
            subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U",
                            "postgres", "-c",
                            "CREATE TABLE payments(id serial, amount int, dest text)"],
                           check=True, capture_output=True, timeout=60)
            yield "127.0.0.1", port, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def rows(port: int) -> int:
    out = subprocess.run(["psql", "-X", "-At", "-h", "127.0.0.1", "-p", str(port), "-U",
                          "postgres", "-c", "SELECT count(*) FROM payments"],
                         capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout)
