"""Effects in a trajectory, and the state of the trajectory, from the log alone.

An effect is a call that changes the world: an HTTP request that is neither a model call
nor read-only (``interpose/effects.py`` decides), a ``@stenograph.tool(effect=True)``, an
MCP ``tools/call`` of a tool not annotated read-only (``interpose/mcp_client.py``), or
an HTTP request on a taped connection (a tool's ``curl``, a ``urllib`` call: channel
``net``, ``shim_c/neteffect.c``) whose method is not GET, HEAD, OPTIONS or TRACE.
Before it is dispatched the recorder makes a ``ToolIntent`` durable (call id, target,
body, idempotency key, fencing epoch), with everything the tree taped before it; the
call's ``Exchange`` entry, when it comes back, is its result. So a reader of the log
knows, for every effect, one of:

* ``settled``: intent and result are both durable;
* ``in-doubt``: the intent is durable and the result is not -- the effect may have
  happened or not, and only the service (an idempotency key, a probe) or a person can
  say which.

``Settled`` events (``stenograph settle``) close an in-doubt effect by a decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stenograph.recorder.codec import Event
from stenograph.recorder.didwhat import what_it_did
from stenograph.recorder.proposals import ToolCall, proposed_calls


def call_id(proc: str, channel: str, pos: int) -> str:
    """The id of a call: where it is on its process's Python tape. ``channel`` is its
    stream: the channel, prefixed by the call whose body made it (``tool/0/http``)."""
    return f"{proc}/{channel}/{pos}"


def base_channel(stream: str) -> str:
    """The kind of call a stream holds: ``tool/0/http`` -> ``http``."""
    return stream.rpartition("/")[2]


@dataclass
class Effect:
    call_id: str
    target: str
    idempotency_key: str | None
    epoch: int
    state: str = "in-doubt"
    intent_lsn: int = 0
    result_lsn: int | None = None
    decision: str | None = None
    by: str | None = None
    """The command whose process made it (a program's own connection or request)."""
    fingerprint: str | None = None
    answered: bool = False
    """The log holds the answer it got (its ``ToolResult`` from the recorder)."""
    given: str | None = None
    """What a person's ``done`` handed the program: ``result`` (an answer), ``output``
    (a command's stdout and status), or None (nothing: the call fails as a lost
    connection does, or a tool gets a note)."""
    did: dict[str, Any] = field(default_factory=dict)
    """What it did, for the person who must settle it (``recorder/didwhat.py``)."""

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "target": self.target, "state": self.state,
                "idempotency_key": self.idempotency_key, "epoch": self.epoch,
                **({"decision": self.decision} if self.decision else {}),
                **({"answer": self.given or "none"} if self.decision == "done" else {}),
                **({"by": self.by} if self.by else {}),
                **({"did": self.did} if self.did else {})}

    @property
    def mark(self) -> str:
        """What a person's ``done`` gave the program: ``done, no answer`` for a request or
        command settled with nothing (its call fails as a lost connection does, a
        command ends with status 0 and no output), ``done, answer given``, ``done,
        output given``; "" otherwise."""
        if self.decision != "done":
            return ""
        if self.given is None:
            return "done, no answer" if self.call_id.split("/")[1:2] in (["net"], ["exec"]) \
                else ""
        return f"done, {'answer' if self.given == 'result' else 'output'} given"


@dataclass
class ApprovalState:
    call_id: str
    call: str
    state: str = "pending"  # pending, approved, denied (as decided), then used
    by: str | None = None
    expires_at: float | None = None
    used: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "call": self.call, "state": self.state,
                "by": self.by, "expires_at": self.expires_at, "used": self.used}


@dataclass
class TrajectoryState:
    traj: str
    state: str = "running"
    turns: int = 0
    epoch: int = 0
    holder: int | None = None
    exit_status: int | None = None
    effects: list[Effect] = field(default_factory=list)
    approvals: list[ApprovalState] = field(default_factory=list)
    events: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"traj": self.traj, "state": self.state, "turns": self.turns,
                "labels": self.labels,
                "epoch": self.epoch, "lease_holder": self.holder,
                "exit_status": self.exit_status, "events": self.events,
                "effects": [e.to_json() for e in self.effects],
                "approvals": [a.to_json() for a in self.approvals]}


