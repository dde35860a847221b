"""A directory tree as a restore must give it back: for each path (``.`` the root), its
type and mode, a file's bytes, a link's target, and (``times``) mtimes -- read straight
from the filesystem, for comparing a restored tree with the one a snapshot was taken of."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def tree(root: Path, *, times: bool = True, dir_times: bool | None = None,
         root_entry: bool = True) -> dict[str, tuple[object, ...]]:
    """``dir_times`` (default: ``times``) says whether directories' mtimes count too."""
    dir_times = times if dir_times is None else dir_times
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p), st.st_mtime_ns if times else 0)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_mtime_ns if dir_times else 0)
            else:
                out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_mtime_ns if times else 0,
                            p.read_bytes())
    if root_entry:
        st = root.lstat()
        out["."] = ("d", stat.S_IMODE(st.st_mode), st.st_mtime_ns if dir_times else 0)
    return out
