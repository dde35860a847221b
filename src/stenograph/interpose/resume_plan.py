"""What a resumed program's hooks do with an effect the crashed run left in doubt.

``stenograph resume`` writes ``TAPE/py/resume.json``: every effect whose intent is durable
and whose result is not, with its target and how to settle it. The resumed program
replays its prefix and, when it reaches such a call live, the hook asks ``settle``:

* ``reissue``: send it again. The idempotency key it is sent with is the one recorded
  (derived from the trajectory and the call, or the program's own, which the replayed
  prefix computes again), so a service that honours keys applies it once. The default
  for HTTP effects, and for a declared tool with an ``idempotency_key``.
* ``probe``: a declared tool's ``probe`` says whether the effect happened.
* ``person``: nothing can tell: the run stops with exit 4 and one line naming the
  call, until ``stenograph settle`` records a decision.

A call that reaches this point with another target than its intent is a divergence:
the prefix did not lead to the same effect.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from stenograph.interpose.exits import NEEDS_PERSON_EXIT, diverged, leave, say

FILE = "resume.json"
ATTENTION = "attention.json"


@dataclass
class Settlement:
    """The in-doubt effects of the resumed trajectory, by call id."""

    in_doubt: dict[str, dict[str, Any]] = field(default_factory=dict)
    tape_dir: Path | None = None
    drift: dict[str, Any] = field(default_factory=dict)
    """``mode`` (pin, cross, refuse), ``last``: the signature of the recording's last model
    call (``recorder/drift.py``), ``in_doubt_tools``."""
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Approvals requested before this resume, by call id: ``expires_at``, and once a
    person resolved it ``decision`` (approved / denied), ``by``, ``note``, ``at``."""
    keys: dict[str, str] = field(default_factory=dict)
    """Every idempotency key the trajectory's intents carried, to the call id that sent
    it: a live call of the resume never leaves with one of them unless it is that call."""

    @classmethod
    def load(cls, tape_dir: Path | None) -> Settlement:
        if tape_dir is None:
            return cls()
        try:
            doc = json.loads((tape_dir / "py" / FILE).read_text())
        except (OSError, ValueError):
            return cls(tape_dir=tape_dir)
        return cls(dict(doc.get("in_doubt") or {}), tape_dir, dict(doc.get("drift") or {}),
                   dict(doc.get("approvals") or {}), dict(doc.get("keys") or {}))

    def how(self, call_id: str, target: str, fingerprint: str | None = None) -> str | None:
        """``None`` (not in doubt), ``reissue``, ``probe`` or ``person`` for this call. A
        call in that place asking something else than the intent did (another target,
        another request) is a divergence: the prefix did not lead to the same effect,
        and sending it under the intent's key would pass one payment off as another."""
        doubt = self.in_doubt.get(call_id)
        if doubt is None:
            return None
        recorded_fp = doubt.get("fingerprint")
        if doubt.get("target") != target or (
                fingerprint is not None and recorded_fp and recorded_fp != fingerprint):
            what = "another request to " if doubt.get("target") == target else ""
            diverged(f"effect {call_id}: the resumed program sends {what}{target}, the crashed "
                  f"run's intent was {doubt.get('target')}")
        return str(doubt.get("settle") or "reissue")

    def key_of(self, call_id: str) -> str | None:
        """The idempotency key an in-doubt intent was recorded with (sent again as is)."""
        doubt = self.in_doubt.get(call_id)
        key = doubt.get("idempotency_key") if doubt else None
        return str(key) if key else None

    def check_fresh(self, call_id: str, key: str) -> None:
        """A live call's derived key must be new: one an earlier intent carried belongs to
        that intent. (Keys are derived from what an intent does, so this holds by
        construction; the check makes a break of it a stop, never a payment passed off
        as another.)"""
        owner = self.keys.get(key)
        if owner is not None and owner != call_id:
            diverged(f"effect {call_id}: its idempotency key {key} was sent before for "
                  f"{owner}; refusing to send it for another intent")

    def needs_person(self, call_id: str, target: str, why: str,
                     body: Any = None) -> NoReturn:
        """Stop the resumed run: this call's outcome needs a person (exit 4). The line
        goes to the CLI (``ATTENTION``), which prints it: one line, naming the call,
        what it sends and the command to run next."""
        line = person_line(call_id, described(target, body), why)
        wrote = False
        if self.tape_dir is not None:
            with contextlib.suppress(OSError):
                (self.tape_dir / ATTENTION).write_text(json.dumps(
                    {"call_id": call_id, "target": target, "why": why, "line": line,
                     "arguments": brief(body)}))
                wrote = True
        if not wrote:  # no CLI to read it: say it here
            say(line)
        leave(NEEDS_PERSON_EXIT)


def person_line(call_id: str, what: str, why: str) -> str:
    """The one line of exit 4: the call, what it sends, why no one else can tell, and the
    command to run next (``STORE TRAJ`` filled in by the CLI)."""
    return (f"effect {call_id} ({what}) is in doubt and {why}: find out whether it "
            f"happened, then `stenograph settle STORE TRAJ {call_id} --as not-done` (it "
            "did not) or `--as done` with what it answered (`--result FILE`, or "
            "`--output FILE` for a command's stdout), and resume again")


def described(target: str, body: Any) -> str:
    """A call as a person reads it: ``POST https://.../payments {"amount":5}``, or
    ``tool provision(name="web1")``."""
    args = brief(body)
    return f"{target}{args}" if args.startswith("(") else f"{target} {args}".rstrip()


BRIEF = 120
"""How much of a call's arguments a one-line message shows."""


def brief(body: Any) -> str:
    """A call's arguments (a JSON body; a tool's ``{"args", "kwargs"}``, shown as
    ``(a, k=v)``) as one short line."""
    if isinstance(body, (bytes, bytearray)):
        text = bytes(body).decode("utf-8", "replace")
    elif isinstance(body, str):
        text = body
    else:
        return ""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and set(doc) == {"args", "kwargs"} and isinstance(
            doc["args"], list) and isinstance(doc["kwargs"], dict):
        parts = [json.dumps(a) for a in doc["args"]]
        parts += [f"{k}={json.dumps(v)}" for k, v in doc["kwargs"].items()]
        text = f"({', '.join(parts)})"
    text = " ".join(text.split())
    return text if len(text) <= BRIEF else text[:BRIEF - 3] + "..."
