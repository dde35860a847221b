"""Where a crashed run is cut for its resume, and what the resumed run's tape is.

A crash leaves the log with a consistent prefix and a ragged edge. Every Python-level
event (an ``Exchange``, a ``ToolIntent``, the ``ContextBuilt`` that marks a model call's
start) is appended only after the recorder drained
every ring of the tree (``ExchangeServer.before_append``), so at such an event the log
holds everything the whole tree taped before it. ``TapeChunk``s after the last one are
the ragged edge: one thread's records past a point another thread's are not. The
**cut** is the last Python event (or the start checkpoint when there is none): a resume
replays the log up to it and goes live from there.

The resumed run appends to the same trajectory: ``LeaseAcquired {epoch, resumed_at: cut
seq}``, then its own events. The **view** of a trajectory -- what a replay, a later
resume or a status reads -- drops, at each such lease, the tape and checkpoint events
after its cut: they belong to the part the resume ran again live. Settlements and
other decisions made between the crash and the resume stay.

Pure functions of the events; nothing here runs a program.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.codec import Event
from stenograph.recorder.effects import TrajectoryState, call_id, fold
from stenograph.recorder.errors import BadInput
from stenograph.recorder.hostclient import caught_up
from stenograph.recorder.hostwire import host_serves
from stenograph.recorder.leases import LocalLeases
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import writer_holds

CUT_KINDS = frozenset({"Exchange", "ToolIntent", "ContextBuilt"})
"""Events appended after a drain of every ring: points the tape is consistent at
(``ContextBuilt``: a model call's start, ``PyTape.mark_turn``)."""

MCP = "mcp"
"""The channel of MCP tool calls (``interpose/mcp_client.py``)."""

DROPPED_AFTER_CUT = frozenset({"TapeChunk", "Checkpoint", "ProcessStarted", "ProcessEnded"})
"""What a resume runs again: the tape (and snapshots) past its cut."""


def view(events: Iterable[Event]) -> list[Event]:
    """The trajectory as its resumes left it: each resume's re-run edge dropped."""
    kept: list[Event] = []
    for ev in events:
        cut = ev.body.get("resumed_at") if ev.kind == "LeaseAcquired" and isinstance(
            ev.body, dict) else None
        if isinstance(cut, int):
            kept = [e for e in kept if e.seq <= cut or e.kind not in DROPPED_AFTER_CUT]
        kept.append(ev)
    return kept


RESULT_CUTS = frozenset({"net", "exec"})
"""Channels whose ``ToolResult`` the recorder appends with every ring drained: the
answer of a program's own request is whole there, its connection or command ended."""


def is_cut(ev: Event) -> bool:
    """Is the tape consistent at ``ev``: a Python event, a program's own effect answered
    (its whole answer taped before it), or the marked chunk the recorder appends when a
    process is about to use a connection outside the tree (``MSG_SYNC``)?"""
    body = ev.body if isinstance(ev.body, dict) else {}
    return ev.kind in CUT_KINDS or (ev.kind == "TapeChunk" and body.get("cut") is True) or (
        ev.kind == "ToolResult" and body.get("channel") in RESULT_CUTS and "as" not in body)


def cut_seq(events: Sequence[Event]) -> int:
    """The seq a resume cuts the (viewed) trajectory at: its last Python event or synced
    connection, else its start checkpoint, else its first event."""
    for ev in reversed(events):
        if is_cut(ev):
            return ev.seq
    for ev in events:
        if ev.kind == "Checkpoint" and ev.body.get("at") == "start":
            return ev.seq
    return events[0].seq if events else 0


def redo_points(events: Sequence[Event]) -> list[int]:
    """The intents of commands and requests a person settled since the last resume that
    never had a result: a resume cuts no later than each, so the process that made it
    comes back to it with nothing of it replayed -- not done, it is made again from its
    start (a command run anew, a request on a fresh connection); done, it is skipped.
    Cut later, the process would come back to it half way (a ``psql`` connected, its
    conversation begun), where nothing can be sent again."""
    last = max((e.seq for e in events if e.kind == "LeaseAcquired"
                and isinstance(e.body.get("resumed_at"), int)), default=-1)
    fresh = {str(e.body.get("call_id")) for e in events if e.kind == "Settled" and e.seq > last}
    settled = {str(e.body.get("call_id")) for e in events if e.kind == "Settled"}
    results = {str(e.body.get("call_id")) for e in events if e.kind == "ToolResult"}
    answered = {call_id(str(e.body.get("proc")), MCP, int(e.body["pos"])) for e in events
                if e.kind == "Exchange" and e.body.get("channel") == MCP
                and isinstance(e.body.get("pos"), int)}
    points = []
    for e in events:
        cid, ch = str(e.body.get("call_id")), e.body.get("channel")
        if e.kind != "ToolIntent":
            continue
        if ch in ("exec", "net") and cid in fresh - results:
            points.append(e.seq)
        elif ch == MCP and cid not in answered and (cid in fresh or cid not in settled):
            # an MCP call sent again (idempotent) or settled: the server must not have
            # read it in the prefix, or its replay answers what the client never asks
            points.append(e.seq)
    return points


def output_points(events: Sequence[Event]) -> list[int]:
    """For each effect a person settled since the last resume as done *with the output of
    the command that made it* (``settle --output``): the last cut before that command's
    process was started, so the resumed run reaches its exec live and is given the
    output instead of running it (``RecordSession.outputs``)."""
    last = max((e.seq for e in events if e.kind == "LeaseAcquired"
                and isinstance(e.body.get("resumed_at"), int)), default=-1)
    given = {str(e.body.get("call_id")) for e in events if e.kind == "Settled"
             and e.seq > last and e.body.get("output") is not None}
    points = []
    for i, e in enumerate(events):
        if e.kind != "ToolIntent" or str(e.body.get("call_id")) not in given:
            continue
        proc = e.body.get("proc")
        began = next((b for b in reversed(events[:i]) if b.kind == "ProcessStarted"
                      and b.body.get("proc") == proc), None)
        upto = began.seq if began is not None else e.seq
        points.append(max((c.seq for c in events if c.seq < upto and is_cut(c)),
                          default=events[0].seq))
    return points


def covered(events: Sequence[Event], state: TrajectoryState) -> list[tuple[str, str]]:
    """(effect, MCP call) for each effect in doubt that a process of the tree made while
    serving an MCP call now settled as done: the server's own request for the tool. The
    call's settlement says what happened inside it, and the resumed run never sends the
    call (its server never makes that request again), so the effect is not in doubt.
    "While serving" is read from the log: after the call's intent, before its client's
    next event (a client that makes calls concurrently makes this a guess)."""
    doubt = {e.call_id for e in state.effects if e.state == "in-doubt"}
    done = {e.call_id for e in state.effects if e.decision == "done" and e.result_lsn is None}
    out: list[tuple[str, str]] = []
    for i, ev in enumerate(events):
        b = ev.body
        if ev.kind != "ToolIntent" or b.get("channel") != MCP or str(b.get("call_id")) not in done:
            continue
        client = b.get("proc")
        for later in events[i + 1:]:
            lb = later.body if isinstance(later.body, dict) else {}
            if later.kind in ("ToolIntent", "Exchange") and lb.get("proc") == client:
                break
            if later.kind == "ToolIntent" and str(lb.get("call_id")) in doubt:
                out.append((str(lb.get("call_id")), str(b.get("call_id"))))
    return out


@dataclass
class ResumePlan:
    """What ``stenograph resume`` works from: the viewed events up to the cut (plus the
    decisions after it), the state, and the effects in doubt."""

    state: TrajectoryState
    cut: int
    events: list[Event]
    """The events the resumed run's tape is prepared from (the view, minus the edge)."""
    started: dict[str, Any]
    in_doubt: list[dict[str, Any]] = field(default_factory=list)
    """``{call_id, target, idempotency_key, fingerprint, proc, channel, pos}``."""
    settled_done: list[dict[str, Any]] = field(default_factory=list)
    """In-doubt effects a person settled as done: their ``Settled`` body and intent."""
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Approvals asked for and not yet used, by call id: ``expires_at``, and once
    resolved ``decision``, ``by``, ``note``, ``at`` (``interpose/approvals.py``)."""


def plan(traj: str, events: Sequence[Event]) -> ResumePlan:
    """The resume of ``traj`` from its events (in log order)."""
    seen = view(events)
    state = fold(traj, seen)
    cut = min([cut_seq(seen), *redo_points(seen), *output_points(seen)])
    started = next((e.body for e in seen if e.kind == "RunStarted"), {})
    kept = [e for e in seen if e.seq <= cut or e.kind not in DROPPED_AFTER_CUT]
    intents = {str(e.body.get("call_id")): e.body for e in seen if e.kind == "ToolIntent"}
    settled = {str(e.body.get("call_id")): e.body for e in seen
               if e.kind in ("Settled", "ToolResult")}
    p = ResumePlan(state, cut, kept, started if isinstance(started, dict) else {})
    for eff in state.effects:
        intent = intents.get(eff.call_id, {})
        if eff.state == "in-doubt":
            p.in_doubt.append({"call_id": eff.call_id, "target": eff.target, "did": eff.did,
                               "idempotency_key": eff.idempotency_key,
                               "fingerprint": intent.get("fingerprint"),
                               "proc": intent.get("proc"), "channel": intent.get("channel"),
                               "pos": intent.get("pos"),
                               **({"arguments": intent["arguments"]}
                                  if "arguments" in intent else {}),
                               **({"by": intent["by"]} if "by" in intent else {}),
                               **({"idempotent": intent["idempotent"]}
                                  if "idempotent" in intent else {})})
        elif (eff.decision == "done" and eff.result_lsn is None
              and intent.get("channel") not in ("net", "exec")):  # (no Python tape to serve)
            p.settled_done.append({"settled": settled.get(eff.call_id, {}), "intent": intent})
    resolved = {str(e.body.get("call_id")): e.body for e in seen
                if e.kind == "ApprovalResolved"}
    for a in state.approvals:
        if a.used:
            continue
        doc: dict[str, Any] = {"expires_at": a.expires_at, "call": a.call}
        r = resolved.get(a.call_id)
        if r is not None:
            doc.update(decision=r.get("decision"), by=r.get("by"), note=r.get("note"),
                       at=r.get("at"))
        p.approvals[a.call_id] = doc
    return p


def settled_entry(intent: dict[str, Any], result: Any) -> dict[str, Any]:
    """The Python-tape entry a call settled as done by a person gets: the program is
    handed ``result`` as the call's outcome (HTTP: a 200 with ``result`` as its JSON body;
    a tool: ``result`` itself), without the call being made."""
    import json

    proc, channel, pos = intent.get("proc"), intent.get("channel"), intent.get("pos")
    base = {"proc": proc, "channel": channel, "pos": pos,
            "fingerprint": intent.get("fingerprint"), "settled_by_person": True}
    target = str(intent.get("target", ""))
    kind, _, name = target.partition(" ")
    if kind in ("tool", "mcp"):  # a tool's result as is (mcp_client builds its answer)
        return {**base, "call_id": f"{name}#{pos}",
                "request": {"method": "CALL", "url": f"{channel}:{name}", "headers": [],
                            "body": intent.get("body") if isinstance(intent.get("body"), bytes)
                            else b""},
                "result": result, "error": None}
    method, _, url = target.partition(" ")
    body = b"" if result is None else json.dumps(result).encode()
    return {**base,
            "request": {"method": method, "url": url, "headers": [],
                        "body": intent.get("body") if isinstance(intent.get("body"), bytes)
                        else b""},
            "response": {"status": 200, "headers": [["content-type", "application/json"],
                                                    ["content-length", str(len(body))]],
                         "body": body, "chunks": [len(body)] if body else [],
                         "complete": True},
            "error": None}


def states(store: Path, traj: str | None = None) -> list[TrajectoryState]:
    """Each trajectory of ``store`` (or just ``traj``) folded to its state: ended, running
    (a writer or a worker's lease holds it), or waiting for a resume, a person, a
    settlement."""
    if not (store / "wal").is_dir():
        raise BadInput("not a store (no wal/ directory)", str(store))
    caught_up(store)
    reader = StoreReader(store)
    # an exclusive writer (not the host recorder): any trajectory may be moving
    alive = writer_holds(store) and not host_serves(store)
    leases = LocalLeases(store)  # a worker's lease: its trajectory is
    by_traj: dict[str, list] = {}
    for ev in reader.events(traj=traj):
        by_traj.setdefault(ev.traj, []).append(ev)
    if traj is not None and traj not in by_traj:
        raise BadInput(f"no trajectory {traj!r} in the store", str(store))
    return [fold(t, view(evs), writer_alive=alive or leases.held_by_other(t) is not None)
            for t, evs in sorted(by_traj.items())]
