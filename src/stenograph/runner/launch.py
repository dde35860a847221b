"""Run a command under the shim: ASLR off, stdio passed through and hashed.

ASLR is switched off with ``personality(ADDR_NO_RANDOMIZE)`` on the launcher around the spawn
(it is inherited by the whole tree), so heap and mmap addresses -- and with them
``id()``, default reprs and anything hashed from addresses -- repeat between record and
replay. stdout and stderr go through pipes that this process copies to its own and
hashes, which is how a replay can say whether the bytes were identical; stdin is
inherited untouched. The program sees pipes in both modes, so it behaves alike.

A replay runs sealed: ``runner/seal.py`` makes the namespace, this module starts the
program in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from stenograph.recorder.errors import BadInput
from stenograph.recorder.hostconfig import user_umask
from stenograph.runner import pathmap
from stenograph.runner.seal import (
    HeldSeal,
    Seal,
    seal_kind,
    seal_preexec,
    seal_roots,
    why_pipe,
)
from stenograph.runner.settings import STACK_LIKE
from stenograph.runner.shim import normalized

ADDR_NO_RANDOMIZE = 0x0040000


@dataclass(frozen=True)
class RunResult:
    status: int  # exit code, or -signal
    stdout_sha256: str
    stderr_sha256: str
    stdout: bytes | None = None
    stderr: bytes | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_prefix_sha256: str | None = None
    """sha256 of the first ``cut`` bytes of stdout (``None``: fewer came, or no cut)."""
    stderr_prefix_sha256: str | None = None


class OutputDigest:
    """sha256 and length of a stream, and the sha256 of its first ``cut`` bytes: the
    replay of a run that was killed compares the part the recording saw."""

    def __init__(self, cut: int | None = None) -> None:
        self._h = hashlib.sha256()
        self.n = 0
        self._cut = cut
        self.prefix: str | None = hashlib.sha256().hexdigest() if cut == 0 else None

    def update(self, data: bytes) -> None:
        if self._cut is not None and self.n < self._cut <= self.n + len(data):
            p = self._h.copy()
            p.update(data[:self._cut - self.n])
            self.prefix = p.hexdigest()
        self._h.update(data)
        self.n += len(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


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


def _tape_protocol(env: Mapping[str, str]) -> int | None:
    """The protocol of the tape being replayed when older than this shim's (``TAPE/
    protocol``, written by ``prepare_tape``), else None."""
    tape = env.get("STENO_TAPE")
    try:
        return int((Path(tape) / "protocol").read_text()) if tape else None
    except (OSError, ValueError):
        return None


def resolve_program(argv: Sequence[str], env: Mapping[str, str]) -> str:
    if not argv:
        raise BadInput("no command given (usage: stenograph record -- CMD ARGS...)")
    prog = argv[0]
    found = prog if "/" in prog else shutil.which(prog, path=env.get("PATH"))
    if not found or not os.path.exists(found):
        raise BadInput("command not found", prog)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise BadInput("not an executable file", prog)
    return found


def check_dynamic(path: str) -> bool:
    """Whether ``path`` must be recorded whole: a static ELF (no ``PT_INTERP``: musl
    tools) never loads the shim, and a Go program (static, position-independent with the
    system's loader, or cgo) bypasses it, so it runs under a shell the shim is in, whose
    exec of it the shim records whole (``shim_c/whole.c``)."""
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
    return not dynamic or _is_go(path)


WHOLE_CARRIER = ["/bin/sh", "-c", 'exec "$0" "$@"']
"""What a program recorded whole runs under: a shell the shim is loaded into, whose exec
of the program the shim records (or, at replay, serves) whole."""


GO_BUILDINFO = b"\xff Go buildinf:"
"""Start of the ``.go.buildinfo`` section every Go binary since Go 1.13 carries."""


def _is_go(path: str) -> bool:
    """A Go binary, even one linked dynamically through cgo (its runtime still bypasses libc)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(GO_BUILDINFO) >= 0
    except (OSError, ValueError):
        return False


def _pump(src: BinaryIO, dst_fd: int | None, digest: OutputDigest,
          keep: list[bytes] | None) -> None:
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


# ----------------------------------------------------------------------------- sealing

STENO_ENV_BYTES = 4096
STENO_ENV_VARS = 16
"""The ``STENO_*`` part of the program's environment is padded (``STENO_PAD``,
``STENO_PAD1``...) to exactly this many variables of exactly this many bytes. The shim
hides those variables from ``environ``, but their strings and pointers sit on the initial
stack above ``main``'s frame: record (``STENO_SOCK``, ``STENO_STORE``...) and replay
(``STENO_TAPE``, ``STENO_NONET``...) would otherwise start the program with its stack at
different addresses, and what a program derives from a stack address (gnulib's tempname
seeds its first ``mktemp -d`` name with ``&v``) would differ. Children inherit the pads
with the rest (the shim passes every ``STENO_*`` variable on)."""


def env_size(env: Mapping[str, str]) -> tuple[int, int]:
    """The bytes (each ``NAME=value`` and its NUL) and number of the variables of ``env``
    that are not ``STENO_*``: what of the initial stack the program's own environment
    takes, with the shim's ``LD_PRELOAD`` and the hooks' ``PYTHONPATH``."""
    rest = [(k, v) for k, v in env.items() if not k.startswith("STENO_")]
    return sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in rest), len(rest)


