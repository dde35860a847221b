"""The closed set of event kinds and the format version that defines it.

A kind is written as its name. A reader that meets a name outside this set
refuses it and names the format version, instead of skipping it: a silently
skipped event would make a replay or a fold quietly wrong.
"""

from __future__ import annotations

from stenograph.recorder.errors import UnknownKind

FORMAT_VERSION = 2
"""The newest version this build reads. Bumped whenever a kind is added or a
frame/envelope layout changes."""

WRITTEN_VERSION = 1
"""The version new segments and ``.steno`` files are written in: nothing they hold
needs more, so older builds read them."""

HOLE_VERSION = 2
"""Version 2 adds the hole frame (archived events removed from a segment). Only a
segment that holds one is written as version 2 (``recorder/compact.py``)."""

HARNESS_KINDS = frozenset(
    {
        "TaskStarted",
        "ContextBuilt",
        "ModelReplied",
        "Authorized",
        "ApprovalRequested",
        "ApprovalResolved",
        "ToolIntent",
        "ToolResult",
        "Compacted",
        "Checkpoint",
        "Drift",
        "Settled",
        "Escalated",
        "LeaseAcquired",
    }
)

TAPE_KINDS = frozenset(
    {
        "RunStarted",  # argv, cwd, environment whitelist, versions
        "TapeChunk",  # a batch of one stream's raw records from the shim
        "ProcessStarted",  # a process joined the recorded tree
        "ProcessEnded",  # its exit status
        "Exchange",  # one HTTP / model / tool call and its result
        "RunEnded",  # exit status and hashes of stdout / stderr
        "Note",  # free-form annotation written by tools (e.g. the demo)
    }
)

KINDS = HARNESS_KINDS | TAPE_KINDS


def check_kind(kind: str, format_version: int = FORMAT_VERSION) -> str:
    """Return ``kind`` if it is known, else raise ``UnknownKind``."""
    if kind in KINDS:
        return kind
    if format_version > FORMAT_VERSION:
        raise UnknownKind(
            f"unknown event kind {kind!r}: written in format version {format_version}, "
            f"this build reads up to format version {FORMAT_VERSION}"
        )
    raise UnknownKind(
        f"unknown event kind {kind!r}: not one of the {len(KINDS)} kinds of format version "
        f"{format_version} (see docs/log-format.md)"
    )
