"""The sealed namespace a run from a recording runs in.

A replay runs *sealed* (``Seal``): in a private mount namespace where the temporary
directories (``/tmp``, ``/var/tmp``, ``$TMPDIR``) are overlays of themselves on a fresh
tmpfs, with every name the recorded run created there hidden (a whiteout), so an
exclusive creation (``mkdtemp``, ``mktemp -d``, ``O_CREAT|O_EXCL``) of a name the
recording drew finds it free again, as the recording did; what the replay writes there
is discarded with the namespace. Host state files libraries keep across runs
(``/var/lib/libuuid``) are put back as they were when the recording started, and each
recorded workspace root is an overlay of its start snapshot (``runner/workspace.py``).
``HeldSeal`` keeps such a namespace alive for a resume, whose recorder reads the
program's view of its files while it runs.

Root makes the mount namespace directly. Anyone else makes a user namespace first, with
their own uid and gid mapped to themselves (``getuid()`` in the sealed program is what it
was at record), and the mount namespace in it: the same overlays and tmpfs, mounted with
the capabilities a user holds in a namespace of their own. Where the kernel allows no
user namespace (``user.max_user_namespaces=0``, a container's seccomp profile, an
AppArmor restriction), the seal is unavailable and says so in one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.runner.birth import birth_time

STATE_DIRS = ("/var/lib/libuuid",)
"""Directories of host state a library keeps between runs (libuuid's ``clock.txt``, read
and rewritten under ``flock`` by ``uuid_generate_time``): the recorded run changed them,
so replay gets them back as they were when the recording started."""

STATE_MAX = 64 * 1024
"""A state directory bigger than this (or holding anything but regular files) is not
snapshotted; replay then hides it behind an empty tmpfs."""

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


SEAL_VAR = "STENOGRAPH_SEAL"
"""``path-map`` here seals by path mapping even where a namespace could be made (to try
or measure it as root)."""


def seal_kind() -> str:
    """How this process's replays are sealed: ``mount-namespace`` (root with
    CAP_SYS_ADMIN), ``user-namespace`` (anyone else, where the kernel allows one: root
    without CAP_SYS_ADMIN too, as in a container) or ``path-map`` (the shim's path
    mapping, ``runner/pathmap.py``: where no namespace can be made)."""
    if os.environ.get(SEAL_VAR) == "path-map":
        return "path-map"
    return _namespace_kind()


@functools.cache
def _namespace_kind() -> str:
    if os.geteuid() == 0 and _can_mount(user=False):
        return "mount-namespace"
    return "user-namespace" if _can_mount(user=True) else "path-map"


def _can_mount(*, user: bool) -> bool:
    """Can this process seal a replay in a namespace of that kind? Asked of a child,
    which makes one and mounts a tmpfs in it, then exits: where AppArmor restricts user
    namespaces (Ubuntu 24.04) ``unshare`` succeeds and the mounts are what fail."""
    libc = _libc()
    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                      ctypes.c_char_p]
    uid, gid = os.geteuid(), os.getegid()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS if user else CLONE_NEWNS) == 0:
                if user:
                    _map_self(uid, gid)
                ok = (mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0 and
                      mount(b"steno-probe", b"/tmp", b"tmpfs", 0, None) == 0)
        finally:
            os._exit(0 if ok else 1)
    return os.waitpid(pid, 0)[1] == 0


def _map_self(uid: int, gid: int) -> None:
    """In a user namespace just made: the caller's own ids mapped to themselves (the
    kernel wants ``setgroups`` denied before an unprivileged gid map)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"),
                       ("gid_map", f"{gid} {gid} 1\n")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as exc:
            raise OSError(exc.errno, f"write /proc/self/{name}: {exc.strerror}") from None


def seal_roots(env: Mapping[str, str]) -> list[str]:
    """The temporary directories a replay gets fresh: /tmp, /var/tmp and $TMPDIR."""
    roots: list[str] = []
    for cand in ("/tmp", "/var/tmp", env.get("TMPDIR") or ""):
        if not cand or not os.path.isabs(cand) or not os.path.isdir(cand):
            continue
        real = os.path.realpath(cand)
        if real not in roots:
            roots.append(real)
    # an outer root first: an inner one is mounted over the outer's overlay
    return sorted(roots, key=lambda r: r.count("/"))


