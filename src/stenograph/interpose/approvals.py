"""``stenograph.approval``: hold a call until a person says yes, without holding a worker.

A call that needs a person is held: under ``stenograph record`` (or ``resume``) the
first time the program reaches it, ``ApprovalRequested`` (the call, a summary, when it
expires) is made durable after a checkpoint, and the process ends with exit 5
(``PAUSED_EXIT``). Nothing waits: the run is over until someone runs ``stenograph
approve`` or ``deny`` (``ApprovalResolved``) and ``stenograph resume``. The resumed
program replays up to the same call, and there gets the decision: approved returns an
``Approval``; denied, expired (not approved before ``expires``) or a precondition that no
longer holds raises ``ApprovalDenied``. The decision is then on the tape (an ``Exchange``
on the ``approval`` channel) like any call's result, so later replays get it too.

Outside a recorded run there is no one to ask and nothing to wait in: ``approval``
raises ``ApprovalDenied`` -- a gate that quietly opened would be worse.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stenograph.interpose.exits import PAUSED_EXIT, leave
from stenograph.interpose.fingerprint import fingerprint
from stenograph.interpose.pytape import PyTape, ReplayExhausted, Slot, current

CHANNEL = "approval"


class ApprovalDenied(Exception):
    """The held call was denied, its approval expired, or its precondition failed."""


@dataclass(frozen=True)
class Approval:
    """A granted approval: who granted it and what they said."""

    call: str
    by: str | None
    note: str | None


def _expires_at(expires: float | _dt.datetime | _dt.timedelta | None, now: float) -> float | None:
    if expires is None:
        return None
    if isinstance(expires, _dt.datetime):
        return expires.timestamp()
    if isinstance(expires, _dt.timedelta):
        return now + expires.total_seconds()
    return now + float(expires)


def approval(call: str, summary: str = "", *,
             expires: float | _dt.datetime | _dt.timedelta | None = None,
             precondition: Callable[[], Any] | None = None) -> Approval:
    """Hold ``call`` until a person approves it (see the module docstring). ``expires``:
    seconds from the request (or a datetime / timedelta); ``precondition``: re-checked
    when the approval is used, against the world as it is then -- false denies."""
    tape = current()
    if tape is None:
        raise ApprovalDenied(f"{call}: no stenograph run to hold it for approval")
    with tape.shim.paused():
        slot = tape.begin(CHANNEL)
        request = {"method": "APPROVAL", "url": f"{CHANNEL}:{call}",
                   "body": summary.encode()}
        fp = fingerprint("APPROVAL", request["url"], request["body"])
        if tape.mode == "replay":
            try:
                entry = tape.take(slot.stream, slot.pos, request, fp)
            except ReplayExhausted as exc:
                raise ApprovalDenied(str(exc)) from None
            return _outcome(call, entry.get("result") or {})
        # a resume gone live before this call (a tool left in doubt after its approval):
        # the decision the prefix recorded stands
        entry = tape.recorded(slot.stream, slot.pos, fp) if tape.resuming else None
        if entry is not None:
            return _outcome(call, entry.get("result") or {})
        return _live(tape, call, summary, slot, request, fp, expires, precondition)


def _outcome(call: str, result: dict[str, Any]) -> Approval:
    if result.get("decision") != "approved":
        raise ApprovalDenied(f"{call}: {result.get('reason') or 'denied'}"
                             + (f" by {result['by']}" if result.get("by") else "")
                             + (f": {result['note']}" if result.get("note") else ""))
    return Approval(call, result.get("by"), result.get("note"))


def _live(tape: PyTape, call: str, summary: str, slot: Slot, request: dict[str, Any],
          fp: str, expires: Any, precondition: Callable[[], Any] | None) -> Approval:
    cid = slot.call_id(tape.proc)
    now = time.time()
    known = tape.settlement().approvals.get(cid)
    if known is None or known.get("decision") is None:
        expires_at = known.get("expires_at") if known else _expires_at(expires, now)
        if expires_at is not None and now > expires_at:
            result = {"decision": "denied", "reason": "expired unapproved"}
        else:
            # ask (again, at a resume), durably, then stop: nothing may wait for a person
            if not tape.notify({"kind": "ApprovalRequested", "call_id": cid, "call": call,
                                "summary": summary, "requested_at": now,
                                "expires_at": expires_at}):
                raise ApprovalDenied(f"{call}: the request for approval could not be "
                                     "recorded")
            _pause()
    else:
        result = {"decision": known["decision"], "by": known.get("by"),
                  "note": known.get("note")}
        exp = known.get("expires_at")
        if result["decision"] == "approved" and exp is not None and \
                float(known.get("at") or now) > exp:
            result = {"decision": "denied", "reason": "approved after it expired",
                      "by": known.get("by")}
        if result["decision"] == "approved" and precondition is not None:
            with slot.inside():  # what it calls is its own: replay never runs it
                held = precondition()
            if not held:
                result = {"decision": "denied", "reason": "its precondition no longer holds"}
    tape.commit(slot.stream, slot.pos, {"fingerprint": fp, "request": request, "result": result,
                               "error": None, "call_id": cid})
    return _outcome(call, result)


def _pause() -> None:
    """End the process: the run is paused until the approval is resolved. The recorder
    has the request (it was made durable first); the CLI prints the one line a person
    reads."""
    leave(PAUSED_EXIT)