def fold(traj: str, events: Iterable[Event], *, writer_alive: bool = False) -> TrajectoryState:
    """The state of one trajectory from its events (in log order)."""
    st = TrajectoryState(traj)
    by_id: dict[str, Effect] = {}
    at_pos: dict[str, Effect] = {}  # the latest intent at each place (a resume's may differ)
    asked: dict[str, ApprovalState] = {}
    ended = stopped = False
    proposals: list[ToolCall] = []  # the last model reply's tool calls
    commands: dict[str, str] = {}  # proc -> the command line it runs (what an effect did)
    handled: set[str] = set()  # calls made since that reply (by call id)
    for ev in events:
        st.events += 1
        body = ev.body if isinstance(ev.body, dict) else {}
        if ev.seq == 0 and ev.kind == "RunStarted" and isinstance(body.get("labels"), dict):
            st.labels = {str(k): str(v) for k, v in body["labels"].items()}
        if ev.kind in ("ToolIntent", "Exchange") and body.get("channel") in (
                "http", "tool", "net", "exec", "mcp"):
            pos = body.get("pos")
            handled.add(str(body.get("call_id") if ev.kind == "ToolIntent" else call_id(
                str(body.get("proc")), str(body.get("channel")),
                pos if isinstance(pos, int) else -1)))
        if ev.kind == "ToolIntent":
            cid = str(body.get("call_id"))
            old = at_pos.get(cid)
            epoch = int(body.get("epoch", 0))
            if old is not None and old.epoch != epoch and old.fingerprint != body.get(
                    "fingerprint"):  # a resume's call in a place an earlier intent held
                cid = f"{cid}@{epoch}"
            eff = Effect(cid, str(body.get("target", "?")), body.get("idempotency_key"),
                         epoch, intent_lsn=ev.lsn,
                         by=str(body["by"]) if body.get("by") else None,
                         fingerprint=body.get("fingerprint"),
                         did=what_it_did(body, st.turns, proposals, commands))
            if cid not in by_id:
                by_id[cid] = at_pos[str(body.get("call_id"))] = eff
                st.effects.append(eff)
        elif ev.kind == "ApprovalRequested":
            cid = str(body.get("call_id"))
            if cid not in asked:
                asked[cid] = ApprovalState(cid, str(body.get("call", "?")),
                                           expires_at=body.get("expires_at"))
                st.approvals.append(asked[cid])
        elif ev.kind == "ApprovalResolved":
            a = asked.get(str(body.get("call_id")))
            if a is not None and a.state == "pending":
                a.state, a.by = str(body.get("decision")), body.get("by")
        elif ev.kind == "Exchange":
            ch, pos = body.get("channel"), body.get("pos")
            if ch == "model":
                st.turns += 1
                resp = body.get("response")
                proposals = proposed_calls(resp.get("body") if isinstance(resp, dict) else None)
                handled = set()
            if base_channel(str(ch)) == "approval" and isinstance(pos, int):
                a = asked.get(call_id(str(body.get("proc")), str(ch), pos))
                if a is not None:
                    a.used = True
                    result = body.get("result") or {}
                    a.state = str(result.get("decision", a.state))
            if isinstance(pos, int):
                eff = at_pos.get(call_id(str(body.get("proc")), str(ch), pos))
                if eff is not None and eff.result_lsn is None:
                    eff.result_lsn = ev.lsn
                    eff.state = "settled"
        elif ev.kind in ("Settled", "ToolResult"):  # a person's word, a late result
            eff = by_id.get(str(body.get("call_id")))
            if eff is not None and eff.state == "in-doubt":
                eff.state = "settled"
                if ev.kind == "ToolResult" and "as" not in body:  # its own answer
                    eff.answered = True
                else:
                    eff.decision = str(body.get("as", "done"))
                    eff.given = ("output" if body.get("output") is not None else
                                 "result" if body.get("result") is not None else None)
        elif ev.kind == "LeaseAcquired":
            st.epoch = max(st.epoch, int(body.get("epoch", 0)))
            st.holder = body.get("pid")
            stopped = False
        elif ev.kind == "Authorized":
            stopped = body.get("decision") == "stop"
            a = asked.get(str(body.get("call_id"))) if body.get("approval") else None
            if a is not None:  # a held command or request, made or refused as decided
                a.used = True
        elif ev.kind == "RunEnded":
            ended = True
            st.exit_status = body.get("status")
        elif ev.kind == "RunStarted":
            ended = False
            argv = body.get("argv")
            if isinstance(argv, list):
                commands["0"] = " ".join(str(a) for a in argv)
        elif ev.kind == "ProcessStarted":
            commands[str(body.get("proc"))] = str(body.get("command") or "")
    if not ended:  # proposed by the model, not (yet) made: nothing of them left the host
        for tc in proposals[len(handled):]:
            st.effects.append(Effect(f"proposed/{tc.id}", f"tool call {tc.name}", None,
                                     st.epoch, state="not-sent"))
    if ended:
        st.state = "ended"
    elif writer_alive:
        st.state = "running"
    elif any(not a.used for a in st.approvals):
        st.state = "paused"
    elif stopped:
        st.state = "stopped"
    else:
        st.state = "needs-attention" if any(e.state == "in-doubt" for e in st.effects) \
            else "crashed"
    return st
