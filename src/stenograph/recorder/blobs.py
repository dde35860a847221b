"""Content-addressed blob store for bodies too bulky to sit in an event.

An event refers to a blob with a map ``{"$blob": sha256_hex, "size": n}``
anywhere in its body (``BlobRef.to_body``); ``blob_refs`` finds them, which is
how a trajectory export knows which blobs to embed.
A blob is written atomically: temp file, fsync, rename, fsync of the directory,
so a blob that has a name is complete, and a crash leaves at most a temp file
(a refused write, a full disk, leaves none).
Writing the same bytes twice is free: the name is the hash.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import BadInput, CorruptLog

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class BlobRef:
    sha256: str
    size: int

    def to_body(self) -> dict[str, Any]:
        return {"$blob": self.sha256, "size": self.size}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BlobRef:
        sha, size = body.get("$blob"), body.get("size")
        if not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _HEX
                and isinstance(size, int) and size >= 0):
            raise BadInput(f"not a blob reference: {body!r}")
        return cls(sha, size)


class BlobStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_of(self, sha256: str) -> Path:
        if not (isinstance(sha256, str) and len(sha256) == 64 and set(sha256) <= _HEX):
            raise BadInput(f"not a blob hash: {sha256!r}", str(self.root))
        return self.root / sha256[:2] / sha256[2:]

    def put(self, data: bytes) -> BlobRef:
        """Store ``data`` durably; return its reference."""
        sha = hashlib.sha256(data).hexdigest()
        ref = BlobRef(sha, len(data))
        final = self.path_of(sha)
        if final.exists() and final.stat().st_size == len(data):
            with open(final, "rb") as f:
                if hashlib.file_digest(f, "sha256").hexdigest() == sha:
                    return ref  # already there and intact; a damaged copy is rewritten
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:  # a full disk: the half-written copy gives its space back
            tmp.unlink(missing_ok=True)
            if exc.filename is None:
                raise OSError(exc.errno, exc.strerror, str(self.root)) from None
            raise
        dfd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return ref

    def put_new(self, data: bytes) -> tuple[BlobRef, bool]:
        """Store ``data`` without a sync (call ``sync`` before anything names the blob);
        return its reference and whether the store did not have it."""
        sha = hashlib.sha256(data).hexdigest()
        final = self.path_of(sha)
        if final.exists() and final.stat().st_size == len(data):
            return BlobRef(sha, len(data)), False
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".put.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return BlobRef(sha, len(data)), True

    def put_file(self, src: str | Path, *, sync: bool = True) -> tuple[BlobRef, bool]:
        """Store a file's bytes, read in pieces (a big file never sits in memory);
        return its reference and whether the store did not have it. With ``sync=False``
        nothing is synced: call ``sync`` before anything names the blob."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as f:  # hashed first: a blob the store has is not copied
            st = os.fstat(f.fileno())
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        final = self.path_of(sha)
        if final.exists() and final.stat().st_size == st.st_size:
            return BlobRef(sha, st.st_size), False
        tmp = self.root / f".put.{os.getpid()}.{threading.get_ident()}.tmp"
        h = hashlib.sha256()
        size = 0
        try:
            with open(src, "rb") as f, open(tmp, "wb") as out:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                if sync:
                    out.flush()
                    os.fsync(out.fileno())
            sha = h.hexdigest()  # what was copied (the file may have changed since)
            final = self.path_of(sha)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if sync:
            dfd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return BlobRef(sha, size), True

    def sync(self) -> None:
        """Everything written to the blob directory durable (one ``syncfs``)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(self.root))
        finally:
            os.close(fd)

    def get(self, ref: BlobRef | str) -> bytes:
        """Read a blob back and check it against its hash."""
        sha = ref.sha256 if isinstance(ref, BlobRef) else ref
        path = self.path_of(sha)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            moved = self._offloaded()
            if moved is None or not moved.has(sha):
                raise BadInput(f"blob {sha[:16]}... is missing", str(self.root)) from None
            return moved.get(sha)
        if hashlib.sha256(data).hexdigest() != sha:
            raise CorruptLog("blob content does not match its hash", str(path), 0)
        return data

    def has(self, sha256: str) -> bool:
        if self.path_of(sha256).exists():
            return True
        moved = self._offloaded()
        return moved is not None and moved.has(sha256)

    def _offloaded(self) -> BlobStore | None:
        """Where ``gc --policy`` moved a store's old tool output (``STORE/OFFLOAD``)."""
        try:
            where = (self.root.parent / "OFFLOAD").read_text().strip()
        except OSError:
            return None
        if not where or Path(where).resolve() == self.root.resolve():
            return None
        return BlobStore(where)


def blob_refs(value: Any) -> list[BlobRef]:
    """Every blob reference inside a (nested) event body, in order of appearance."""
    out: list[BlobRef] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "$blob" in v and len(v) == 2 and "size" in v:
                out.append(BlobRef.from_body(v))
            else:
                stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
    return out
