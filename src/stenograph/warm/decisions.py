"""A person's decisions given through the warm tier, from any machine.

``approve``/``deny --db`` write the decision into the request's row of
``steno_approvals``; ``settle --db`` writes one row of ``steno_settlements``. Each is
checked against what the trajectory's shipped events say (an approval asked and not yet
answered; an effect in doubt), and refused in one line otherwise. Neither is an event
yet: the log is the truth, and only the worker that holds the trajectory writes it. A
``resume --db`` (on any host) takes the decisions its store does not have yet and appends
them as the CLI would on the trajectory's own host (``ApprovalResolved``, ``Settled``),
before it plans; they then ship back like any event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.warm.db import connect
from stenograph.warm.errors import WarmTierError, first_line, safe_url


@dataclass(frozen=True)
class Decision:
    """One decision waiting in the warm tier for the trajectory's worker."""

    kind: str
    """The event it becomes: ``ApprovalResolved`` or ``Settled``."""
    call_id: str
    body: dict[str, Any]


def _run(url: str, fn: Any) -> Any:
    import psycopg

    conn = connect(url)
    try:
        with conn.transaction(), conn.cursor() as cur:
            return fn(cur)
    except psycopg.Error as exc:
        raise WarmTierError(f"the warm tier refused the decision: {first_line(exc)}",
                            safe_url(url)) from None
    finally:
        conn.close()


def decide(url: str, traj: str, call: str, decision: str, by: str,
           note: str | None) -> str:
    """Approve or deny (``decision``: ``approved``/``denied``) the held ``call``; what it
    was (its call line)."""
    def tx(cur: Any) -> str:
        cur.execute("SELECT decision, call FROM steno_approvals WHERE trajectory_id = %s "
                    "AND call_id = %s FOR UPDATE", (traj, call))
        row = cur.fetchone()
        if row is None:
            raise BadInput(f"no approval {call!r} asked for in {traj} in the warm tier "
                           "(see `stenograph status --db`)", safe_url(url))
        if row[0] is not None:
            raise BadInput(f"{call} is already {row[0]}", safe_url(url))
        cur.execute("UPDATE steno_approvals SET decision = %s, decided_by = %s, "
                    "decided_at = now(), note = %s WHERE trajectory_id = %s AND call_id = %s",
                    (decision, by, note, traj, call))
        return str(row[1] or call)
    return str(_run(url, tx))


DELIVERED = "delivered"
"""A settlement row that is a late result (``deliver --db``), not a person's word."""


def settle(url: str, traj: str, call: str, as_: str, by: str | None, result: Any,
           output: bytes | None, exit_status: int | None) -> str:
    """Record a person's word on the effect ``call`` in doubt; its target."""
    def tx(cur: Any) -> str:
        cur.execute("SELECT state, target FROM steno_effects WHERE trajectory_id = %s "
                    "AND call_id = %s", (traj, call))
        row = cur.fetchone()
        if row is None:
            raise BadInput(f"no effect {call!r} in {traj} in the warm tier (see `stenograph "
                           "status --db`)", safe_url(url))
        if row[0] != "in-doubt":
            raise BadInput(f"{call} is already {row[0]}", safe_url(url))
        cur.execute("INSERT INTO steno_settlements (trajectory_id, call_id, decision, "
                    "result, output, exit_status, decided_by) VALUES (%s, %s, %s, %s::jsonb, "
                    "%s, %s, %s) ON CONFLICT (trajectory_id, call_id) DO NOTHING RETURNING 1",
                    (traj, call, as_, None if result is None else json.dumps(result),
                     output, exit_status, by))
        if cur.fetchone() is None:
            raise BadInput(f"{call} already has a person's word in the warm tier",
                           safe_url(url))
        return str(row[1] or call)
    return str(_run(url, tx))


def waiting(url: str, traj: str) -> list[Decision]:
    """Every decision the warm tier holds for ``traj``, as the events they become (the
    caller keeps those its store does not have yet)."""
    def tx(cur: Any) -> list[Decision]:
        out = []
        cur.execute("SELECT call_id, decision, decided_by, note, "
                    "extract(epoch from decided_at) FROM steno_approvals "
                    "WHERE trajectory_id = %s AND decision IS NOT NULL ORDER BY decided_at",
                    (traj,))
        for call, decision, by, note, at in cur.fetchall():
            out.append(Decision("ApprovalResolved", call, {
                "call_id": call, "decision": decision, "by": by, "note": note,
                "at": float(at) if at is not None else None}))
        cur.execute("SELECT call_id, decision, result, output, exit_status, decided_by "
                    "FROM steno_settlements WHERE trajectory_id = %s ORDER BY decided_at",
                    (traj,))
        for call, as_, result, output, exit_status, by in cur.fetchall():
            if as_ == DELIVERED:  # a late result: the ToolResult `deliver` appends
                out.append(Decision("ToolResult", call, {"call_id": call, "result": result,
                                                         "by": by, "as": "done"}))
                continue
            body: dict[str, Any] = {"call_id": call, "as": as_, "result": result, "by": by}
            if output is not None:
                body.update(output=bytes(output), exit=exit_status or 0)
            out.append(Decision("Settled", call, body))
        return out
    return list(_run(url, tx))
