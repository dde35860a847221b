"""A seal made of path pairs, for where no namespace can be made.

A user on a kernel that allows no user namespace (``user.max_user_namespaces=0``, a
container's default seccomp profile, Ubuntu's AppArmor restriction) gets the replay's
private view from the shim instead (``shim_c/pathmap.c``): every path the program's tree
names under a sealed path is rewritten to a private place of ours, and the answers that
name a place (``getcwd``, ``readlink``) back. This module makes those places from the same
``Seal`` the namespace path mounts, and writes the pairs file the shim reads:

* a workspace root: its restored start snapshot, with what the overlay would show through
  from the live directory (a file the rules left out) copied in, and each live directory
  the overlay binds back (a virtualenv, caches, stenograph itself) kept live;
* a temporary directory: a name the recording made there, an empty private place (an
  exclusive creation of that name finds it free, as the recording did); any other name
  that does not exist live, a private place too (what the replay makes there); what
  exists live stays live;
* a host state directory (``/var/lib/libuuid``): its recorded files.

Everything else is the live file system, read and written as it is -- as in the mount
namespace, where only the sealed paths are covered.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stenograph.recorder.errors import BadInput
from stenograph.runner.seal import HeldSeal, Seal, seal_kind, seal_roots

PAIRS_MAX = 1024  # shim_c/pathmap.c PM_PAIRS
TEXT_MAX = 256 * 1024  # shim_c/pathmap.c PM_TEXT


Shape = tuple[str, int, int, int, int]
"""What a file of a private copy was before the run: kind, size, mtime_ns, inode, mode
(a symlink's kind carries its target; ``o``: a fifo or socket, not carried)."""


@dataclass
class Copy:
    """A workspace root's private copy, what it held before the run, and the name its
    writes go under (``--keep-writes``, a resume's write-back)."""

    place: Path
    name: str
    before: dict[str, Shape]
    target: str = ""
    """The recorded path the copy stands for (a symlink into the copy points there)."""


@dataclass
class PathMap:
    """The pairs (recorded path -> private place; ``""``: kept live) and the file the shim
    reads them from (``STENO_PATHMAP``)."""

    file: Path
    pairs: list[tuple[str, str]] = field(default_factory=list)
    fresh: list[tuple[str, str]] = field(default_factory=list)
    """Temporary roots: an entry that exists live stays live, a new name goes to dst."""
    copies: list[Copy] = field(default_factory=list)
    keep_writes: str | None = None

    def finish(self) -> None:
        """The run is over: each copy's writes as an overlay upper layer would hold them,
        under ``keep_writes`` (what ``runner/writeback.py`` applies to a real root)."""
        if self.keep_writes is None:
            return
        for c in self.copies:
            _upper(c, Path(self.keep_writes) / c.name)

    def map(self, path: str) -> str:
        """``path`` as the kernel must see it (the shim's ``pm_in``)."""
        best: tuple[str, str] | None = None
        for src, dst in self.pairs:
            if (path == src or path.startswith(src.rstrip("/") + "/")) and (
                    best is None or len(src) > len(best[0])):
                best = (src, dst)
        if best is None or not best[1]:
            return path
        return best[1] + path[len(best[0]):]

    def write(self) -> None:
        text = "".join(f"{s}\t{d}\n" for s, d in self.pairs) + "".join(
            f"{s}\t{d}\tfresh\n" for s, d in self.fresh)
        if len(self.pairs) + len(self.fresh) > PAIRS_MAX or len(text.encode()) >= TEXT_MAX:
            raise BadInput(f"the replay's path mapping needs {len(self.pairs)} pairs "
                           f"({len(text)} bytes), more than the shim holds ({PAIRS_MAX}, "
                           f"{TEXT_MAX}); run as root or where user namespaces are allowed")
        self.file.write_text(text)


def build(seal: Seal, roots: Sequence[str]) -> PathMap:
    """The private places for ``seal`` (made under its stage directory) and their pairs;
    ``roots``: the temporary directories (``seal.seal_roots``)."""
    stage = Path(seal.stage)
    stage.mkdir(parents=True, exist_ok=True)
    pm = PathMap(stage / "pathmap")
    for i, root in enumerate(roots):
        place = stage / f"t{i}"
        place.mkdir()
        names = [n for n in seal.hide.get(root, ()) if "/" not in n and n not in (".", "..")]
        pm.pairs += [(os.path.join(root, n), str(place / n)) for n in names]
        pm.fresh.append((root, str(place)))  # what the replay makes there: private
    for i, (d, files) in enumerate(seal.state.items()):
        if not os.path.isdir(d):
            continue
        place = stage / f"state{i}"
        place.mkdir()
        for name, data in (files or {}).items():
            if "/" not in name:
                (place / name).write_bytes(bytes.fromhex(data))
        pm.pairs.append((d, str(place)))
    for m in seal.workspaces:
        lower = Path(m.lowers[0])
        live = m.lowers[1] if len(m.lowers) > 1 else None
        if live is not None:
            pm.pairs += [(p, "") for p in _merge(lower, live, m.binds)]
        pm.pairs.append((m.target, str(lower)))
        _retarget(lower, m.target)
        if seal.keep_writes:
            pm.copies.append(Copy(lower, m.name, _shapes(lower), m.target))
    for k in seal.keep:  # the tape, the store: always the real ones
        if pm.map(k) != k:
            pm.pairs.append((k, ""))
    pm.keep_writes = seal.keep_writes
    pm.write()
    return pm


def _shapes(top: Path) -> dict[str, Shape]:
    out: dict[str, Shape] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            kind = ("l:" + os.readlink(p) if stat.S_ISLNK(st.st_mode) else
                    "d" if stat.S_ISDIR(st.st_mode) else
                    "f" if stat.S_ISREG(st.st_mode) else "o")
            out[os.path.relpath(p, top)] = (kind, st.st_size, st.st_mtime_ns, st.st_ino,
                                            st.st_mode)
    return out


def _upper(c: Copy, upper: Path) -> None:
    """``c``'s changes since ``c.before`` as an overlay upper layer at ``upper``: what is
    new or changed, copied (its directories made); what is gone, a whiteout."""
    upper.mkdir(parents=True, exist_ok=True)
    now = _shapes(c.place)
    for rel in sorted(now):
        shape = now[rel]
        was = c.before.get(rel)
        if shape[0] == "d":
            if was is None or was[0] != "d":
                (upper / rel).mkdir(parents=True, exist_ok=True)
                shutil.copystat(c.place / rel, upper / rel)
            continue
        if was == shape:
            continue
        if shape[0] == "o" or any(now.get(a, ("d",))[0] != "d" for a in _parents(rel)):
            continue  # a fifo or socket: nothing to carry
        dst = upper / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(dst):
            continue
        if shape[0].startswith("l:"):
            to = shape[0][2:]
            here = str(c.place)
            if c.target and (to == here or to.startswith(here + "/")):
                to = c.target.rstrip("/") + to[len(here):]  # the shim put it in the copy
            os.symlink(to, dst)
        else:
            shutil.copy2(c.place / rel, dst)
    for rel in sorted(set(c.before) - set(now)):
        parent = os.path.dirname(rel)
        if parent and (parent not in now or now[parent][0] != "d"):
            continue  # its directory went too (or became a file): one whiteout, there
        dst = upper / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dst, stat.S_IFCHR | 0o600, 0)
    for rel in sorted(now, reverse=True):  # directories' times: as the copy has them
        if now[rel][0] == "d" and (upper / rel).is_dir():
            shutil.copystat(c.place / rel, upper / rel)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]


