"""A private PostgreSQL 15 cluster for the tests that record ``psql`` against a real
database (Debian's package is on the machine; the cluster runs on a free port, as the
``postgres`` user when the tests run as root: the server refuses root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, int, Path]]:
    """A private PostgreSQL 15 cluster on a free port (as the ``postgres`` user when run
    as root: the server refuses root), with a ``payments`` table; removed after."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL 15 is not installed")
    base = Path(tempfile.mkdtemp(prefix="steno-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = base / "data"
    try:
        subprocess.run([*run_as, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres"], check=True, capture_output=True, timeout=120)
        subprocess.run([*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l",
                        str(base / "log"), "-o",
                        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off",
                        "start"], check=True, capture_output=True, timeout=120)
        subprocess.run(["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                        "-c", "CREATE TABLE payments(id serial, amount int, dest text)"],
                       check=True, capture_output=True, timeout=60)
        yield "127.0.0.1", port, base
    finally:
        subprocess.run([*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def rows(port: int) -> int:
    out = subprocess.run(["psql", "-X", "-At", "-h", "127.0.0.1", "-p", str(port), "-U",
                          "postgres", "-c", "SELECT count(*) FROM payments"],
                         capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout)
