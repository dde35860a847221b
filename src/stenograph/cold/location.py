"""Where an archive lives: a local directory or ``s3://BUCKET/PREFIX``, behind one face.

An archive is a set of named objects (``STENOGRAPH-ARCHIVE``, ``batches/*.json``,
``events/.../*.parquet``, ``trajectories/*.parquet``) and content-addressed blobs.
A local object is written as a temporary file, synced, renamed, and its directory
synced: once ``put`` returns it is durable. An S3 ``PUT`` is durable when it returns.
Blobs go where the fleet's shipper puts them (``warm/objects.py``'s key scheme,
``PREFIX/blobs/<sha256>``; a local archive keeps a ``BlobStore`` in ``blobs/``), so an
archive on the bucket a fleet ships to shares its blobs rather than copying them.

Nothing here knows Parquet: ``cold/archive.py`` writes the bytes, ``cold/query.py`` reads
the local paths ``local_path`` gives (an S3 object is fetched once into a cache, since
DuckDB's S3 reader is an extension this machine cannot download).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.errors import BadInput
from stenograph.recorder.segment import fsync_dir
from stenograph.warm.errors import ObjectStoreError, first_line
from stenograph.warm.objects import ObjectStore, _code

MARKER = "STENOGRAPH-ARCHIVE"
FORMAT = 1


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stenograph" / "archive"


class Location:
    """One archive's objects and blobs (``open_location`` picks the kind)."""

    url: str
    archive_id: str = ""

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def keys(self, prefix: str) -> list[str]: ...
    def remove(self, key: str) -> None: ...
    def put_blob(self, data: bytes) -> bool: ...
    def get_blob(self, sha: str) -> bytes: ...
    def has_blob(self, sha: str) -> bool: ...
    def local_path(self, key: str) -> Path: ...

    def ensure(self, *, create: bool) -> None:
        """Read (or, with ``create``, make) the archive's marker: its id names its cache."""
        if self.exists(MARKER):
            try:
                doc = json.loads(self.get(MARKER))
                self.archive_id = str(doc["id"])
                fmt = int(doc.get("format", 0))
            except (ValueError, KeyError, TypeError):
                raise BadInput("not a stenograph archive (its marker is damaged)",
                               self.url) from None
            if fmt > FORMAT:
                raise BadInput(f"archive format {fmt}; this build reads up to {FORMAT} "
                               "(upgrade stenograph)", self.url)
            return
        if not create:
            raise BadInput("not a stenograph archive (no STENOGRAPH-ARCHIVE; `stenograph "
                           "archive ... --to` makes one)", self.url)
        self.archive_id = uuid.uuid4().hex
        self.put(MARKER, json.dumps({"format": FORMAT, "id": self.archive_id}).encode())


class LocalLocation(Location):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        self.blobs = BlobStore(root / "blobs")

    def _path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise BadInput(f"the archive has no {key}", self.url) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def keys(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def put_blob(self, data: bytes) -> bool:
        return self.blobs.put_new(data)[1]

    def get_blob(self, sha: str) -> bytes:
        return self.blobs.get(sha)

    def has_blob(self, sha: str) -> bool:
        return self.blobs.has(sha)

    def local_path(self, key: str) -> Path:
        return self._path(key)


class S3Location(Location):
    def __init__(self, url: str) -> None:
        self.url = url
        self.objects = ObjectStore(url)
        self.bucket = self.objects.where.bucket
        self.prefix = self.objects.where.prefix
        self.client: Any = self.objects.client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, what: str, exc: BaseException) -> ObjectStoreError:
        return ObjectStoreError(f"{what}: {first_line(exc)}", self.url)

    def put(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:
            raise self._fail(f"cannot write {key}", exc) from None

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket,
                                                Key=self._key(key))["Body"].read())
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404"):
                raise BadInput(f"the archive has no {key}", self.url) from None
            raise self._fail(f"cannot read {key}", exc) from None

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._fail(f"cannot look for {key}", exc) from None

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        strip = len(self._key(""))
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix))
            for page in pages:
                out.extend(o["Key"][strip:] for o in page.get("Contents", []))
        except Exception as exc:
            raise self._fail("cannot list the archive", exc) from None
        return sorted(out)

    def remove(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._fail(f"cannot remove {key}", exc) from None

    def put_blob(self, data: bytes) -> bool:
        return self.objects.put(data)[1]

    def get_blob(self, sha: str) -> bytes:
        return self.objects.get(sha)

    def has_blob(self, sha: str) -> bool:
        return self.exists(f"blobs/{sha}")

    def local_path(self, key: str) -> Path:
        """The object fetched once into this archive's cache (objects never change: a
        key names one batch's file)."""
        path = cache_root() / self.archive_id / key
        if path.is_file():
            return path
        data = self.get(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path


def open_location(where: str, *, create: bool = False) -> Location:
    """The archive at ``where`` (a directory, or ``s3://BUCKET/PREFIX``)."""
    if where.startswith("s3://"):
        loc: Location = S3Location(where)
    else:
        root = Path(where)
        if root.exists() and not root.is_dir():
            raise BadInput("not a directory (an archive is one)", where)
        if not root.exists():
            if not create:
                raise BadInput("no such archive", where)
            if not root.parent.is_dir():
                raise BadInput("its parent directory does not exist", where)
            root.mkdir()
        elif create and any(root.iterdir()) and not (root / MARKER).exists():
            raise BadInput("a directory that is not an archive and not empty: give an "
                           "empty or new one", where)
        loc = LocalLocation(root)
    loc.ensure(create=create)
    return loc


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