def listing(roots: Sequence[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for root in roots:
        try:
            out[root] = set(os.listdir(root))
        except OSError:
            out[root] = set()
    return out


def created_names(before: Mapping[str, set[str]],
                  after: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """Names that appeared in each temporary directory while the recorded run ran."""
    return {root: sorted(after.get(root, set()) - names) for root, names in before.items()
            if after.get(root, set()) - names}


BORN_LIMIT = 20000
"""Entries looked at per listed directory for names born since a recording (a bound: a
directory of millions of files is not read whole)."""


def born_since(listed: Sequence[str], roots: Sequence[str], since: float,
               spare: Sequence[str]) -> dict[str, list[str]]:
    """Per temporary root, the names made since ``since`` (a recording's start) in the
    directories under it that the recording listed (a test runner's
    ``/tmp/pytest-of-USER``, which later runs fill with ``pytest-N+1``...). A sealed
    replay hides them, so what the program finds where it looked is what it found then
    (a name it computes from the listing is free again). Only where it looked: a
    checkout or a virtualenv made in /tmp since stays. ``spare``: paths that stay (the
    tape, the store, the workspace) with the directories on the way to them."""
    keep = [os.path.realpath(p) for p in spare]

    def holds_kept(path: str) -> bool:
        return any(k == path or k.startswith(path + "/") or path.startswith(k + "/")
                   for k in keep)

    out: dict[str, list[str]] = {}
    for d in listed:
        root = next((r for r in roots if d == r or d.startswith(r.rstrip("/") + "/")), None)
        if root is None or any(d == k or d.startswith(k + "/") for k in keep):
            continue
        try:
            entries = os.listdir(d)[:BORN_LIMIT]
        except OSError:
            continue
        for name in entries:
            full = os.path.join(d, name)
            born = birth_time(full)
            if born is not None and born >= since and not holds_kept(full):
                out.setdefault(root, []).append(os.path.relpath(full, root))
    return {r: sorted(set(v)) for r, v in out.items()}


TREE_DEPTH, TREE_MAX, TREE_DIR_MAX = 4, 20_000, 2_000
"""How far ``start_tree`` looks: names four levels down (a test runner's
``pytest-of-USER/pytest-N/test_x0/file``), at most 20,000 in all and 2,000 under one
top-level entry (a checkout or a virtualenv in /tmp is not walked whole)."""


def start_tree(roots: Sequence[str]) -> dict[str, list[list[str]]]:
    """The names under each temporary root as a run starts: ``[relpath, kind]`` with kind
    ``d`` (directory), ``f`` (anything else) or ``l:TARGET`` (a symbolic link). A sealed
    replay gives back, empty, those removed since (``gone_from``)."""
    out: dict[str, list[list[str]]] = {}
    total = 0
    for root in roots:
        names: list[list[str]] = []
        try:
            top = sorted(os.listdir(root))
        except OSError:
            continue
        for first in top:
            seen = 0
            todo = [(first, 1)]
            while todo and seen < TREE_DIR_MAX and total < TREE_MAX:
                rel, depth = todo.pop(0)
                full = os.path.join(root, rel)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                seen += 1
                total += 1
                if os.path.stat.S_ISLNK(st.st_mode):
                    with contextlib.suppress(OSError):
                        names.append([rel, "l:" + os.readlink(full)])
                    continue
                is_dir = os.path.stat.S_ISDIR(st.st_mode)
                names.append([rel, "d" if is_dir else "f"])
                if is_dir and depth < TREE_DEPTH:
                    with contextlib.suppress(OSError):
                        todo += [(f"{rel}/{n}", depth + 1) for n in sorted(os.listdir(full))]
        out[root] = names
    return out


def gone_from(tree: Mapping[str, Sequence[Sequence[str]]], listed: Sequence[str],
              spare: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """Per temporary root, what ``start_tree`` saw there that no longer exists, in the
    directories the recording listed (and below them)."""
    keep = [os.path.realpath(p) for p in spare]
    looked = [d.rstrip("/") + "/" for d in listed]
    out: dict[str, list[tuple[str, str]]] = {}
    for root, names in tree.items():
        for item in names:
            if len(item) != 2 or ".." in str(item[0]).split("/"):
                continue
            full = os.path.join(root, str(item[0]))
            if not any(full.startswith(d) for d in looked) or os.path.lexists(full) or any(
                    full == k or full.startswith(k + "/") for k in keep):
                continue
            out.setdefault(root, []).append((str(item[0]), str(item[1])))
    return out


def snapshot_state() -> dict[str, dict[str, str] | None]:
    """The state directories as they are now: ``{dir: {name: hex content}}``; a dir that
    does not exist maps to ``{}`` with no files, one too big to keep to ``None``."""
    out: dict[str, dict[str, str] | None] = {}
    for d in STATE_DIRS:
        if not os.path.isdir(d):
            out[d] = {}
            continue
        files: dict[str, str] | None = {}
        total = 0
        try:
            for name in sorted(os.listdir(d)):
                path = os.path.join(d, name)
                if not os.path.isfile(path) or os.path.islink(path):
                    files = None
                    break
                with open(path, "rb") as f:
                    data = f.read(STATE_MAX + 1)
                total += len(data)
                if total > STATE_MAX:
                    files = None
                    break
                files[name] = data.hex()  # type: ignore[index]
        except OSError:
            files = None
        out[d] = files
    return out


@dataclass(frozen=True)
class Seal:
    """How a replay is sealed: temporary roots with the names to hide, the state to put
    back, and the directories that must stay the real ones (the tape: the shim writes its
    reports there for this process to read)."""

    hide: Mapping[str, Sequence[str]]
    state: Mapping[str, Mapping[str, str] | None]
    keep: Sequence[str]
    stage: str  # an empty directory of ours: the overlays' upper layers are mounted here
    workspaces: Sequence[Any] = ()
    """``interpose.workspace.WorkspaceMount``s: the recorded workspace, overlaid."""
    keep_writes: str | None = None
    """Where the workspace overlays' upper layers go instead of scratch (kept)."""
    cwd: str | None = None
    """The directory the program starts in, entered once the mounts are made."""
    place: Mapping[str, Sequence[tuple[str, str]]] = field(default_factory=dict)
    """Per temporary root, names that were there when the recording started and are gone
    now (the recorded run, or a later one, removed them): given back empty (a directory,
    a file, a link) so the program finds the names it found (``start_tree``)."""


class SealUnavailable(BadInput):
    pass


def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _submounts(roots: Sequence[str]) -> dict[str, list[str]]:
    """Per temporary root, the outermost mount points strictly under it."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            points = [line.split()[4] for line in f if len(line.split()) > 4]
    except OSError:
        return {}
    points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), p) for p in points]
    out: dict[str, list[str]] = {}
    for root in roots:
        under = sorted({p for p in points if p.startswith(root.rstrip("/") + "/")})
        top: list[str] = []
        for p in under:
            if not any(p.startswith(t + "/") for t in top) and os.path.exists(p):
                top.append(p)
        if top:
            out[root] = top
    return out


def _upper_dirs(root: str, upper: str, rel: str, own: bool) -> None:
    """``rel``'s directories in an overlay's upper layer, each with its lower twin's mode
    and owner (a merged directory shows the upper one's); one with no lower twin (given
    back, ``Seal.place``) is the user's, ``0755``."""
    path = ""
    for part in rel.split("/"):
        path = f"{path}/{part}" if path else part
        dst = os.path.join(upper, path)
        if os.path.isdir(dst):
            continue
        try:
            st = os.stat(os.path.join(root, path))
        except FileNotFoundError:
            os.mkdir(dst, 0o755)
            continue
        os.mkdir(dst)
        os.chmod(dst, st.st_mode & 0o7777)
        if not own:
            os.chown(dst, st.st_uid, st.st_gid)


def _give_back(root: str, upper: str, names: Sequence[tuple[str, str]], own: bool) -> None:
    for rel, kind in sorted(names):
        if ".." in rel.split("/"):
            continue
        with contextlib.suppress(OSError):
            if os.path.dirname(rel):
                _upper_dirs(root, upper, os.path.dirname(rel), own)
            dst = os.path.join(upper, rel)
            if kind == "d":
                os.mkdir(dst, 0o755)
            elif kind.startswith("l:"):
                os.symlink(kind[2:], dst)
            else:
                os.close(os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def seal_preexec(seal: Seal, roots: Sequence[str], why: int) -> Any:
    """The function the replay's child runs before exec: everything it needs is resolved
    here, in the parent. What went wrong, if anything, is written to the fd ``why`` (the
    subprocess module reports only that the function failed)."""
    libc = _libc()
    unshare, mount = libc.unshare, libc.mount
    unshare.argtypes = [ctypes.c_int]
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                      ctypes.c_char_p]

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    subs = _submounts(roots)
    uid, gid = os.geteuid(), os.getegid()
    own = seal_kind() == "user-namespace"  # a user namespace of the user's own first
    # in a user namespace overlayfs may not write trusted.* xattrs: removing a directory
    # the lower layers hold (an opaque one made again) fails with EIO without user.*
    xattr = ",userxattr" if own else ""

    def run() -> None:
        if own:
            check(unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
            _map_self(uid, gid)
        else:
            check(unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        keep_fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in seal.keep]
        sub_fds = {r: [(p, os.open(p, os.O_PATH)) for p in subs.get(r, ())] for r in roots}
        # a workspace layer in /tmp must be the real one: seen through /tmp's overlay,
        # its whiteouts would be files
        ws_fds = [[os.open(low, os.O_PATH | os.O_DIRECTORY) for low in m.lowers]
                  for m in seal.workspaces]
        bind_fds = [[os.open(b, os.O_PATH | os.O_DIRECTORY) for b in m.binds]
                    for m in seal.workspaces]
        kfd = (os.open(seal.keep_writes, os.O_PATH | os.O_DIRECTORY)
               if seal.keep_writes else None)
        stage = seal.stage.encode()
        check(mount(b"steno-seal", stage, b"tmpfs", 0, b"mode=0700"), "mount tmpfs")
        # every layer is made before any overlay hides the stage's path: once /tmp is an
        # overlay, the stage is reached through an fd only
        sfd = os.open(seal.stage, os.O_PATH | os.O_DIRECTORY)
        for i, root in enumerate(roots):
            upper, work = f"{seal.stage}/u{i}", f"{seal.stage}/w{i}"
            os.mkdir(upper)
            os.mkdir(work)
            st = os.stat(root)
            os.chmod(upper, st.st_mode & 0o7777)
            if not own:  # a user owns what they make (their namespace maps no one else)
                os.chown(upper, st.st_uid, st.st_gid)
            for name in seal.hide.get(root, ()):
                if name in (".", "..") or ".." in name.split("/"):
                    continue
                parent = os.path.dirname(name)
                if parent:  # a nested name: its directory merged, as the lower one is
                    with contextlib.suppress(OSError):
                        _upper_dirs(root, upper, parent, own)
                with contextlib.suppress(OSError):
                    os.mknod(os.path.join(upper, name), 0o600 | 0o020000, 0)  # whiteout
            _give_back(root, upper, seal.place.get(root, ()), own)
        for i, root in enumerate(roots):
            layers = f"/proc/self/fd/{sfd}"
            opts = (f"lowerdir={root},upperdir={layers}/u{i},workdir={layers}/w{i}"
                    f"{xattr}").encode()
            check(mount(b"overlay", root.encode(), b"overlay", 0, opts), f"overlay on {root}")
            # an overlay's lower layer is one file system: what is mounted under it (a
            # checkout on its own tmpfs) goes back on top, as it is
            for path, fd in sub_fds[root]:
                check(mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                            MS_BIND | MS_REC, None), f"bind {path}")
                os.close(fd)
        # the workspace overlays: after the temporary roots' (a workspace may be inside
        # one), their layers reached through fds opened before those
        for i, m in enumerate(seal.workspaces):
            base = f"/proc/self/fd/{kfd}" if kfd is not None else f"/proc/self/fd/{sfd}"
            upper = f"{base}/{m.name}" if kfd is not None else f"{base}/wsu{i}"
            work = f"{base}/.work-{m.name}" if kfd is not None else f"{base}/wsw{i}"
            os.mkdir(upper)
            os.mkdir(work)
            if m.create:  # inside a temporary root, whose overlay is scratch by now
                os.makedirs(m.target, exist_ok=True)
            st = os.stat(f"/proc/self/fd/{ws_fds[i][0]}")
            os.chmod(upper, st.st_mode & 0o7777)
            if not own:
                os.chown(upper, st.st_uid, st.st_gid)
            # the root of an overlay is its upper directory: give it the recorded times
            os.utime(upper, ns=(st.st_atime_ns, st.st_mtime_ns))
            lowers = ":".join(f"/proc/self/fd/{fd}" for fd in ws_fds[i])
            opts = f"lowerdir={lowers},upperdir={upper},workdir={work}{xattr}".encode()
            check(mount(b"overlay", m.target.encode(), b"overlay", 0, opts),
                  f"overlay on {m.target}")
            for b, fd in zip(m.binds, bind_fds[i], strict=True):
                check(mount(f"/proc/self/fd/{fd}".encode(), b.encode(), None,
                            MS_BIND | MS_REC, None), f"bind {b}")
                os.close(fd)
        for fds in ws_fds:
            for fd in fds:
                os.close(fd)
        if kfd is not None:
            os.close(kfd)
        os.close(sfd)
        for d, files in seal.state.items():
            if not os.path.isdir(d):
                continue  # nothing to hide, nowhere to put it back
            check(mount(b"steno-state", d.encode(), b"tmpfs", 0, b"mode=0755"),
                  f"mount tmpfs on {d}")
            for name, data in (files or {}).items():
                if "/" not in name:
                    with open(os.path.join(d, name), "wb") as f:
                        f.write(bytes.fromhex(data))
        for k, fd in zip(seal.keep, keep_fds, strict=True):
            check(mount(f"/proc/self/fd/{fd}".encode(), k.encode(), None, MS_BIND, None),
                  f"bind {k}")
            os.close(fd)
        os.chdir(seal.cwd or os.getcwd())  # through the new mounts

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:
            os.write(why, str(exc).encode(errors="replace")[:1000])
            raise

    return guarded


CLONE_NEWNS_ENTER = CLONE_NEWNS

HOLDER = "import os, sys; os.write(1, b'ok'); sys.stdin.buffer.read()"
"""What the process holding a sealed namespace runs: it says it is in, then waits for its
stdin to close."""


class HeldSeal:
    """A sealed namespace made by a small process of ours that stays in it until
    ``close``: the program enters it (``setns`` before exec) and the recorder reads the
    program's view of its files through ``view`` (``/proc/<holder>/root/...``) while it
    runs and after it ended -- a resume's checkpoints are of what the program saw."""

    def __init__(self, seal: Seal, env: Mapping[str, str]) -> None:
        with why_pipe() as why_w:
            self.proc = subprocess.Popen(
                [os.path.realpath(sys.executable), "-S", "-c", HOLDER], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, close_fds=True, env={"PATH": "/usr/bin:/bin"},
                preexec_fn=seal_preexec(seal, seal_roots(env), why_w))
        assert self.proc.stdout is not None
        if self.proc.stdout.read(2) != b"ok":
            self.proc.wait()
            raise SealUnavailable("the sealed namespace's holder did not start")
        self.ns_fd = os.open(f"/proc/{self.proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.user_fd = -1  # the holder's user namespace, when it made one: entered first
        if os.stat(f"/proc/{self.proc.pid}/ns/user").st_ino != os.stat(
                "/proc/self/ns/user").st_ino:
            self.user_fd = os.open(f"/proc/{self.proc.pid}/ns/user",
                                   os.O_RDONLY | os.O_CLOEXEC)
        self.cwd = seal.cwd

    def view(self, path: str) -> str:
        """``path`` as the sealed program sees it."""
        return f"/proc/{self.proc.pid}/root{os.path.abspath(path)}"

    def enter(self, why: int, cwd: str | Path | None) -> Callable[[], None]:
        """The function the program's child runs before exec: into the namespace, then
        into its working directory there (``setns`` leaves it at the namespace's root)."""
        libc = _libc()
        setns = libc.setns
        setns.argtypes = [ctypes.c_int, ctypes.c_int]
        fd, user_fd, cwd = self.ns_fd, self.user_fd, str(self.cwd or cwd or os.getcwd())

        def run() -> None:
            try:
                if user_fd >= 0 and setns(user_fd, CLONE_NEWUSER) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns(user): {os.strerror(err)}")
                if setns(fd, CLONE_NEWNS_ENTER) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns: {os.strerror(err)}")
                os.chdir(cwd)
            except BaseException as exc:
                os.write(why, str(exc).encode(errors="replace")[:1000])
                raise

        return run

    def close(self) -> None:
        """Let the holder go (the namespace ends with it); again does nothing."""
        if self.ns_fd < 0:
            return
        for fd in (self.ns_fd, self.user_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.ns_fd = self.user_fd = -1
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def why_pipe() -> Iterator[int]:
    """A pipe a child's preexec function writes what went wrong into (the subprocess
    module says only that it failed): a failed spawn becomes ``SealUnavailable`` with
    that reason."""
    why_r, why_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        yield why_w
    except subprocess.SubprocessError:
        try:
            why = os.read(why_r, 1000).decode(errors="replace")
        except OSError:
            why = ""
        raise _unavailable(why) from None
    finally:
        os.close(why_r)
        os.close(why_w)


UNSEALED = ("rerun with --unsealed to replay against the live files (what the replay "
            "writes then reaches them)")


def _unavailable(why: str) -> SealUnavailable:
    """The seal's namespace could be made when asked (``seal_kind``) and could not now."""
    return SealUnavailable(
        f"cannot seal the replay in a {seal_kind().replace('-', ' ')} "
        f"({why or 'refused'}); {SEAL_VAR}=path-map seals it by path mapping instead, or "
        f"{UNSEALED}")