class MappedHold:
    """``seal.HeldSeal``'s part for a resume sealed by path mapping: nothing to hold (the
    places are directories of ours); the program's view of a path is its private place."""

    proc = None

    def __init__(self, seal: Seal, env: Mapping[str, str]) -> None:
        self.pathmap = build(seal, seal_roots(env))
        self.cwd = seal.cwd

    def view(self, path: str) -> str:
        return self.pathmap.map(os.path.abspath(path))

    def close(self) -> None:
        """The run is over: its writes laid out for the write-back (once)."""
        if self.pathmap is not None:
            self.pathmap.finish()
            self.pathmap.keep_writes = None


def hold(seal: Seal, env: Mapping[str, str]) -> HeldSeal | MappedHold:
    """The sealed view a resume's program runs in, kept until ``close``."""
    if seal_kind() == "path-map":
        return MappedHold(seal, env)
    return HeldSeal(seal, env)


def _merge(lower: Path, live: str, binds: Iterable[str]) -> list[str]:
    """Make ``lower`` what an overlay of it on ``live`` shows: its whiteouts removed, the
    live files it shows through copied in; the live directories it shows through (the
    binds among them) returned, to be kept live."""
    kept: list[str] = []
    bound = {os.path.realpath(b) for b in binds}
    for dirpath, dirnames, filenames in os.walk(lower):
        rel = os.path.relpath(dirpath, lower)
        here = live if rel == "." else os.path.join(live, rel)
        mine = set(dirnames) | set(filenames)
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: hides a live one
                os.unlink(p)
        try:
            names = os.listdir(here)
        except OSError:
            continue
        for name in names:
            if name in mine:
                continue
            src = os.path.join(here, name)
            try:
                st = os.lstat(src)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):  # kept live; a place-holder lists it
                kept.append(src)
                with contextlib.suppress(OSError):
                    os.mkdir(os.path.join(dirpath, name), stat.S_IMODE(st.st_mode))
                continue
            dst = os.path.join(dirpath, name)
            try:
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(src), dst)
                elif stat.S_ISREG(st.st_mode):
                    shutil.copy2(src, dst)
            except OSError:
                continue
    for b in bound:
        if b not in kept and os.path.isdir(b):
            kept.append(b)
    return kept


def _retarget(lower: Path, target: str) -> None:
    """A restored symlink whose absolute target lies in the workspace points into the
    copy (the kernel follows it without the shim; ``readlink`` maps it back)."""
    prefix = target.rstrip("/") + "/"
    for dirpath, dirnames, filenames in os.walk(lower):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                continue
            to = os.readlink(p)
            if to == target or to.startswith(prefix):
                os.unlink(p)
                os.symlink(str(lower) + to[len(target.rstrip("/")):], p)