def pad_steno_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the ``STENO_*`` part padded to its fixed size -- made larger or
    smaller by what the rest differs from the recorded run's (``STENO_STACK``): a
    redacted secret's value, the path of the shim or the hooks of another install, so
    the program's stack starts where it started when it was recorded."""
    out = {k: v for k, v in env.items() if not k.startswith("STENO_PAD") and k != STACK_LIKE}
    more_bytes = more_vars = 0
    like = env.get(STACK_LIKE, "")
    if like:
        want_bytes, _, want_vars = like.partition(",")
        have_bytes, have_vars = env_size(out)
        if want_bytes.isdigit() and want_vars.isdigit():
            more_bytes, more_vars = int(want_bytes) - have_bytes, int(want_vars) - have_vars
    steno = [k for k in out if k.startswith("STENO_")]
    pads = STENO_ENV_VARS + more_vars - len(steno)
    used = sum(len(k) + len(out[k]) + 2 for k in steno)
    names = ["STENO_PAD"] + [f"STENO_PAD{i}" for i in range(1, max(pads, 1))]
    room = STENO_ENV_BYTES + more_bytes - used - sum(len(n) + 2 for n in names)
    if (pads < 1 or room < 0) and like:  # cannot match it: the default size
        return pad_steno_env({k: v for k, v in out.items()})
    if pads < 1 or room < 0:
        raise BadInput("the shim's variables are too many or too long (a tape or store "
                       "path too long?)")
    for n in names:
        out[n] = ""
    out["STENO_PAD"] = "x" * room
    return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (a replayed program swallows a live SIGINT:
    under the tape signals arrive where the recording had them)."""
    kids = _children()
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(kids.get(p, []))
    for p in seen:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


DIVERGED_GRACE = 3.0  # s the rest of a tree gets to end by itself after a divergence


def _diverged(path: Path, seen: list[int]) -> bool:
    """Has the shim written a divergence line (not a drift one) to ``path``?"""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size == seen[0]:
        return False
    seen[0] = size
    with contextlib.suppress(OSError), path.open("rb") as f:
        return any(line.startswith(b"divergence\t") for line in f)
    return False


PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> None:
    """Be the subreaper of the replayed tree: a process whose parent died (a pool worker
    whose main process diverged) becomes our child, so it can be found and stopped."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stop_orphans(spare: Sequence[int] = ()) -> None:
    """SIGKILL what is left of a diverged tree (orphans adopted by this process: they
    hold its output pipes open) and reap it; ``spare``: children of ours that are not
    the tree's (a sealed namespace's holder)."""
    for child in _children().get(os.getpid(), []):
        if child not in spare:
            kill_tree(child)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def wait_unless_diverged(proc: subprocess.Popen[bytes], stop_on: Path | None,
                         spare: Sequence[int] = ()) -> int:
    """Wait for the tree; but once a replayed process has diverged (and died, in a strict
    replay), give the rest ``DIVERGED_GRACE`` seconds and then stop it: its peers may
    wait for the dead one for ever (a pool's workers and the pipe they share), even once
    the program's own process has ended."""
    if stop_on is None:
        return proc.wait()
    seen, since = [-1], None
    status = None
    while status is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            status = proc.wait(timeout=0.2)
        if since is None:
            since = time.monotonic() if _diverged(stop_on, seen) else None
        elif status is None and time.monotonic() - since > DIVERGED_GRACE:
            kill_tree(proc.pid)
            status = proc.wait()
    if since is not None or _diverged(stop_on, seen):
        _stop_orphans(spare)
    return status


