"""Where the built LD_PRELOAD shim lives, and what version it is.

The shim is built by ``pip install .`` as the extension file of ``stenograph._shim``
but is never imported (it has no Python API): programs load it with LD_PRELOAD.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
from functools import lru_cache
from pathlib import Path

from stenograph.recorder.errors import BadInput

PROTOCOL = 7
"""Wire/tape protocol version; must match STENO_PROTOCOL in shim_c/steno_shim.h."""

READS = frozenset({2, 3, 4, 5, 6, 7})
"""The protocols whose tapes a build replay reads (``replay --build``: served where they
fit, the rest live): a protocol-2 tape is made one of this protocol when it is prepared
(``recorder.tape.prepare_tape``: its per-call ``getpid`` records are dropped); a
protocol-3 tape has no net channel, so its connections run live (and a sealed replay
refuses them); a protocol-4 tape is served with that protocol's reach (``TAPE/protocol``:
the shim does not follow pipes through ``dup`` and ``exec`` nor tape ``statx`` through
``syscall()`` for it); a protocol-5 tape's node processes ran without
``--single-threaded``, and run so."""

EXACT = frozenset({PROTOCOL})
"""The protocols whose tapes this shim replays bit for bit (``stenograph replay``, a
resume's or a fork's prefix): its own. An older tape is read (``READS``) but not
served as its shim served it: a protocol-2 pipeline of coreutils diverged on a signal, a
protocol-4 one on ``mktemp``'s name, and a thread pool recorded by protocols 3 to 6 ran to
its end with another output and no divergence at all (the hooks and the scheduler changed
between protocols too). So an exact replay of any other protocol stops before anything
runs (``runner/prepare.protocol``); a build replay still reads it."""

NORMALIZE: dict[str, str] = {"node": "--single-threaded", "nodejs": "--single-threaded"}
"""Programs run with one more flag under record and replay (argv[1]); mirrors
``NORMALIZE`` in shim_c/proc.c, which applies it to every exec in the tree (this one is
for the command stenograph itself starts). Since protocol 6."""


def normalized(argv: list[str], tape_protocol: int | None) -> list[str]:
    """``argv`` with its program's normalizing flag (``NORMALIZE``), unless a tape of an
    older protocol is replayed (its program ran without it)."""
    flag = NORMALIZE.get(Path(argv[0]).name) if argv else None
    if flag is None or (tape_protocol is not None and tape_protocol < 6) or (
            len(argv) > 1 and argv[1] == flag):
        return argv
    return [argv[0], flag, *argv[1:]]


def readable(recorded_shim: object) -> int | None:
    """The protocol of a recording's ``RunStarted.shim`` if this shim reads it (``READS``)."""
    head = str(recorded_shim or "?").partition("/")[0]
    return int(head) if head.isdigit() and int(head) in READS else None


@lru_cache(maxsize=1)
def shim_path() -> str:
    """Absolute path of the shim's shared object (``BadInput`` if it was not built)."""
    spec = importlib.util.find_spec("stenograph._shim")
    if spec is not None and spec.origin and Path(spec.origin).is_file():
        return str(Path(spec.origin).resolve())
    pkg = Path(__file__).resolve().parent.parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        cand = pkg / f"_shim{suffix}"
        if cand.is_file():
            return str(cand)
    raise BadInput("the C shim is not built; run `pip install .` (or -e .)", str(pkg))


@lru_cache(maxsize=1)
def shim_version() -> str:
    """``protocol/sha256-prefix`` of the built library: pins the exact shim in a log."""
    digest = hashlib.sha256(Path(shim_path()).read_bytes()).hexdigest()[:16]
    return f"{PROTOCOL}/{digest}"
