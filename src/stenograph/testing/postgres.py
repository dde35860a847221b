"""A private PostgreSQL 15 cluster from Debian's package, for the tests that record
``psql`` against a real database and for the benchmarks that compare against one: a
fresh data directory, a free port on 127.0.0.1, run as the ``postgres`` user when this
process is root (the server refuses root), stopped on the way out."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def installed() -> bool:
    return (PG_BIN / "initdb").exists()


@contextlib.contextmanager
def cluster(base: Path, *, options: str = "", stop: str = "immediate") -> Iterator[int]:
    """Start a cluster in ``base`` (``options``: more ``-c name=value`` for the server);
    yield its port; stop it (``pg_ctl -m stop``)."""
    base.mkdir(parents=True, exist_ok=True)
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
                        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 {options}",
                        "start"], check=True, capture_output=True, timeout=120)
        yield port
    finally:
        subprocess.run([*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", stop,
                        "stop"], capture_output=True, timeout=60)
