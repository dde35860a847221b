"""The store: a directory of segments written through group commit.

    STORE/
      STENOGRAPH-STORE   marker: format version and the batch-marker salt
      LOCK               flock()ed by the one writer; holds its pid
      wal/               0000000001.seg, 0000000002.seg, ... (+ spare.tmp)
      blobs/             content-addressed bodies
      checkpoints/       record and workspace snapshots

Opening for writing scans every segment (to learn the next LSN and each
trajectory's last ``seq``/``prev``), cuts a torn tail of the last segment by
zeroing it, and reports what it cut in ``recovered``.

A store made before batch markers were salted is upgraded by its first writer of
this build: the writer starts a fresh segment (so no segment holding legacy
markers is ever again the one whose tail is judged torn or corrupt), then adds a
salt to ``STENOGRAPH-STORE``. Older builds cannot read salted markers and refuse
such a store as corrupt at its first salted batch marker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import (
    SALT_SIZE,
    TAG_SIZE,
    Event,
    envelope_frame,
    marker,
    pack_body,
    salted_marker,
)
from stenograph.recorder.errors import (
    WRITE_ERRNOS,
    BadInput,
    NotAStore,
    StenographError,
    StoreFenced,
    StoreLocked,
    StorePoisoned,
)
from stenograph.recorder.group_commit import CommitSettings, GroupCommit
from stenograph.recorder.kinds import KINDS, WRITTEN_VERSION, check_kind
from stenograph.recorder.reader import STORE_MARKER, StoreReader, TornTail, is_store, read_salt
from stenograph.recorder.segment import (
    HEADER_SIZE,
    WAL_MAGIC,
    SegmentHeader,
    SegmentWriter,
    fsync_dir,
    segment_name,
    zero_fill,
)

_TRAJ_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    segment_bytes: int = 32 << 20
    commit: CommitSettings = field(default_factory=CommitSettings)


def check_traj(traj: str) -> str:
    if not isinstance(traj, str) or not _TRAJ_RE.fullmatch(traj):
        raise BadInput(
            f"bad trajectory id {traj!r}: 1-200 characters of letters, digits and ._:@+-, "
            "starting with a letter or digit"
        )
    return traj


def init_store(path: Path) -> bool:
    """Create an empty store at ``path`` (which may exist as an empty directory).

    Made whole under another name beside it and renamed into place, so any number of
    processes may make the same store at once (eight first ``record``s into a new
    directory): one rename wins, the others find a store there and use it. The store is
    its owner's alone (``hostconfig``: 0700). One that cannot be made (a full disk) leaves
    nothing behind. True if this call made it.
    """
    if is_store(path):
        return False
    existed = path.exists()
    if existed:
        if not path.is_dir():
            raise NotAStore("exists and is not a directory", str(path))
        if any(path.iterdir()) and not is_store(path) and not _unfinished(path):
            raise NotAStore("directory is not empty and not a stenograph store", str(path))
        if _unfinished(path):  # an older build's making, cut short: finish it in place
            _init_in_place(path)
            return True
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.new-", dir=parent))
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        for sub in ("wal", "blobs", "checkpoints"):
            (tmp / sub).mkdir(mode=0o700)
        _write_metadata(tmp, os.urandom(SALT_SIZE))
        fsync_dir(tmp)
        try:
            os.rename(tmp, path)  # onto nothing, or onto an empty directory: atomic
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not is_store(path):
                raise
            return False  # another process made it first
        os.chmod(path, 0o700)
        fsync_dir(parent)
        return True
    except OSError as exc:
        raise _named(exc, path) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _init_in_place(path: Path) -> None:
    try:
        for sub in ("wal", "blobs", "checkpoints"):
            (path / sub).mkdir(mode=0o700, exist_ok=True)
        if not (path / STORE_MARKER).exists():
            _write_metadata(path, os.urandom(SALT_SIZE))
        fsync_dir(path)
    except OSError as exc:
        _unmake(path, True)
        raise _named(exc, path) from None


_SKELETON = frozenset({"wal", "blobs", "checkpoints", STORE_MARKER + ".tmp"})


def _unfinished(path: Path) -> bool:
    """A store whose making was cut short (the process killed before its marker was
    written): empty skeleton directories and at most the marker's temporary file. It is
    finished, not refused: nothing was ever written into it."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    return all(e.name in _SKELETON and (not e.is_dir() or not any(e.iterdir()))
               for e in entries) and not (path / STORE_MARKER).exists()


