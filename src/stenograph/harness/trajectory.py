"""The seed's trajectory, derived from a recording: turns, contexts, replies, calls.

An unmodified agent never tells stenograph what a turn is; its tape does. Each model
exchange (``Exchange`` on the ``model`` channel) is a turn: ``ContextBuilt`` (what the
request gave the model) and ``ModelReplied`` (what it chose). What the program did
between one reply and the next request belongs to that turn: HTTP calls and declared
tools (``Exchange`` on ``http``/``tool``), effects (``ToolIntent``, then their result),
approvals, checkpoints. The tool results that answer a turn's calls are read from the
*next* request (by tool-call id), where the model saw them.

``Deriver.feed`` turns log events into these derived events one at a time, with no
look-ahead, so the derived stream of a prefix is the prefix of the derived stream;
``step`` folds a derived event into the trajectory ``Record`` (tokens so far, tools
called, open intents, pending approvals) and ``fold`` is ``step`` over a stream. Pure
code: bodies are read through the ``Bodies`` callable the caller gives (a ``.steno``
file's embedded blobs, a store's blob directory), and a context is parsed only when
asked for, so the turn list of a long log costs the replies, not every request.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from stenograph.harness.formats import (
    API_CALL,
    Answer,
    Context,
    Reply,
    answers_in,
    api_of,
    context_of,
    decoded,
    reply_of,
    reply_of_value,
)
from stenograph.recorder.codec import Event

Bodies = Callable[[Any], bytes]
"""A recorded body (bytes, or a ``{"$blob": sha}`` reference) -> its bytes."""


def inline_bodies(value: Any) -> bytes:
    """``Bodies`` for events that hold every body inline (tests, small recordings)."""
    return value if isinstance(value, bytes) else b""


@dataclass(frozen=True)
class At:
    """Where a derived event comes from: the log event and the Python-tape position."""

    lsn: int
    seq: int
    proc: str | None = None
    pos: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"lsn": self.lsn, "seq": self.seq, "proc": self.proc, "pos": self.pos}


@dataclass(frozen=True)
class ContextBuilt:
    """The request of a turn; its ``Context`` is parsed on demand (``context``)."""

    turn: int
    at: At
    api: str
    url: str
    body: Any
    """The request body as recorded: bytes, or a blob reference."""

    def context(self, bodies: Bodies = inline_bodies) -> Context:
        return context_of(self.url, bodies(self.body))


@dataclass(frozen=True)
class ModelReplied:
    turn: int
    at: At
    reply: Reply


@dataclass(frozen=True)
class ToolIntent:
    turn: int
    at: At
    call_id: str
    target: str
    idempotency_key: str | None


@dataclass(frozen=True)
class ToolResult:
    """A call the program made finished: an HTTP exchange, a declared tool, or an
    effect's result (``call_id`` then names its intent)."""

    turn: int
    at: At
    call_id: str
    target: str
    ok: bool


@dataclass(frozen=True)
class ApprovalAsked:
    turn: int
    at: At
    call_id: str
    call: str


@dataclass(frozen=True)
class ApprovalDecided:
    turn: int
    at: At
    call_id: str
    decision: str


@dataclass(frozen=True)
class CheckpointTaken:
    turn: int
    at: At
    index: int
    where: str


@dataclass(frozen=True)
class RunEnded:
    turn: int
    at: At
    status: int | None


Derived = (ContextBuilt | ModelReplied | ToolIntent | ToolResult | ApprovalAsked
           | ApprovalDecided | CheckpointTaken | RunEnded)


def call_id(proc: Any, channel: Any, pos: Any) -> str:
    from stenograph.recorder.effects import call_id as cid

    return cid(str(proc), str(channel), int(pos) if isinstance(pos, int) else -1)


def target_of(body: dict[str, Any]) -> str:
    req = body.get("request") if isinstance(body.get("request"), dict) else {}
    url = str(req.get("url", "?"))
    if req.get("method") == "CALL":
        kind = str(body.get("channel")).rpartition("/")[2]
        if kind == "mcp":  # which tool of which server, with what
            args = req.get("body")
            brief = " ".join(args.decode("utf-8", "replace").split())[:120] if isinstance(
                args, bytes) else ""
            return f"mcp {url.partition(':')[2]} {brief}".rstrip()
        return f"tool {url.partition(':')[2]}" if kind == "tool" else url
    return f"{req.get('method', '?')} {url}"


