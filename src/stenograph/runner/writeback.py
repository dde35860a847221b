"""A sealed run's writes, put into the real workspace when it ends (``stenograph resume``).

A resume replays its prefix against the workspace as the recording found it: each root
is an overlay whose lower layer is the start snapshot, so the real directory is never
rolled back in place (which deleted files a person had added since the crash, the
resume's own ``> out.log`` among them). What the resumed program wrote, in the replayed
prefix and live after it, is the overlay's upper layer; ``write_back`` applies it to the
real root once the program is done:

* a file or symlink in the upper layer replaces the real one (written beside it, then
  renamed over it); a whiteout removes the real path; an opaque directory (the program
  removed it and made it again) loses the real entries it no longer has;
* paths the upper layer does not name are never touched: the run did not write them;
* before a real file is replaced or removed, its bytes are *set aside* (moved under
  ``aside``) unless they are a version the run itself is known to have had there (the
  start snapshot's, or a checkpoint's of the crashed run) or already what is written:
  what a person changed since, or what the crashed run wrote after its last checkpoint,
  is kept and listed, never lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
"""How overlayfs marks a directory that hides the lower one's entries (``user.`` when
mounted in a user namespace with ``userxattr``)."""

Known = Callable[[str], set[str]]
"""A relative path -> the sha256 of every version the run is known to have had there."""


@dataclass
class WriteBack:
    """What ``write_back`` did to one root."""

    root: str
    written: int = 0
    removed: int = 0
    set_aside: list[str] = field(default_factory=list)
    """Relative paths whose real bytes were moved under the set-aside directory first."""


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    for name in OPAQUE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
    return False


def _sha256(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _walk(upper: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry of the upper layer, parents before children, by relative path."""
    stack = [""]
    while stack:
        rel = stack.pop()
        d = os.path.join(upper, rel) if rel else upper
        try:
            names = sorted(os.listdir(d), reverse=True)
        except OSError:
            continue
        for name in names:
            r = f"{rel}/{name}" if rel else name
            try:
                st = os.lstat(os.path.join(upper, r))
            except OSError:
                continue
            yield r, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(r)


def write_back(upper: str | Path, root: str | Path, aside: str | Path,
               known: Known = lambda rel: set()) -> WriteBack:
    """Apply the overlay upper layer ``upper`` to the real directory ``root`` (see the
    module docstring); real bytes in the way go under ``aside`` first unless ``known``
    names them."""
    upper, root, aside = str(upper), str(root), Path(aside)
    done = WriteBack(root)

    def put_aside(rel: str) -> None:
        """Move the real ``rel`` out of the way, into ``aside`` if it is anyone's."""
        real = os.path.join(root, rel)
        try:
            st = os.lstat(real)
        except OSError:
            return
        if stat.S_ISDIR(st.st_mode):
            if _keepable_tree(real, rel, known):
                dest = aside / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(real, dest)
                done.set_aside.append(rel + "/")
            else:
                shutil.rmtree(real, ignore_errors=True)
            return
        if _keepable(real, st, rel, known):
            dest = aside / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(real, dest)
            done.set_aside.append(rel)
        else:
            os.unlink(real)

    os.makedirs(root, exist_ok=True)
    dirs: list[tuple[str, os.stat_result]] = []
    for rel, st in _walk(upper):
        src, real = os.path.join(upper, rel), os.path.join(root, rel)
        if _is_whiteout(st):
            if os.path.lexists(real):
                put_aside(rel)
                done.removed += 1
            continue
        if stat.S_ISDIR(st.st_mode):
            if os.path.lexists(real) and not (os.path.isdir(real) and not os.path.islink(real)):
                put_aside(rel)
            if not os.path.isdir(real):
                os.mkdir(real)
                done.written += 1
            elif _opaque(src):
                theirs = set(os.listdir(src))
                for name in sorted(set(os.listdir(real)) - theirs):
                    put_aside(f"{rel}/{name}")
                    done.removed += 1
            dirs.append((rel, st))
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(src)
            if os.path.islink(real) and os.readlink(real) == target:
                continue
            if os.path.lexists(real):
                put_aside(rel)
            os.symlink(target, real)
            done.written += 1
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # a fifo or socket the program made: nothing to carry
        if os.path.isfile(real) and not os.path.islink(real) and _sha256(real) == _sha256(src):
            _meta(real, st)
            continue
        if os.path.lexists(real):
            put_aside(rel)
        tmp = f"{real}.steno-tmp-{os.getpid()}"
        shutil.copyfile(src, tmp, follow_symlinks=False)
        _meta(tmp, st)
        os.replace(tmp, real)
        done.written += 1
    for rel, st in reversed(dirs):  # children first: their writes moved the mtimes
        _meta(os.path.join(root, rel), st)
    return done


def _meta(path: str, st: os.stat_result) -> None:
    with contextlib.suppress(OSError):
        os.chmod(path, stat.S_IMODE(st.st_mode))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _keepable(real: str, st: os.stat_result, rel: str, known: Known) -> bool:
    """Is the real file at ``rel`` anyone's bytes (not a version the run had there)?"""
    if stat.S_ISLNK(st.st_mode):
        return True
    digest = _sha256(real)
    return digest is None or digest not in known(rel)


def _keepable_tree(real: str, rel: str, known: Known) -> bool:
    for dirpath, _dirs, files in os.walk(real):
        for name in files:
            full = os.path.join(dirpath, name)
            sub = os.path.join(rel, os.path.relpath(full, real))
            with contextlib.suppress(OSError):
                if _keepable(full, os.lstat(full), sub, known):
                    return True
    return False
