"""Run a command under the shim: ASLR off, stdio passed through and hashed.

ASLR is switched off with ``personality(ADDR_NO_RANDOMIZE)`` on the launcher around the spawn
(it is inherited by the whole tree), so heap and mmap addresses -- and with them
``id()``, default reprs and anything hashed from addresses -- repeat between record and
replay. stdout and stderr go through pipes that this process copies to its own and
hashes, which is how a replay can say whether the bytes were identical; stdin is
inherited untouched. The program sees pipes in both modes, so it behaves alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import mmap
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stenograph.recorder.errors import BadInput

ADDR_NO_RANDOMIZE = 0x0040000


@dataclass(frozen=True)
class RunResult:
    status: int  # exit code, or -signal
    stdout_sha256: str
    stderr_sha256: str
    stdout: bytes | None = None
    stderr: bytes | None = None


_PERSONALITY_LOCK = threading.Lock()


@contextlib.contextmanager
def _aslr_off_for_children() -> Iterator[None]:
    """Turn ASLR off for processes this one starts, for the duration of the block.

    The personality flag is inherited and takes effect at exec, so setting it on the
    launcher around the spawn is enough -- and unlike a ``preexec_fn`` it lets
    ``subprocess`` keep its vfork/posix_spawn fast path (a preexec hook forces a full
    fork of this process, about 4-5 ms here).
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    personality = libc.personality
    personality.argtypes = [ctypes.c_ulong]
    personality.restype = ctypes.c_int
    with _PERSONALITY_LOCK:
        old = personality(0xFFFFFFFF)
        if old == -1:
            yield
            return
        personality(old | ADDR_NO_RANDOMIZE)
        try:
            yield
        finally:
            personality(old)


def resolve_program(argv: Sequence[str], env: Mapping[str, str]) -> str:
    if not argv:
        raise BadInput("no command given (usage: stenograph record -- CMD ARGS...)")
    prog = argv[0]
    found = prog if "/" in prog else shutil.which(prog, path=env.get("PATH"))
    if not found or not os.path.exists(found):
        raise BadInput("command not found", prog)
    return found


def check_dynamic(path: str) -> None:
    """Refuse a program the shim cannot see: an ELF without PT_INTERP is static."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                return  # a script: its interpreter is what runs
            if head[4] != 2 or head[5] != 1:
                raise BadInput("only 64-bit little-endian ELF programs are supported", path)
            phoff = int.from_bytes(head[32:40], "little")
            phentsize = int.from_bytes(head[54:56], "little")
            phnum = int.from_bytes(head[56:58], "little")
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError as exc:
        raise BadInput(f"cannot read program: {exc.strerror}", path) from None
    dynamic = any(int.from_bytes(table[i * phentsize:i * phentsize + 4], "little") == 3
                  for i in range(phnum))  # PT_INTERP
    if not dynamic:
        raise BadInput(
            "statically linked program: the LD_PRELOAD shim cannot see its clocks, entropy "
            "or listings, so it cannot be recorded or replayed faithfully", path)
    if _is_go(path):
        raise BadInput(
            "Go program: its runtime reads clocks through the vDSO and makes raw system "
            "calls, which the LD_PRELOAD shim cannot see, so it cannot be recorded or "
            "replayed faithfully", path)


GO_BUILDINFO = b"\xff Go buildinf:"
"""Start of the ``.go.buildinfo`` section every Go binary since Go 1.13 carries."""


def _is_go(path: str) -> bool:
    """A Go binary, even one linked dynamically through cgo (its runtime still bypasses libc)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(GO_BUILDINFO) >= 0
    except (OSError, ValueError):
        return False


def _pump(src: BinaryIO, dst_fd: int | None, digest: Any, keep: list[bytes] | None) -> None:
    while True:
        chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
        if not chunk:
            break
        digest.update(chunk)
        if keep is not None:
            keep.append(chunk)
        if dst_fd is not None:
            view = memoryview(chunk)
            while view:
                try:
                    n = os.write(dst_fd, view)
                except BrokenPipeError:
                    dst_fd = None
                    break
                view = view[n:]
    src.close()


def run_under_shim(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | Path | None = None,
    passthrough: bool = True,
    capture: bool = False,
    aslr_off: bool = True,
) -> RunResult:
    """Run ``argv`` with ``env`` (which carries LD_PRELOAD and STENO_*); wait for it."""
    prog = resolve_program(argv, env)
    check_dynamic(prog)
    try:
        with _aslr_off_for_children() if aslr_off else contextlib.nullcontext():
            proc = subprocess.Popen(
                [prog, *argv[1:]], executable=prog, env=dict(env), cwd=cwd,
                stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
            )
    except OSError as exc:
        raise BadInput(f"cannot run command: {exc.strerror}", argv[0]) from None
    out_h, err_h = hashlib.sha256(), hashlib.sha256()
    out_keep: list[bytes] | None = [] if capture else None
    err_keep: list[bytes] | None = [] if capture else None
    sys.stdout.flush()
    sys.stderr.flush()
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, 1 if passthrough else None, out_h,
                                              out_keep), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, 2 if passthrough else None, err_h,
                                              err_keep), daemon=True),
    ]
    for t in pumps:
        t.start()
    status = proc.wait()
    for t in pumps:
        t.join()
    return RunResult(
        status, out_h.hexdigest(), err_h.hexdigest(),
        b"".join(out_keep) if out_keep is not None else None,
        b"".join(err_keep) if err_keep is not None else None,
    )


def python_executable() -> str:
    """The real interpreter (``python3`` on PATH may be a shell shim, e.g. pyenv's)."""
    return os.path.realpath(sys.executable)