def _ok(body: dict[str, Any]) -> bool:
    if body.get("error") is not None or body.get("failed"):
        return False
    resp = body.get("response")
    if isinstance(resp, dict):
        st = resp.get("status")
        return isinstance(st, int) and st < 400
    return True


class Deriver:
    """Log events in, derived events out, one at a time (no look-ahead)."""

    def __init__(self, bodies: Bodies = inline_bodies) -> None:
        self.bodies = bodies
        self.turn = 0
        self.checkpoints = 0
        self._intents: set[str] = set()

    def feed(self, ev: Event) -> list[Derived]:
        b = ev.body if isinstance(ev.body, dict) else {}
        at = At(ev.lsn, ev.seq, str(b["proc"]) if "proc" in b else None,
                b.get("pos") if isinstance(b.get("pos"), int) else None)
        if ev.kind == "Exchange":
            ch = b.get("channel")
            if ch == "model":
                self.turn += 1
                req = b.get("request") if isinstance(b.get("request"), dict) else {}
                url = str(req.get("url", ""))
                api = api_of(url, None)
                return [ContextBuilt(self.turn, at, api, url, req.get("body")),
                        ModelReplied(self.turn, at, reply_from(b, api, self.bodies))]
            if ch in ("http", "tool", "mcp"):
                cid = call_id(b.get("proc"), ch, b.get("pos"))
                return [ToolResult(self.turn, at, cid, target_of(b), _ok(b))]
            return []
        if ev.kind == "ToolIntent":
            cid = str(b.get("call_id"))
            if cid in self._intents:
                return []
            self._intents.add(cid)
            return [ToolIntent(self.turn, at, cid, str(b.get("target", "?")),
                               b.get("idempotency_key"))]
        if ev.kind in ("Settled", "ToolResult"):  # a person's word on an effect in doubt
            return [ToolResult(self.turn, at, str(b.get("call_id")),
                               str(b.get("target", "settled")),
                               b.get("as", "done") == "done")]
        if ev.kind == "ApprovalRequested":
            return [ApprovalAsked(self.turn, at, str(b.get("call_id")), str(b.get("call")))]
        if ev.kind == "ApprovalResolved":
            return [ApprovalDecided(self.turn, at, str(b.get("call_id")),
                                    str(b.get("decision")))]
        if ev.kind == "Checkpoint" and "snapshot" in b:
            self.checkpoints += 1
            return [CheckpointTaken(self.turn, at, self.checkpoints - 1, str(b.get("at")))]
        if ev.kind == "RunEnded":
            st = b.get("status")
            return [RunEnded(self.turn, at, st if isinstance(st, int) else None)]
        return []


def derive(events: Iterable[Event], bodies: Bodies = inline_bodies) -> Iterator[Derived]:
    d = Deriver(bodies)
    for ev in events:
        yield from d.feed(ev)


def reply_from(body: dict[str, Any], api: str, bodies: Bodies) -> Reply:
    """The reply of a model exchange; a call that failed (no response, an error status,
    an exception) is a reply with ``error`` set: the turn the model never answered."""
    err = body.get("error")
    failed = _failure(err) if err is not None else None
    if api == API_CALL or ("result" in body and "response" not in body):
        r = reply_of_value(body.get("result")) if failed is None else Reply()
        return replace(r, error=failed) if failed else r
    resp = body.get("response") if isinstance(body.get("response"), dict) else {}
    status = resp.get("status")
    if failed is None and isinstance(status, int) and status >= 400:
        failed = f"HTTP {status}"
    if not resp:
        return Reply(error=failed or "no response")
    try:
        data = decoded(bodies(resp.get("body")), resp.get("headers"))
    except Exception:  # a body the blob store lacks: the turn is shown without it
        data = b""
    r = reply_of(api, data)
    return replace(r, error=failed) if failed else r


def _failure(err: Any) -> str:
    if isinstance(err, dict):
        kind = err.get("type") or "error"
        msg = str(err.get("message") or "")
        return f"{kind}: {msg}"[:200] if msg else str(kind)
    return str(err)[:200]


@dataclass(frozen=True)
class Record:
    """The trajectory as of one point: what a fold of its derived events says."""

    turn: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tools_called: tuple[tuple[str, int], ...] = ()
    """(tool name, times the model called it), by name."""
    calls_made: int = 0
    open_intents: tuple[str, ...] = ()
    """Effects whose intent is durable and whose result is not (yet)."""
    settled: int = 0
    approvals_pending: tuple[str, ...] = ()
    checkpoints: int = 0
    ended: bool = False
    exit_status: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "tools_called": dict(self.tools_called),
                "calls_made": self.calls_made, "open_intents": list(self.open_intents),
                "settled": self.settled, "approvals_pending": list(self.approvals_pending),
                "checkpoints": self.checkpoints, "ended": self.ended,
                "exit_status": self.exit_status}


