"""What a resumed run is told when one of its processes reaches, live, an effect the log
already knows: the one place that decides it, for the requests programs send on their
own connections (channel ``net``) and the commands they run (channel ``exec``).

A resume cuts the tape at an intent or after a whole answer (``resumes.is_cut``), and
earlier where a person's decision needs it, so a process often goes live *before* an
effect the crashed run made. Making it again would make it twice; refusing it would tell
the agent that a payment failed which did not (a model told so pays again). So:

* ``redo``: made live, as a new effect of its own (``<call>@<epoch>``) -- a person said it
  did not happen, or its idempotency key lets it be sent again;
* ``ask``: a held call; the policy and a person's approval decide it, as at record;
* ``answer``: not made; a stand-in on 127.0.0.1 (``runner/standin.py``) reads the request
  and sends ``answer``, the bytes the service sent the crashed run (the log holds them
  whole) or a person's ``settle --result`` as a ``200`` with that JSON;
* ``refuse``: not made, and no answer is known (settled done by a person with nothing
  to give): the program sees its connection reset, as when a service goes away;
* a command settled with ``--output`` is not run: its process prints the output and ends
  with the given status (``Output``).

Pure functions of the events; the stand-ins and files are the runner's.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.chunks import chunk_data
from stenograph.recorder.codec import Event
from stenograph.recorder.effects import TrajectoryState
from stenograph.recorder.tape import CHANNEL_IDS, iter_records

OP_NET_SEND, OP_NET_RECV = 2, 3
_SEND = struct.Struct("<IIiQII")  # conn | asked | result | digest | head | 0
_RECV = struct.Struct("<IIiiI")  # conn | asked | result | flags | alen
_REQUEST = re.compile(rb"^[A-Z]{1,16} \S+ HTTP/1\.")


@dataclass(frozen=True)
class NetAnswer:
    """What a process that reaches a known request (or connection) live is told."""

    action: str
    """``redo``, ``ask``, ``answer`` or ``refuse``."""
    answer: bytes = b""
    """For ``answer``: the bytes the stand-in sends back (``recorded``: read from the log
    when a process reaches it)."""
    recorded: str | None = None
    """For ``answer``: the call whose answer the log holds."""


@dataclass(frozen=True)
class Output:
    """A command a person settled as done with its output: not run at the resume."""

    call_id: str
    proc: str
    stdout: bytes
    status: int


def base_call(call_id: str) -> str:
    """The call id a shim computes for an effect: a resume's renamed redo
    (``0.1/net/0.1@2``) is the same call in the program."""
    return call_id.partition("@")[0]


def http_answer(result: Any) -> bytes:
    """A person's ``--result`` as the service's answer: ``200`` with that JSON."""
    body = json.dumps(result).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
            + body)


def recorded_answer(events: Sequence[Event], call_id: str) -> bytes:
    """The bytes the crashed run received for request ``<proc>/net/<conn>.<n>`` on its
    connection: every receive after the n-th request began, up to the next one (b"" if
    the tape holds none)."""
    proc, _, rest = base_call(call_id).partition("/net/")
    conn_s, _, n_s = rest.partition(".")
    if not (conn_s.isdigit() and n_s.isdigit()) or n_s == "0":
        return b""
    conn, want = int(conn_s), int(n_s)
    net = CHANNEL_IDS["net"]
    request = 0
    asking = False  # a request's bytes are going out: its answer has not begun
    out: list[bytes] = []
    for ev in events:
        if ev.kind != "TapeChunk" or not isinstance(ev.body, dict) or ev.body.get("proc") != proc:
            continue
        try:
            data = chunk_data(ev.body)
        except ValueError:
            continue
        for ch, op, payload in iter_records(data):
            if ch != net or len(payload) < 4 or struct.unpack_from("<I", payload)[0] != conn:
                continue
            if op == OP_NET_SEND and len(payload) >= _SEND.size:
                _, _, result, _, head, _ = _SEND.unpack_from(payload)
                first = payload[_SEND.size:_SEND.size + head]
                if result > 0 and not asking and _REQUEST.match(first):
                    request += 1
                    asking = True
            elif op == OP_NET_RECV and len(payload) >= _RECV.size:
                _, asked, result, _, alen = _RECV.unpack_from(payload)
                asking = False
                if request == want and result > 0:
                    start = _RECV.size + alen
                    out.append(payload[start:start + min(result, asked)])
        if request > want:
            break
    return b"".join(out)


def net_answers(events: Sequence[Event], state: TrajectoryState,
                approvals: Mapping[str, Any]) -> dict[str, NetAnswer]:
    """Every request and connection of the log that a program made on its own
    connection, by the call id its shim computes: what it is told if it gets there live.
    The latest incarnation decides (a redo that was answered is answered, not redone)."""
    latest = {}
    for eff in state.effects:
        if "/net/" in eff.call_id:
            latest[base_call(eff.call_id)] = eff
    given = {str(e.body.get("call_id")): e.body.get("result") for e in events
             if e.kind in ("Settled", "ToolResult") and "as" in e.body}
    out: dict[str, NetAnswer] = {}
    for call, eff in latest.items():
        if eff.decision in ("not-done", "reissue"):
            out[call] = NetAnswer("redo")
        elif eff.decision == "done" and given.get(eff.call_id) is not None:
            out[call] = NetAnswer("answer", http_answer(given[eff.call_id]))
        elif eff.answered and not call.endswith(".0"):
            out[call] = NetAnswer("answer", recorded=eff.call_id)
        else:  # done with no answer, an answered connection, or (never here) in doubt
            out[call] = NetAnswer("refuse")
    for call in approvals:
        if "/net/" in call:
            out[call] = NetAnswer("ask")
    return out


def outputs(events: Sequence[Event], state: TrajectoryState,
            blobs: Any = None) -> list[Output]:
    """The commands settled done with their output, each by the process that made the
    effect (the net or exec intent's ``proc``)."""
    from stenograph.recorder.blobs import BlobRef

    intents = {str(e.body.get("call_id")): e.body for e in events if e.kind == "ToolIntent"}
    settled = {str(e.body.get("call_id")): e.body for e in events
               if e.kind == "Settled" and e.body.get("output") is not None}
    out = []
    for eff in state.effects:
        body = settled.get(eff.call_id)
        if body is None or eff.call_id not in intents:
            continue
        raw = body["output"]
        if not isinstance(raw, bytes):
            raw = blobs.get(BlobRef.from_body(raw)) if blobs is not None else b""
        out.append(Output(eff.call_id, str(intents[eff.call_id].get("proc")), raw,
                          int(body.get("exit") or 0)))
    return out
