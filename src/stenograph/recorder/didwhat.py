"""What an effect did, for the person who must settle it.

An effect left in doubt is settled by someone who asks the service, the database, the
ledger: "did this one happen?". They can only ask about something they can recognise:
which process made it, the request's method, URL and the start of its body, the command
line, the first bytes on a raw connection, and which turn of the agent and which of the
model's tool calls it belongs to. This is computed from the intent and the log before
it (``effects.fold``), for ``status`` (text and ``--json``), the exit-4 line and ``view``.
Redaction happened before the log: nothing here is a secret the log did not hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stenograph.recorder.proposals import ToolCall

BODY_SHOWN = 160
"""Characters of a request's body (or a connection's first bytes) shown."""


def owner(proc: str, commands: Mapping[str, str]) -> str | None:
    """The command line of ``proc``, or of its nearest ancestor that exec'd one (a
    forked child runs its parent's program)."""
    p = proc
    while p:
        if p in commands:
            return commands[p]
        p = p.rpartition(".")[0]
    return None


def _scalars(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [str(value)]


def tool_call_of(text: str, proposals: Sequence[ToolCall]) -> ToolCall | None:
    """The one tool call of the reply whose every argument value appears in ``text`` (the
    effect's target, body and command line); None when none or several do."""
    found = []
    for tc in proposals:
        try:
            values = _scalars(json.loads(tc.arguments)) if tc.arguments else []
        except ValueError:
            continue
        if values and all(v in text for v in values):
            found.append(tc)
    return found[0] if len(found) == 1 else None


def what_it_did(intent: Mapping[str, Any], turn: int, proposals: Sequence[ToolCall],
                commands: Mapping[str, str]) -> dict[str, Any]:
    """The ``did`` document of an effect from its ``ToolIntent`` body."""
    target = str(intent.get("target") or "")
    channel = str(intent.get("channel") or "")
    args = intent.get("arguments", intent.get("body"))
    if isinstance(args, (bytes, bytearray)):
        args = bytes(args).decode("utf-8", "replace")
    shown = args if isinstance(args, str) else (
        json.dumps(args, sort_keys=True) if isinstance(args, (dict, list)) else "")
    did: dict[str, Any] = {}
    proc = intent.get("proc")
    if isinstance(proc, str):
        did["process"] = proc
        command = intent.get("by") or owner(proc, commands)
        if command:
            did["command"] = str(command)
    kind, _, rest = target.partition(" ")
    if channel == "exec":
        did["runs"] = rest
    elif kind == "connect":
        did["connects"] = rest
        if shown:
            did["first_bytes"] = shown[:BODY_SHOWN]
    elif kind in ("tool", "mcp"):
        did["calls"] = rest
        if shown:
            did["arguments"] = shown[:BODY_SHOWN]
    elif kind.isupper():
        did["request"] = {"method": kind, "url": rest,
                          **({"body": shown[:BODY_SHOWN]} if shown else {})}
    if turn:
        did["turn"] = turn
        name = rest if kind == "tool" else None
        tc = next((p for p in proposals if p.name == name), None) if name else tool_call_of(
            " ".join([target, shown, str(did.get("command") or "")]), proposals)
        if tc is not None:
            did["tool_call"] = {"id": tc.id, "name": tc.name, "arguments": tc.arguments}
    return did


def described(did: Mapping[str, Any]) -> str:
    """The ``did`` document as a line for a person: ``POST http://.../pay {"amount": 7}
    (by curl -s ...; turn 3, tool call pay {"to": "acct-B"})``."""
    req = did.get("request")
    if isinstance(req, dict):
        head = f"{req.get('method')} {req.get('url')}" + (
            f" {req['body']}" if req.get("body") else "")
    elif did.get("connects"):
        head = f"connect {did['connects']}" + (
            f" sending {did['first_bytes']!r}" if did.get("first_bytes") else "")
    elif did.get("runs"):
        head = f"runs {did['runs']}"
    else:
        head = f"{did.get('calls', '?')}" + (f" {did['arguments']}" if did.get("arguments")
                                             else "")
    where = []
    if did.get("command") and not did.get("runs"):
        cmd = str(did["command"])
        where.append("by " + (cmd if len(cmd) <= 100 else cmd[:97] + "..."))
    if did.get("turn"):
        tc = did.get("tool_call")
        where.append(f"turn {did['turn']}" + (
            f", tool call {tc['name']} {tc['arguments']}" if isinstance(tc, dict) else ""))
    return head + (f" ({'; '.join(where)})" if where else "")