def _bump(counts: tuple[tuple[str, int], ...], names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    d = dict(counts)
    for n in names:
        d[n] = d.get(n, 0) + 1
    return tuple(sorted(d.items()))


def step(rec: Record, ev: Derived) -> Record:
    """The record after one more derived event."""
    if isinstance(ev, ContextBuilt):
        return replace(rec, turn=ev.turn)
    if isinstance(ev, ModelReplied):
        r = ev.reply
        return replace(rec, input_tokens=rec.input_tokens + r.input_tokens,
                       output_tokens=rec.output_tokens + r.output_tokens,
                       tools_called=_bump(rec.tools_called, (c.name for c in r.tool_calls)))
    if isinstance(ev, ToolIntent):
        return replace(rec, open_intents=(*rec.open_intents, ev.call_id))
    if isinstance(ev, ToolResult):
        if ev.call_id in rec.open_intents:
            return replace(rec, open_intents=tuple(c for c in rec.open_intents
                                                   if c != ev.call_id),
                           settled=rec.settled + 1, calls_made=rec.calls_made + 1)
        return replace(rec, calls_made=rec.calls_made + 1)
    if isinstance(ev, ApprovalAsked):
        if ev.call_id in rec.approvals_pending:
            return rec
        return replace(rec, approvals_pending=(*rec.approvals_pending, ev.call_id))
    if isinstance(ev, ApprovalDecided):
        return replace(rec, approvals_pending=tuple(
            c for c in rec.approvals_pending if c != ev.call_id))
    if isinstance(ev, CheckpointTaken):
        return replace(rec, checkpoints=rec.checkpoints + 1)
    if isinstance(ev, RunEnded):
        return replace(rec, ended=True, exit_status=ev.status)
    return rec


def fold(derived: Iterable[Derived], start: Record | None = None) -> Record:
    return functools.reduce(step, derived, start or Record())


@dataclass(frozen=True)
class Call:
    """One call the program made in a turn (after the reply, before the next request)."""

    call_id: str
    target: str
    effect: bool
    state: str
    """``done`` / ``failed`` (a call with no intent), ``settled`` / ``in-doubt`` (an effect)."""
    at: At
    did: str = ""
    """An effect in doubt: what it did, for the person who settles it (``didwhat``)."""

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "target": self.target, "effect": self.effect,
                "state": self.state, "at": self.at.to_json(),
                **({"did": self.did} if self.did else {})}


@dataclass
class Turn:
    """One model exchange and what surrounds it; the context is parsed when asked for."""

    index: int
    event: Event
    reply: Reply
    record: Record
    """The fold at the end of this turn (its reply and the calls it led to)."""
    calls: list[Call] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[CheckpointTaken] = field(default_factory=list)
    bodies: Bodies = inline_bodies
    next_event: Event | None = None

    @property
    def at(self) -> At:
        b = self.event.body
        return At(self.event.lsn, self.event.seq, str(b.get("proc")), b.get("pos"))

    @property
    def request(self) -> dict[str, Any]:
        req = self.event.body.get("request")
        return req if isinstance(req, dict) else {}

    def request_body(self) -> bytes:
        try:
            return self.bodies(self.request.get("body"))
        except Exception:
            return b""

    @functools.cached_property
    def context(self) -> Context:
        return context_of(str(self.request.get("url", "")), self.request_body())

    @functools.cached_property
    def results(self) -> list[Answer]:
        """The results of this turn's tool calls, as the next request gave them back."""
        if self.next_event is None or not self.reply.tool_calls:
            return []
        req = self.next_event.body.get("request") or {}
        try:
            nxt = context_of(str(req.get("url", "")), self.bodies(req.get("body")))
        except Exception:
            return []
        ids = {c.id for c in self.reply.tool_calls}
        return [a for a in answers_in(nxt) if a.call_id in ids]