def run_under_shim(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | Path | None = None,
    passthrough: bool = True,
    capture: bool = False,
    aslr_off: bool = True,
    seal: Seal | None = None,
    cut: tuple[int, int] | None = None,
    started: Callable[[subprocess.Popen[bytes]], Any] | None = None,
    stop_on: Path | None = None,
    held: HeldSeal | pathmap.MappedHold | None = None,
) -> RunResult:
    """Run ``argv`` with ``env`` (which carries LD_PRELOAD and STENO_*); wait for it.
    With ``seal``, in a private mount namespace (see ``Seal``), or in the one ``held``
    holds; ``SealUnavailable`` if the namespace cannot be made. ``cut``: stdout and
    stderr lengths whose prefixes to hash too (``OutputDigest``). ``stop_on``: the
    replay's divergence file (see ``wait_unless_diverged``)."""
    prog = resolve_program(argv, env)
    args = normalized([prog, *argv[1:]], _tape_protocol(env))
    if check_dynamic(prog):  # static: under a shell whose exec of it the shim takes whole
        args, prog = [*WHOLE_CARRIER, *args], WHOLE_CARRIER[0]
    if stop_on is not None:
        _adopt_orphans()
    sealed_cwd = (held.cwd or cwd) if held is not None else seal.cwd if seal is not None \
        else None
    exe, pm, own_pm = prog, None, False  # sealed by the shim's path mapping: no namespace
    if isinstance(held, pathmap.MappedHold):
        pm, start, held = held.pathmap, held.cwd, None
    elif seal is not None and seal_kind() == "path-map":
        pm, own_pm, start, seal = pathmap.build(seal, seal_roots(env)), True, seal.cwd, None
    if pm is not None:
        cwd = pm.map(os.path.abspath(str(start or cwd or os.getcwd())))
        sealed_cwd, exe = None, pm.map(prog)
        env = {**env, "STENO_PATHMAP": str(pm.file)}
    try:
        with why_pipe() as why_w, \
                _aslr_off_for_children() if aslr_off else contextlib.nullcontext():
            preexec = (held.enter(why_w, cwd) if held is not None
                       else seal_preexec(seal, seal_roots(env), why_w) if seal is not None
                       else None)
            proc = subprocess.Popen(
                args, executable=exe, env=pad_steno_env(env), umask=user_umask(),
                cwd=None if sealed_cwd else cwd,
                stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
                preexec_fn=preexec,
            )
    except OSError as exc:
        raise BadInput(f"cannot run command: {exc.strerror}", argv[0]) from None
    if started is not None:
        started(proc)
    out_h = OutputDigest(cut[0] if cut else None)
    err_h = OutputDigest(cut[1] if cut else None)
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
    try:
        status = wait_unless_diverged(proc, stop_on,
                                      [held.proc.pid] if held is not None else [])
    except BaseException:  # Ctrl-C, a timeout: the tree must not outlive its tape
        kill_tree(proc.pid)
        proc.wait()
        raise
    for t in pumps:
        t.join()
    if own_pm and pm is not None:  # a held one's writes are laid out when it closes
        pm.finish()
    return RunResult(
        status, out_h.hexdigest(), err_h.hexdigest(),
        b"".join(out_keep) if out_keep is not None else None,
        b"".join(err_keep) if err_keep is not None else None,
        out_h.n, err_h.n, out_h.prefix, err_h.prefix,
    )


def python_executable() -> str:
    """The real interpreter (``python3`` on PATH may be a shell shim, e.g. pyenv's)."""
    return os.path.realpath(sys.executable)
