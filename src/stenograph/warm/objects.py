"""Blobs and snapshots in object storage (the S3 API), content-addressed.

``s3://BUCKET/PREFIX``: each blob is the object ``PREFIX/blobs/<sha256>``, written with
``If-None-Match: *``, so two hosts shipping the same blob never overwrite each other (the
second is told the object is there, which is all it needed to know), and a blob once
there is the blob its name says. The server is reached the way boto3 reaches any
S3-compatible one: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.warm.errors import ObjectStoreError, first_line


@dataclass(frozen=True)
class Bucket:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Bucket:
        if not url.startswith("s3://") or len(url) <= 5:
            raise BadInput("--blobs wants s3://BUCKET[/PREFIX]", url)
        bucket, _, prefix = url[5:].partition("/")
        if not bucket:
            raise BadInput("--blobs wants s3://BUCKET[/PREFIX]", url)
        return cls(bucket, prefix.strip("/"))

    def key(self, sha256: str) -> str:
        return f"{self.prefix}/blobs/{sha256}" if self.prefix else f"blobs/{sha256}"


class ObjectStore:
    """Put and get content-addressed blobs in one bucket (and prefix)."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.where = Bucket.parse(url)
        self.url = url
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise BadInput("--blobs needs boto3: pip install 'stenograph[fleet]'",
                               url) from None
            client = boto3.client("s3", config=Config(retries={"max_attempts": 3},
                                                      connect_timeout=10, read_timeout=60))
        self.client = client
        self._there: set[str] = set()

    def put(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its hash: (hash, whether this call wrote it)."""
        sha = hashlib.sha256(data).hexdigest()
        if sha in self._there:
            return sha, False
        try:
            self.client.put_object(Bucket=self.where.bucket, Key=self.where.key(sha),
                                   Body=data, IfNoneMatch="*")
            wrote = True
        except Exception as exc:  # botocore's ClientError, or a connection's error
            if _code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise ObjectStoreError(f"the object store refused blob {sha[:16]}...: "
                                       f"{first_line(exc)}", self.url) from None
            wrote = False  # (there already: put by this host or another)
        self._there.add(sha)
        return sha, wrote

    def get(self, sha256: str) -> bytes:
        """The blob ``sha256``, checked against its name."""
        try:
            data = self.client.get_object(Bucket=self.where.bucket,
                                          Key=self.where.key(sha256))["Body"].read()
        except Exception as exc:
            raise ObjectStoreError(f"blob {sha256[:16]}... cannot be read: "
                                   f"{first_line(exc)}", self.url) from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ObjectStoreError(f"blob {sha256[:16]}... in the object store is not what "
                                   "its name says", self.url)
        return bytes(data)


def _code(exc: BaseException) -> str:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error") or {}
        code = str(err.get("Code") or "")
        status = str((resp.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
        return code or status
    return ""
