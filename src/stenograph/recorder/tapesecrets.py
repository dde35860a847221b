"""Secrets in what the shim tells the recorder: a child's command line, a program's own
request on a taped connection, the first bytes of each send.

The hooks redact the requests they see before anything is written
(``interpose/redact.py``); a command line (``MSG_EXEC``: ``ProcessStarted``, an exec
effect's ``ToolIntent``, the ``by`` of the intents its process makes) and a request the
shim tapes on its own (``MSG_INTENT``: its target ``METHOD http://host/path`` and the
first bytes of its body) reach the recorder as the program wrote them. So the recorder
redacts them the same way, with the same rules, before it appends them: a ``Redactor``
that the parent side makes from the run's environment, argv, key shapes and secret
files (``runner/redaction.py``; this package imports nothing above it).

A send on a taped connection is recorded as its digest and its first bytes
(``OP_NET_SEND``: they show what was sent when a replay sends something else); those
bytes are masked in place (``masked_sends``), as many ``*`` as the secret had, so the
record keeps its layout. The digest is the real bytes', so a replay still matches.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

NET, OP_SEND = 10, 2
_SEND = struct.Struct("<IIiQII")
"""``OP_NET_SEND``'s payload before its head: conn, asked, result, digest, head, 0."""
_SEND_MARK = bytes([NET, OP_SEND])
_HEADER = struct.Struct("<BBHI")  # tape.RECORD: channel, op, site, payload length


class Redactor(Protocol):
    """What the recorder asks of a run's redaction rules."""

    def argv(self, argv: list[str]) -> list[str]:
        """A command line with its secrets (by flag name, by value, by shape) redacted."""
        ...

    def text(self, text: str) -> str:
        """A request's target or first bytes with their secrets redacted."""
        ...

    def mask(self, data: bytes) -> bytes:
        """``data`` with its secrets overwritten, its length kept."""
        ...


def masked_sends(data: bytes, mask: Callable[[bytes], bytes]) -> bytes:
    """A drained chunk of records with the head of every ``OP_NET_SEND`` passed through
    ``mask``; ``data`` itself when none changed (a chunk without a send costs one search
    for the two bytes such a record starts with)."""
    if _SEND_MARK not in data:
        return data
    out: bytearray | None = None
    off, end = 0, len(data)
    while off + _HEADER.size <= end:
        ch, op, _site, n = _HEADER.unpack_from(data, off)
        start = off + _HEADER.size
        if ch == NET and op == OP_SEND and n >= _SEND.size:
            head = min(_SEND.unpack_from(data, start)[4], n - _SEND.size)
            at = start + _SEND.size
            if head > 0:
                masked = mask(bytes(data[at:at + head]))
                if len(masked) == head and masked != data[at:at + head]:
                    if out is None:
                        out = bytearray(data)
                    out[at:at + head] = masked
        off = start + n
    return bytes(out) if out is not None else data