@dataclass
class Trajectory:
    """Every turn of one recording, with the fold after each."""

    traj: str
    header: dict[str, Any]
    events: list[Event]
    turns: list[Turn]
    before: list[Call]
    """Calls made before the first model request."""
    record: Record
    started: dict[str, Any]
    bodies: Bodies = inline_bodies

    def turn(self, n: int) -> Turn:
        if not 1 <= n <= len(self.turns):
            from stenograph.recorder.errors import BadInput

            raise BadInput(f"--turn {n}: the recording has {len(self.turns)} turn(s) "
                           f"(1..{len(self.turns)})")
        return self.turns[n - 1]


def build(traj: str, header: dict[str, Any], events: list[Event],
          bodies: Bodies = inline_bodies) -> Trajectory:
    """The trajectory of a recording's events (its resumes' edges already dropped)."""
    d = Deriver(bodies)
    rec = Record()
    turns: list[Turn] = []
    before: list[Call] = []
    calls_by_id: dict[str, Call] = {}
    started: dict[str, Any] = {}
    for ev in events:
        if ev.kind == "RunStarted" and not started and isinstance(ev.body, dict):
            started = ev.body
        out = d.feed(ev)
        for x in out:
            rec = step(rec, x)
            where = turns[-1].calls if turns else before
            if isinstance(x, ModelReplied):
                if turns:
                    turns[-1].next_event = ev
                turns.append(Turn(x.turn, ev, x.reply, rec, bodies=bodies))
            elif isinstance(x, ToolIntent):
                c = Call(x.call_id, x.target, True, "in-doubt", x.at)
                calls_by_id[x.call_id] = c
                where.append(c)
            elif isinstance(x, ToolResult):
                old = calls_by_id.get(x.call_id)
                if old is not None and old.state == "in-doubt":
                    i = next(i for i, c in enumerate(_owner(turns, before, old)) if c is old)
                    new = replace(old, state="settled") if not x.target.startswith(
                        "mcp ") else replace(old, state="settled" if x.ok else "failed",
                                             target=x.target, at=x.at)  # with its answer
                    _owner(turns, before, old)[i] = new
                    calls_by_id[x.call_id] = new
                elif old is None:
                    c = Call(x.call_id, x.target, False, "done" if x.ok else "failed", x.at)
                    calls_by_id[x.call_id] = c
                    where.append(c)
            elif isinstance(x, (ApprovalAsked, ApprovalDecided)) and turns:
                turns[-1].approvals.append(
                    {"call_id": x.call_id, **({"call": x.call} if isinstance(x, ApprovalAsked)
                                              else {"decision": x.decision})})
            elif isinstance(x, CheckpointTaken) and turns:
                turns[-1].checkpoints.append(x)
            if turns and not isinstance(x, (ContextBuilt, ModelReplied)):
                turns[-1].record = rec
    _say_what_doubts_did(traj, events, turns, before)
    return Trajectory(traj, header, events, turns, before, rec, started, bodies)


def _say_what_doubts_did(traj: str, events: list[Event], turns: list[Turn],
                         before: list[Call]) -> None:
    """Each call still in doubt gets what it did (``recorder/didwhat.py``)."""
    if not any(c.state == "in-doubt" for t in turns for c in t.calls) and not any(
            c.state == "in-doubt" for c in before):
        return
    from stenograph.recorder.didwhat import described
    from stenograph.recorder.effects import fold

    did = {e.call_id: described(e.did) for e in fold(traj, events).effects if e.did}
    for calls in [before, *(t.calls for t in turns)]:
        for i, c in enumerate(calls):
            if c.state == "in-doubt" and c.call_id in did:
                calls[i] = replace(c, did=did[c.call_id])


def _owner(turns: list[Turn], before: list[Call], call: Call) -> list[Call]:
    for t in reversed(turns):
        if any(c is call for c in t.calls):
            return t.calls
    return before


def short(value: Any, width: int = 60) -> str:
    """A value on one line of at most ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                          separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def action_line(t: Turn, width: int = 60) -> str:
    """A turn's chosen action in a few words (``show``'s and the page's turn lines): its
    tool calls, or its answer; a call that failed, its error."""
    if t.reply.error is not None:
        return "failed: " + short(t.reply.error, width - 8)
    if t.reply.tool_calls:
        parts = []
        for c in t.reply.tool_calls:
            args = c.arguments
            if isinstance(args, dict):
                args = ", ".join(f"{k}={short(v, 24)}" for k, v in args.items())
            shown = short(args, 40) if not isinstance(args, str) or args else ""
            shown = short(args, 40) if not isinstance(args, str) or args else ""
            parts.append(f"{c.name}({shown})")
        return short("; ".join(parts), width)
    return "answer: " + short(t.reply.text or "", width - 8)
