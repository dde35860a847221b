"""The one line a person reads when a run stops for them (exits 4, 5, 6 and 8), or
does not start (exit 2: a recording of another shim protocol).

Each names the call (its id, what it does: the target and its arguments) and the command
to run next, with the real store and trajectory in it, so it can be pasted as it is. The
program under the tape prints nothing of its own for these stops: the recorder knows
what happened, and the CLI says it once.
"""

from __future__ import annotations

import shlex
from typing import Any


def _q(value: str) -> str:
    return shlex.quote(value)


def paused_line(store: str, traj: str, call_id: str, call: dict[str, Any]) -> str:
    """Exit 5: a call held for a person."""
    what = str(call.get("summary") or call.get("call") or "a held call")
    return (f"{traj} paused: {call_id} ({what}) waits for approval: `stenograph "
            f"approve|deny {_q(store)} {_q(traj)} {call_id} --by NAME`, then `stenograph "
            f"resume {_q(store)} {_q(traj)}`")


def stopped_line(store: str, traj: str, reason: str, at: dict[str, Any]) -> str:
    """Exit 6: a budget, a policy or drift stopped the run before a call."""
    where = (f" before {at['call_id']} ({at.get('target')})"
             if at.get("call_id") else "")
    return (f"{traj} stopped{where}: {reason}; `stenograph resume {_q(store)} {_q(traj)}` "
            "with a larger budget (or the drift it refused accepted) continues")


def needs_person_line(store: str, traj: str, line: str) -> str:
    """Exit 4: an effect in doubt that only a person can settle (the hook's line, with
    the real store and trajectory in its command)."""
    return line.replace("STORE TRAJ", f"{_q(store)} {_q(traj)}")


def fenced_line(store: str, traj: str, what: str) -> str:
    """Exit 8: this worker lost its lease to another, which carries on."""
    return (f"{what}; the run continues there: `stenograph status {_q(store)} {_q(traj)}` "
            "shows it")


def protocol_line(recorded: str, speaks: int, file: str, *, offer_build: bool = True,
                  release: str | None = None, shim: str | None = None) -> str:
    """Exit 2, before anything runs: a recording of shim protocol ``recorded`` asked to
    replay exactly by a shim that replays only ``speaks`` so. The ways on: a build replay
    (``offer_build``: ``stenograph replay``; a resume or a fork has none), and the
    release that recorded it (its version and shim, as ``RunStarted`` names them)."""
    build = (f"`stenograph replay --build {_q(file)}` judges it against this build, or "
             if offer_build else "")
    made_by = ", ".join(x for x in (f"stenograph {release}" if release else "",
                                    f"shim {shim}" if shim else "") if x)
    return (f"recorded with shim protocol {recorded}; this stenograph speaks {speaks} and "
            f"replays only protocol {speaks} bit for bit: {build}the stenograph release "
            f"that recorded it{f' ({made_by})' if made_by else ''} replays it exactly")


def drained_line(store: str, traj: str) -> str:
    """A worker that `stenograph drain` stopped at a turn boundary: what happens next."""
    return (f"stenograph: {traj} drained: stopped at a model turn, shipped, its lease let "
            f"go; `stenograph resume STORE --any --db URL` on another host goes on with it "
            f"(or `stenograph resume {store} {traj} --db URL` here)")
