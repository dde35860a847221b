"""How the code inside a recorded process ends it on purpose: one exit code per outcome,
the ones ``recorder/errors.py`` documents for the CLI (and ``shim_c/steno_shim.h`` for
the shim's own divergence exit, ``tests/test_shim_constants.py`` checks they agree).

A stop that needs a person prints nothing here when the recorder was told: the CLI
prints the one line (``runner/lines.py``)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

DIVERGED_EXIT = 86
"""A replayed process that asked for what its tape does not hold (``DIVERGENCE_EXIT``)."""
NEEDS_PERSON_EXIT = 4
PAUSED_EXIT = 5
STOPPED_EXIT = 6


def flush_stdout() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()


def say(line: str) -> None:
    """One line on stderr, for when no CLI can say it (the recorder could not be told)."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"stenograph: {line}\n")
        sys.stderr.flush()


def diverged(message: str) -> NoReturn:
    """A replay that cannot go on: the report, then exit 86."""
    flush_stdout()
    say(f"replay diverged: {message}")
    os._exit(DIVERGED_EXIT)


def leave(code: int) -> NoReturn:
    """End the process now with ``code`` (what the program printed is flushed first)."""
    flush_stdout()
    os._exit(code)
