"""What a command checks before it touches anything.

A refused command leaves every store, workspace and file as it was, so every check
here only looks (``stat``, never ``open``): a named pipe given as input would block an
``open`` for ever, and a store would be created or locked by the first write. Each
failure is one ``BadInput`` line (exit 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stenograph.recorder.errors import BadInput
from stenograph.recorder.reader import is_store
from stenograph.recorder.store import check_traj

_KIND = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
         stat.S_IFBLK: "a device"}


def traj_id(traj: str) -> str:
    """A trajectory id the store will take (length, characters: no path in it)."""
    check_traj(traj)
    return traj


def input_file(path: str | os.PathLike[str], what: str = "a .steno file") -> Path:
    """An existing regular file (a FIFO, socket or device is refused at once)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise BadInput("no such file", str(p)) from None
    except OSError as exc:
        raise BadInput(f"cannot read it: {exc.strerror}", str(p)) from None
    kind = _KIND.get(stat.S_IFMT(st.st_mode))
    if kind is not None:
        raise BadInput(f"is {kind}, not {what}", str(p))
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"is a directory, not {what}", str(p))
    return p


def output_file(path: str | os.PathLike[str], *, inputs: tuple[Path, ...] = ()) -> Path:
    """A file to write: in an existing directory, not a directory, not one of the inputs,
    and not inside a store (writing there would replace the store's own files)."""
    p = Path(path)
    if p.is_dir():
        raise BadInput("output is a directory", str(p))
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise BadInput("output directory does not exist", str(parent))
    real = parent.resolve() / p.name
    for src in inputs:
        if src.exists() and real == src.resolve():
            raise BadInput("output is the input", str(p))
    for d in (real.parent, *real.parent.parents):
        if is_store(d):
            raise BadInput(f"output is inside the store {d}", str(p))
    return p
