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
* a name the recording made in a temporary directory: an empty private place, so an
  exclusive creation of that name finds it free, as the recording did;
* a host state directory (``/var/lib/libuuid``): its recorded files.

Everything else is the live file system, read and written as it is -- as in the mount
namespace, where only the sealed paths are covered.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stenograph.recorder.errors import BadInput
from stenograph.runner.seal import Seal

PAIRS_MAX = 1024  # shim_c/pathmap.c PM_PAIRS
TEXT_MAX = 256 * 1024  # shim_c/pathmap.c PM_TEXT


@dataclass
class PathMap:
    """The pairs (recorded path -> private place; ``""``: kept live) and the file the shim
    reads them from (``STENO_PATHMAP``)."""

    file: Path
    pairs: list[tuple[str, str]] = field(default_factory=list)

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
        text = "".join(f"{s}\t{d}\n" for s, d in self.pairs)
        if len(self.pairs) > PAIRS_MAX or len(text.encode()) >= TEXT_MAX:
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
        names = [n for n in seal.hide.get(root, ()) if "/" not in n and n not in (".", "..")]
        if names:
            place = stage / f"t{i}"
            place.mkdir()
            pm.pairs += [(os.path.join(root, n), str(place / n)) for n in names]
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
    for k in seal.keep:  # the tape, the store: always the real ones
        if pm.map(k) != k:
            pm.pairs.append((k, ""))
    if seal.keep_writes:
        raise BadInput("--keep-writes needs a namespace seal (root, or user namespaces "
                       "allowed); a replay sealed by path mapping writes into the tape")
    pm.write()
    return pm


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
            if stat.S_ISDIR(st.st_mode):
                kept.append(src)
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