def _unmake(path: Path, keep_dir: bool) -> None:
    """Remove a store this process just made and could not finish (``keep_dir``: empty it)."""
    if not keep_dir:
        shutil.rmtree(path, ignore_errors=True)
        return
    for child in list(path.iterdir()) if path.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` if it names nothing (``write``/``fsync`` errors do not)."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


class _SyncFailed(OSError):
    """An ``fdatasync`` of the tail segment failed: the poisoning ``StorePoisoned`` is for."""


def _refused(exc: StorePoisoned, path: Path) -> BaseException:
    """A poisoned store whose write the system refused before anything was synced (a
    full disk, no room for the next segment) is that ``OSError`` to callers, naming the
    store, so a command says it in one line and exits 7 (``WriteFailed``) rather than 3;
    the store still takes no more writes. A failed sync stays ``StorePoisoned``."""
    cause = exc.__cause__
    if isinstance(cause, StoreFenced):
        return cause
    if (isinstance(cause, OSError) and not isinstance(cause, _SyncFailed)
            and cause.errno in WRITE_ERRNOS):
        err = OSError(cause.errno, cause.strerror, str(path))
        err.__cause__ = exc
        return err
    return exc


def _write_metadata(path: Path, salt: bytes) -> None:
    """Write ``STENOGRAPH-STORE`` atomically (temp file, fsync, rename, fsync of the dir)."""
    tmp = path / (STORE_MARKER + ".tmp")
    tmp.write_text(f"stenograph store\nformat {WRITTEN_VERSION}\nsalt {salt.hex()}\n")
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path / STORE_MARKER)
    fsync_dir(path)


class Store:
    """A writable store. One writer at a time (``StoreLocked`` otherwise).

    An exclusive writer (the default) holds ``LOCK`` from open to close, and refuses to
    open while another worker's lease is live (``recorder/leases.py``). A *shared*
    writer -- a worker holding the store's lease: ``record``, ``resume`` -- takes
    ``LOCK`` only to open and for each batch, so a worker paused past its lease does not
    keep the store from the one that takes over. Each batch first checks ``WRITER``, the
    stamp the last writer left: if it is not this writer's own, another has written
    since, and this one is fenced (``StoreFenced``): it writes nothing more."""

    def __init__(self, path: str | Path, *, create: bool = True,
                 settings: StoreSettings | None = None, shared: bool = False,
                 host: bool = False) -> None:
        self.path = Path(path)
        self.settings = settings or StoreSettings()
        self._shared = shared
        made, existed = False, True
        if not is_store(self.path):
            if not create:
                raise NotAStore("not a stenograph store", str(self.path))
            existed = self.path.exists()
            made = init_store(self.path)
        try:
            self._lock_fd = take_lock(self.path)
        except OSError as exc:
            if made:
                _unmake(self.path, existed)
            raise _named(exc, self.path) from None
        try:
            if not shared and not host:  # (the host recorder writes for the workers)
                from stenograph.recorder.leases import LocalLeases

                other = LocalLeases(self.path).held_by_other()
                if other is not None:
                    raise StoreLocked(f"store is in use: {other.traj} is running (pid "
                                      f"{other.pid} on {other.host}, epoch {other.epoch})",
                                      str(self.path))
            self._open()
            self._stamp = f"{secrets.token_hex(8)}:{self._gc.next_lsn}"
            _write_stamp(self.path, self._stamp)
        except BaseException as exc:
            os.close(self._lock_fd)
            if made:  # a store that could not get its first segment is no store
                _unmake(self.path, existed)
            if isinstance(exc, OSError):
                raise _named(exc, self.path) from None
            raise
        self._stamp_fd = -1
        if shared:  # the fds stay open; LOCK is let go, taken again per batch
            self._stamp_fd = os.open(self.path / "WRITER", os.O_RDWR)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self.blobs = BlobStore(self.path / "blobs")

    def _open(self) -> None:
        wal = self.path / "wal"
        reader = StoreReader(self.path)
        trajs: dict[str, list[Any]] = {}
        for ev in reader.events():
            st = trajs.get(ev.traj)
            if st is None:
                trajs[ev.traj] = [ev.seq, ev.lsn, 1]
            else:
                st[0], st[1], st[2] = ev.seq, ev.lsn, st[2] + 1
        # Only once the scan has accepted the store: a refused open changes nothing.
        for leftover in wal.glob("*.tmp"):
            leftover.unlink()
        (self.path / (STORE_MARKER + ".tmp")).unlink(missing_ok=True)
        self._trajs = trajs
        self.recovered: TornTail | None = reader.torn
        next_lsn = reader.next_lsn
        self._spare: threading.Thread | None = None
        self._spare_wanted = False
        salt = reader.salt if reader.salt is not None else read_salt(self.path)
        seg: SegmentWriter | None = None
        if reader.segments:
            assert reader.last_header is not None
            seg = SegmentWriter(reader.segments[-1], reader.last_header, reader.end_offset)
            if reader.torn is not None:
                seg.zero_from(reader.torn.offset, reader.torn.dropped)
            if salt is None and seg.end > HEADER_SIZE:  # legacy markers: never the tail again
                seg.close()
                seg = self._new_segment(reader.last_header.number + 1, next_lsn, 0)
        if salt is None:
            salt = os.urandom(SALT_SIZE)
            _write_metadata(self.path, salt)
        self._salt = salt
        self._seg = seg if seg is not None else self._new_segment(1, next_lsn, 0)
        self._closed = False
        self._pack = msgpack.Packer(use_bin_type=True).pack  # used under the commit lock only
        self._gc = GroupCommit(self._write_batch, next_lsn, self.settings.commit)

    # -- appending -------------------------------------------------------------------

    def append(self, traj: str, kind: str, body: dict[str, Any], *, durable: bool = True) -> int:
        """Append one event; return its LSN once durable (or at once if not ``durable``)."""
        try:
            lsn = self._enqueue(traj, kind, pack_body(body), durable)
            if durable:
                self._gc.wait(lsn)
        except StorePoisoned as exc:
            raise (err := _refused(exc, self.path)) from err.__cause__
        return lsn

    def queue(self, traj: str, kind: str, body: dict[str, Any]) -> None:
        """Append, durable with the next sync; nothing waited for (``RemoteStore`` sends it
        without waiting for its LSN)."""
        self.append(traj, kind, body, durable=False)

    async def append_async(self, traj: str, kind: str, body: dict[str, Any]) -> int:
        """Durable append for asyncio code: awaits the covering sync without blocking."""
        try:
            lsn = self._enqueue(traj, kind, pack_body(body))
            await self._gc.wait_async(lsn)
        except StorePoisoned as exc:
            raise (err := _refused(exc, self.path)) from err.__cause__
        return lsn

    def append_packed(self, traj: str, kind: str, body: bytes, *, durable: bool = True) -> int:
        """Append a body that is already msgpack-packed (recorder fast path)."""
        try:
            lsn = self._enqueue(traj, kind, body, durable)
            if durable:
                self._gc.wait(lsn)
        except StorePoisoned as exc:
            raise (err := _refused(exc, self.path)) from err.__cause__
        return lsn

    def reserve(self, nbytes: int) -> None:
        """Make room for ``nbytes`` more of frames in the tail segment now, starting a new
        (preallocated) one if it has less, so that appending that much later needs no
        new space halfway: a full disk then refuses it before its first event, not
        after some of them (an import is all or nothing). Flushes first; meant for a
        store with no other appender at the moment (``log import``)."""
        self.flush()
        with self._gc.lock:
            if self._closed:
                raise StenographError("store is closed", str(self.path))
            first = self._gc.next_lsn
        if self._seg.room() >= nbytes:
            return
        try:
            self._rotate(first, nbytes)
        except OSError as exc:
            raise _named(exc, self.path) from None

    def _enqueue(self, traj: str, kind: str, body: bytes, durable: bool = True) -> int:
        """Assign the next LSN and seq and queue the framed event.

        Encoding happens under the commit lock because the LSN is part of the
        envelope; it uses the store's own packer, which the lock serializes.
        Every producer runs this once per event, so it is kept lean.
        """
        if kind not in KINDS:
            check_kind(kind)
        if type(traj) is not str:
            check_traj(traj)  # raises BadInput (an unhashable id would be a TypeError below)
        gc = self._gc
        with gc.lock:
            if self._closed:
                raise StenographError("store is closed", str(self.path))
            st = self._trajs.get(traj)
            if st is None:
                check_traj(traj)
                st = self._trajs[traj] = [-1, None, 0]
            lsn = gc.next_lsn
            seq = st[0] + 1
            gc.push(envelope_frame(self._pack, lsn, traj, seq, st[1], kind, body), durable)
            st[0] = seq
            st[1] = lsn
            st[2] += 1
        return lsn

    def flush(self) -> None:
        """Make every event appended so far durable."""
        try:
            self._gc.flush()
        except StorePoisoned as exc:
            raise (err := _refused(exc, self.path)) from err.__cause__

    @property
    def syncs(self) -> int:
        """How many batches have been written and synced (for tests and benchmarks)."""
        return self._gc.syncs

    @property
    def synced_lsn(self) -> int:
        return self._gc.synced_lsn

    @property
    def last_lsn(self) -> int:
        """The LSN of the last event appended (durable or not yet)."""
        with self._gc.lock:
            return self._gc.next_lsn - 1

    def trajectories(self) -> dict[str, int]:
        """Trajectory id -> number of events (including queued ones)."""
        with self._gc.lock:
            return {t: st[2] for t, st in self._trajs.items()}

    def next_seq(self, traj: str) -> int:
        with self._gc.lock:
            st = self._trajs.get(traj)
            return 0 if st is None else st[0] + 1

    def events(self, *, traj: str | None = None, from_lsn: int = 0) -> list[Event]:
        """Durable events read back from disk (flushes first)."""
        self.flush()
        return list(StoreReader(self.path).events(traj=traj, from_lsn=from_lsn))

    def close(self) -> None:
        """Flush, seal the tail with a marker, release the lock. Idempotent."""
        if self._closed:
            return
        try:
            try:
                self._gc.close()
            except StorePoisoned as exc:
                raise (err := _refused(exc, self.path)) from err.__cause__
            with self._gc.lock:
                self._closed = True
            if self._gc._error is None:
                try:
                    with self._turn(self._gc.next_lsn):
                        self._write_marked([], 0, self._gc.next_lsn)
                except StoreFenced:  # another writer's store now: leave it alone
                    pass
                except OSError as exc:  # the events are durable; only the seal is missing
                    raise _named(exc, self.path) from None
        finally:
            self._closed = True
            if self._spare is not None:
                self._spare.join()
            self._seg.close()
            for fd in (self._lock_fd, self._stamp_fd):
                if fd >= 0:
                    os.close(fd)
            self._lock_fd = self._stamp_fd = -1

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        import asyncio  # here: the CLI's start-up need not pay for it

        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # -- the write path (leader only) ------------------------------------------------

    def _write_batch(self, frames: list[bytes], nbytes: int, first: int, last: int) -> None:
        with self._turn(last + 1):
            self._write_marked(frames, nbytes, first)

    @contextlib.contextmanager
    def _turn(self, next_lsn: int) -> Iterator[None]:
        """Shared mode: hold ``LOCK`` around one write, and only while this is still the
        store's last writer (``StoreFenced`` otherwise); the stamp then says so again."""
        if not self._shared:
            yield
            return
        _wait_lock(self._lock_fd, self.path)
        try:
            if os.pread(self._stamp_fd, STAMP_BYTES, 0).decode().strip() != self._stamp:
                raise StoreFenced("another worker has written to the store since: this "
                                  "one lost its lease and writes nothing more",
                                  str(self.path))
            yield
            self._stamp = f"{self._stamp.partition(':')[0]}:{next_lsn}"
            os.pwrite(self._stamp_fd, self._stamp.ljust(STAMP_BYTES).encode(), 0)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _write_marked(self, parts: list[bytes], nbytes: int, first: int) -> None:
        """Write a batch marker for ``first`` and then ``parts``; sync.

        The marker's tag depends on where it lands, so it is made once the
        segment is chosen (its size does not depend on the offset).
        """
        overhead = len(marker(first)) + 2 + TAG_SIZE  # a legacy marker + a bin8 tag
        need = nbytes + overhead
        if self._seg.room() < need:
            try:
                self._rotate(first, need)
            except OSError:  # no room for a new segment: keep what fits in this one
                self._write_what_fits(parts, first, overhead)
                raise
        m = salted_marker(first, self._salt, self._seg.header.number, self._seg.end)
        assert len(m) == need - nbytes
        parts.insert(0, m)
        self._write_raw(parts, nbytes + len(m))

    def _write_what_fits(self, parts: list[bytes], first: int, overhead: int) -> None:
        """The batch's first frames, as many as the tail segment holds, as a batch of
        their own (best effort: the failure that follows is what the caller hears)."""
        room, n, k = self._seg.room() - overhead, 0, 0
        while k < len(parts) and n + len(parts[k]) <= room:
            n += len(parts[k])
            k += 1
        if k:
            m = salted_marker(first, self._salt, self._seg.header.number, self._seg.end)
            with contextlib.suppress(OSError):
                self._write_raw([m, *parts[:k]], len(m) + n)

    def _write_raw(self, parts: list[bytes], nbytes: int) -> None:
        self._seg.write(parts, nbytes)
        try:
            self._seg.sync()
        except OSError as exc:
            raise _SyncFailed(exc.errno, exc.strerror, str(self._seg.path)) from exc
        if not self._spare_wanted and self._seg.end * 2 > self._seg.size:
            self._start_spare()

    def _rotate(self, first_lsn: int, need: int) -> None:
        """Start the next segment; the tail stays open (and the store usable) if that fails."""
        new = self._new_segment(self._seg.header.number + 1, first_lsn, need)
        self._seg.close()
        self._seg = new

    def _new_segment(self, number: int, first_lsn: int, need: int) -> SegmentWriter:
        wal = self.path / "wal"
        size = max(self.settings.segment_bytes, need + HEADER_SIZE)
        spare = wal / "spare.tmp"
        if self._spare_ready(size):
            tmp = spare
        else:
            tmp = wal / "new.tmp"
            try:
                zero_fill(tmp, size)
            except OSError:  # a full disk: give back what the half-made segment took
                tmp.unlink(missing_ok=True)
                raise
        header = SegmentHeader(WAL_MAGIC, WRITTEN_VERSION, number, first_lsn)
        fd = os.open(tmp, os.O_WRONLY)
        try:
            os.pwrite(fd, header.pack(), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        final = wal / segment_name(number)
        os.replace(tmp, final)
        fsync_dir(wal)
        return SegmentWriter(final, header, HEADER_SIZE)

    def _spare_ready(self, size: int) -> bool:
        if self._spare is not None:
            self._spare.join()
            self._spare = None
        self._spare_wanted = False
        spare = self.path / "wal" / "spare.tmp"
        return spare.exists() and spare.stat().st_size >= size

    def _start_spare(self) -> None:
        """Zero-fill the next segment in the background, off the commit path.

        Started once the tail segment is half full, so a store that never rotates
        never pays for a spare.
        """
        self._spare_wanted = True
        path, size = self.path / "wal" / "spare.tmp", self.settings.segment_bytes

        def fill() -> None:
            try:
                zero_fill(path, size)
            except OSError:  # no spare is only slower, never wrong; a half one takes the
                with contextlib.suppress(OSError):  # disk's last space: give it back
                    path.unlink()

        self._spare = threading.Thread(target=fill, name="stenograph-spare", daemon=True)
        self._spare.start()


STAMP_BYTES = 48
"""``WRITER`` holds one stamp, ``<writer id>:<next lsn>``, padded to this many bytes (so
it is rewritten in place)."""


def _write_stamp(path: Path, stamp: str) -> None:
    """Not synced: the stamp is only ever compared between live writers."""
    fd = os.open(path / "WRITER", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, stamp.ljust(STAMP_BYTES).encode())
    finally:
        os.close(fd)


LOCK_WAIT = 30.0
"""Seconds a shared writer waits for ``LOCK`` (another writer's batch, a short command)."""


def _wait_lock(fd: int, path: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StoreLocked(f"store is locked by another writer for over "
                                  f"{LOCK_WAIT:.0f}s (pid "
                                  f"{os.pread(fd, 32, 0).decode(errors='replace').strip()})",
                                  str(path)) from None
            time.sleep(0.002)


def take_lock(path: Path, *, record_pid: bool = True,
              refusal: str = "store is locked by another writer (pid {pid})") -> int:
    """Hold the store's writer lock (``StoreLocked``, naming the holder's pid, if a
    writer has it); with ``record_pid`` write this process's pid in it, as a writer
    does. The caller closes the fd to let go."""
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT if record_pid else os.O_RDONLY,
                 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreLocked(refusal.format(pid=holder), str(path)) from None
    if record_pid:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def writer_holds(path: Path) -> bool:
    """Whether a writer holds the store now (read-only: no ``LOCK`` is made)."""
    try:
        fd = os.open(path / "LOCK", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
