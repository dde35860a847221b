"""Where a build replay's code comes from: the code is the user's, the data is the
recording's.

A recording is made where the agent is deployed (``/srv/agent``) and judged in a
checkout somewhere else (``~/src/agent``, a CI clone, a bisect's clone at each
revision). The program still runs in the recorded working directory, sealed, where
every file is the recording's (a listing of it is the recorded listing); a **code map**
``RECORDED=HERE`` points the command at the build under test (``point``): each argument
naming a file under RECORDED (absolute, or relative to the recorded working directory)
names the same file under HERE when HERE has it, and Python's import path starts at HERE
(and ``HERE/src``), so the program, the modules it imports and the files it reads next
to its own code are the build's.

The rule when no map is given (``default_map``): a build replay run from another
directory than the recorded one maps the recorded working directory to the current
directory when the current directory holds a file the recorded command names (its
program). Otherwise the code is the one at the recorded paths (in the workspace, the
files matching ``CODE_GLOBS`` as they are now), and the report says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.recorder.snapshots import CODE_GLOBS, is_code

_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?$")
_PY_OPTS_WITH_ARG = "WX"
"""Short options of python that take a value (``-W error``, ``-X dev``)."""


@dataclass(frozen=True)
class CodeMap:
    """Under ``recorded`` (a directory of the recording), show the code of ``here``."""

    recorded: str
    here: str

    @classmethod
    def parse(cls, item: str) -> CodeMap:
        """``RECORDED=HERE`` (``--map``): both absolute after this; HERE must exist."""
        recorded, eq, here = item.partition("=")
        if not eq or not recorded or not here or "\0" in item:
            raise BadInput("--map wants RECORDED=HERE (a recorded directory, a directory "
                           "here)", item)
        if not os.path.isabs(recorded):
            raise BadInput("--map: the recorded directory must be an absolute path", item)
        if not os.path.isdir(here):
            raise BadInput("--map: no such directory here", here)
        return cls(os.path.normpath(recorded), os.path.realpath(here))

    def to_json(self) -> dict[str, str]:
        return {"recorded": self.recorded, "here": self.here}


def default_map(argv: Sequence[str], recorded_cwd: Any, cwd: str) -> CodeMap | None:
    """The recorded working directory -> ``cwd``, when ``cwd`` is another directory and
    holds a file the recorded command names there (its program)."""
    if not isinstance(recorded_cwd, str) or not os.path.isabs(recorded_cwd):
        return None
    rec = os.path.normpath(recorded_cwd)
    if os.path.realpath(rec) == os.path.realpath(cwd):
        return None
    for _i, _prefix, value in candidates(argv[1:], rec):
        rel = inside(value, rec)
        if rel not in (None, ".") and os.path.isfile(os.path.join(cwd, str(rel))):
            return CodeMap(rec, os.path.realpath(cwd))
    return None


def is_python(path: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(path)))


def python_mode(argv: Sequence[str]) -> tuple[int | None, str | None]:
    """For a python command line: (index of the script argument or None, ``-m``/``-c``
    or None). The interpreter's options before it are skipped, clusters (``-um mod``,
    ``-Wignore``) and options with a value (``-X dev``) included."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return (i + 1 if i + 1 < len(argv) else None), None
        if a == "-" or not a.startswith("-"):
            return (None if a == "-" else i), None
        if a.startswith("--"):
            i += 2 if a == "--check-hash-based-pycs" else 1
            continue
        for j, ch in enumerate(a[1:], 1):
            if ch in "mc":
                return None, "-" + ch
            if ch in _PY_OPTS_WITH_ARG:
                i += j == len(a) - 1  # the value is the next argument
                break
        i += 1
    return None, None


