"""What a counterfactual fork starts from: the recorded prefix, the one thing changed,
and the pointer to its parent.

A fork at turn N replays its parent up to the moment the program sent its N-th model
request and goes live from there (``runner/fork.py`` runs it, with the resume machinery).
The prefix is every event before the turn's ``ContextBuilt`` marker (``cut_before``):
the recorder drained every ring of the tree just before appending it, so the tape in
the prefix is consistent up to the request (``recorder/resumes.py`` says why). With
``--reply`` the turn's reply is replaced: the request stays the recorded one (the prefix
replays exactly), the response is the new reply in the recorded API's form, streamed
when the recording was (``reply_entry``). Pure functions; nothing here runs a program.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from stenograph.harness.formats import api_of, decoded, loads, sse_events
from stenograph.harness.trajectory import Bodies, Trajectory
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput

DROP_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding"})


@dataclass(frozen=True)
class ForkPlan:
    turn: int
    prefix: list[Event]
    """The parent's events before turn ``turn``'s model exchange."""
    turn_event: Event
    parent: dict[str, Any]
    """``{file, traj, turn, lsn, change}``: written in the fork's header and RunStarted."""


def plan(tr: Trajectory, file: str, turn: int, change: str) -> ForkPlan:
    t = tr.turn(turn)
    prefix = [e for e in tr.events if e.seq < cut_before(tr.events, t.event)]
    if not any(e.kind == "RunStarted" for e in prefix):
        raise BadInput("the recording has no RunStarted before that turn: nothing to fork",
                       file)
    return ForkPlan(turn, prefix, t.event, {
        "file": file, "traj": tr.traj, "turn": turn, "lsn": t.event.lsn, "change": change})


def cut_before(events: list[Event], turn_event: Event) -> int:
    """The seq the prefix of a fork at this turn ends before: the turn's ``ContextBuilt``
    marker (appended after a drain of every ring when the request was about to leave,
    so the tape before it is the tree's state at that instant). A recording made before
    the markers existed is cut just before the turn's ``Exchange``: the tape there is
    the state when the reply came back, which is the same for a program that did
    nothing else during the call, and off by what other threads did meanwhile for one
    that did (its fork may not replay)."""
    b = turn_event.body
    for e in events:
        if e.seq >= turn_event.seq:
            break
        if e.kind == "ContextBuilt" and e.body.get("proc") == b.get("proc") and \
                e.body.get("pos") == b.get("pos") and e.body.get("channel") == "model":
            return e.seq
    return turn_event.seq


def load_reply(text: str, where: str) -> Any:
    """A ``--reply`` file: a turn ``{"text", "tool_calls": [{"name", "arguments"}]}``
    (or a bare string), or a raw reply body of the recorded API."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text.rstrip("\n")
    if not isinstance(doc, (dict, str)):
        raise BadInput("--reply: a JSON object (a turn, or a reply body) or a text", where)
    return doc


def _raw_reply(doc: Any) -> bool:
    return isinstance(doc, dict) and any(k in doc for k in ("choices", "output", "content"))


def reply_entry(turn_event: Event, reply: Any, bodies: Bodies, where: str) -> dict[str, Any]:
    """The Python-tape entry of the replaced turn: the recorded request, the new reply."""
    from stenograph.testing import model_server as ms

    body = turn_event.body
    base = {k: body[k] for k in ("proc", "channel", "pos", "fingerprint", "request", "imports")
            if k in body}
    base["replaced_by_fork"] = True
    if "response" not in body:  # stenograph.model: the result is the reply
        return {**base, "result": reply, "error": None}
    req = body.get("request") or {}
    req_doc = loads(bodies(req.get("body")))
    if not isinstance(req_doc, dict):
        raise BadInput("the recorded request of that turn is not JSON: give --reply as "
                       "the raw reply body", where)
    resp = body.get("response") or {}
    recorded = decoded(bodies(resp.get("body")), resp.get("headers"))
    streamed = sse_events(recorded) is not None
    api = api_of(str(req.get("url", "")), req_doc)
    if _raw_reply(reply):
        if streamed:
            raise BadInput("the recorded reply was streamed: give --reply as a turn "
                           '({"text": ..., "tool_calls": [...]}), which is sent as a stream',
                           where)
        data = json.dumps(reply).encode()
        chunks = [len(data)]
    else:
        try:
            turn = ms.Turn.parse(reply, "--reply")
        except Exception as exc:
            raise BadInput(f"--reply: {getattr(exc, 'what', exc)}", where) from None
        digest = hashlib.sha256(json.dumps([reply, body.get("fingerprint")],
                                           sort_keys=True).encode()).hexdigest()
        ident = ms._Ident(digest, ms.BASE_CREATED + int(digest[:8], 16) % 31_536_000, False)
        fns = {"anthropic.messages": (ms.anthropic_body, ms.anthropic_stream),
               "openai.responses": (ms.responses_body, ms.responses_stream)}
        whole, stream = fns.get(api, (ms.openai_body, ms.openai_stream))
        if streamed:
            pieces = list(stream(req_doc, turn, ident))
            data, chunks = b"".join(pieces), [len(p) for p in pieces]
        else:
            data = json.dumps(whole(req_doc, turn, ident)).encode()
            chunks = [len(data)]
    headers = [list(h) for h in resp.get("headers") or []
               if str(h[0]).lower() not in DROP_HEADERS]
    if not streamed:
        headers.append(["content-length", str(len(data))])
    entry: dict[str, Any] = {**base, "response": {
        "status": 200, "headers": headers, "body": data, "chunks": chunks, "complete": True,
        **({"reason": resp["reason"]} if "reason" in resp else {})}, "error": None}
    # no "suspend": the recorded call's wake-up points belong to the parent's loop after
    # this turn, which the fork does not replay; the new reply is handed over at once
    return entry
