"""Errors, each carrying the CLI exit code documented for it (README, docs/architecture.md).

The CLI prints ``stenograph: error: <what> (<where>)`` and exits with
``exit_code``; a traceback is reserved for bugs, never for bad input.
"""

from __future__ import annotations

import errno

__all__ = [
    "WRITE_ERRNOS",
    "BadInput",
    "BadPayload",
    "CorruptLog",
    "FormatVersionError",
    "NeedsPerson",
    "NotAStore",
    "Paused",
    "ReplayDiverged",
    "StenographError",
    "Stopped",
    "StoreFenced",
    "StoreLocked",
    "StorePoisoned",
    "UnknownKind",
    "WriteFailed",
]


class StenographError(Exception):
    """Root of every error stenograph raises on purpose."""

    exit_code = 2

    def __init__(self, what: str, where: str | None = None) -> None:
        super().__init__(what if where is None else f"{what} ({where})")
        self.what = what
        self.where = where


class BadInput(StenographError):
    """Usage error or input that cannot be read as what it claims to be."""

    exit_code = 2


class NotAStore(BadInput):
    """A path given as a store is not one."""


class StoreLocked(BadInput):
    """Another process holds the store's writer lock."""


class StoreFenced(StenographError):
    """This writer lost the store: another worker took the trajectory over (its lease
    expired, e.g. the process was paused past it). Nothing more is written."""

    exit_code = 8


class FormatVersionError(BadInput):
    """The file was written by a newer (or unknown) format version."""


class UnknownKind(BadInput):
    """An event kind outside the closed set this build knows."""


class CorruptLog(StenographError):
    """A bad frame somewhere other than the torn tail of the last segment."""

    exit_code = 3

    def __init__(self, what: str, segment: str, offset: int) -> None:
        super().__init__(what, f"{segment} @ {offset}")
        self.segment = segment
        self.offset = offset


class BadPayload(StenographError, ValueError):
    """Frame payload bytes that are no value the writer makes.

    Raised by the codec, which knows no file or offset; the frame scanner turns
    it into ``CorruptLog`` (or a torn tail) at the frame's place. A ValueError
    too, so callers that treat undecodable bytes as ``ValueError`` keep working.
    """

    exit_code = 3


class StorePoisoned(StenographError):
    """An fdatasync failed; the store refuses further writes.

    After a failed fsync the kernel may have dropped the dirty pages, so a
    retry could report success for data that is gone. The only safe move is to
    stop writing and let the next open recover from what is on disk.
    """

    exit_code = 3


class ReplayDiverged(StenographError):
    """The replayed program asked for something the tape does not account for."""

    exit_code = 1


class NeedsPerson(StenographError):
    """An in-doubt action that only a person can settle."""

    exit_code = 4


class Paused(StenographError):
    """The run stopped at a call held for approval; it continues with ``resume``."""

    exit_code = 5


class Stopped(StenographError):
    """A policy or a budget stopped the run."""

    exit_code = 6


class WriteFailed(StenographError):
    """The system refused a write stenograph had to make (a full disk, an I/O error, a
    read-only file system): what was durable before it stays, and the message says
    where it is and what to do with it."""

    exit_code = 7


WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
"""An ``OSError`` with one of these is a write the system refused (exit 7), not bad input."""