def inside(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` if it is inside it (or is it), else None."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    if path == root:
        return "."
    if path.startswith(root.rstrip("/") + "/"):
        return os.path.relpath(path, root)
    return None


def candidates(argv: Sequence[str], cwd: str | None) -> Iterator[tuple[int, str, str]]:
    """(index, prefix, path) of each argument that may name a file: ``X`` and ``--opt=X``;
    relative paths are taken from the recorded working directory."""
    for i, a in enumerate(argv):
        prefix, value = "", a
        if a.startswith("-"):
            name, eq, rest = a.partition("=")
            if not eq or not rest:
                continue
            prefix, value = name + eq, rest
        if not value or "\0" in value:
            continue
        if not os.path.isabs(value):
            if cwd is None:
                continue
            value = os.path.join(cwd, value)
        yield i, prefix, value


def _mapped(path: str, maps: Sequence[CodeMap]) -> tuple[CodeMap, str] | None:
    """The map ``path`` lies under (the innermost), and its path relative to it."""
    best: tuple[CodeMap, str] | None = None
    for m in maps:
        rel = inside(path, m.recorded)
        if rel is not None and (best is None or len(m.recorded) > len(best[0].recorded)):
            best = (m, rel)
    return best


def point(argv: Sequence[str], cwd: str | None, maps: Sequence[CodeMap],
          pythonpath: str | None, kinds: Mapping[str, str] | None = None,
          ) -> tuple[list[str], dict[str, str]]:
    """The command pointed at the build under test, and the environment it adds.

    Every argument naming a path under a map's recorded directory (absolute, or relative
    to the recorded working directory ``cwd``) that the directory here has -- a file, or
    a directory where python runs it (``python DIR``) -- names it there; ``kinds``
    (path relative to the map -> ``blob``/``tree``) may say so for a path the checkout
    lacks (a bisect's revision that deleted it). A data directory stays the recorded
    one. ``PYTHONPATH`` puts each directory here (and its ``src``) before everything
    installed, the recorded ``PYTHONPATH``'s entries under a map mapped the same way.
    With ``python -m`` or ``-c`` run under a map, python would put the working directory
    first, where the sealed replay shows the recorded code: ``PYTHONSAFEPATH`` drops it
    and its copy here takes its place."""
    argv = list(argv)
    script, mode = python_mode(argv) if argv and is_python(argv[0]) else (None, None)
    for i, prefix, value in candidates(argv, cwd):
        hit = _mapped(value, maps)
        if hit is None or hit[1] == ".":
            continue
        there = os.path.join(hit[0].here, hit[1])
        kind = (kinds or {}).get(hit[1]) or ("blob" if os.path.isfile(there) else
                                             "tree" if os.path.isdir(there) else None)
        if kind == "blob" or (kind == "tree" and i == script):
            argv[i] = prefix + there
    path: list[str] = []
    env: dict[str, str] = {}
    at = _mapped(cwd, maps) if cwd else None
    if mode is not None and at is not None:
        env["PYTHONSAFEPATH"] = "1"
        path.append(os.path.normpath(os.path.join(at[0].here, at[1])))
    for m in maps:
        path.append(m.here)
        if os.path.isdir(os.path.join(m.here, "src")):
            path.append(os.path.join(m.here, "src"))
    for entry in (pythonpath or "").split(os.pathsep):
        if not entry:
            continue
        hit = _mapped(entry, maps)
        path.append(os.path.normpath(os.path.join(hit[0].here, hit[1])) if hit else entry)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return argv, env


def code_paths(roots: Mapping[str, Mapping[str, Any]], rules: Mapping[str, Any],
               globs: Sequence[str] = CODE_GLOBS, skip: Sequence[str] = ()) -> list[str]:
    """The paths to show live in a build replay: under each recorded workspace root
    (``roots``: root -> recorded tree), every file matching ``globs`` as it is now, and
    every recorded one that matches, so a module the build deleted is gone. A directory
    the recording lacks is live as a whole (a new package). Nothing under ``skip`` (the
    recorded side of a code map: its code comes from elsewhere)."""
    out: set[str] = set()
    for root, tree in roots.items():
        rule = rules.get(root)
        for rel in tree:
            if is_code(rel, globs):
                out.add(os.path.join(root, rel))
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            reldir = os.path.relpath(dirpath, root)
            reldir = "" if reldir == "." else reldir
            keep = []
            for d in dirnames:
                rel = f"{reldir}/{d}" if reldir else d
                if rule is not None and rule.ignored(rel, True):
                    continue
                keep.append(d)
            dirnames[:] = keep
            for f in filenames:
                rel = f"{reldir}/{f}" if reldir else f
                if not is_code(rel, globs) or (rule is not None and rule.ignored(rel, False)):
                    continue
                out.add(os.path.join(root, _new_top(rel, tree)))
    return sorted(p for p in _outermost(out) if not _under_any(p, skip))


def _under_any(path: str, dirs: Iterable[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _new_top(rel: str, tree: Mapping[str, Any]) -> str:
    """``rel``, or its outermost ancestor directory the recording does not have."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        head = "/".join(parts[:i])
        if head not in tree:
            return head
    return rel


def _outermost(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in sorted(paths):
        if out and p.startswith(out[-1].rstrip("/") + "/"):
            continue
        out.append(p)
    return out
