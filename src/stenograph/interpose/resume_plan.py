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
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

FILE = "resume.json"
ATTENTION = "attention.json"
NEEDS_PERSON_EXIT = 4


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

    @classmethod
    def load(cls, tape_dir: Path | None) -> Settlement:
        if tape_dir is None:
            return cls()
        try:
            doc = json.loads((tape_dir / "py" / FILE).read_text())
        except (OSError, ValueError):
            return cls(tape_dir=tape_dir)
        return cls(dict(doc.get("in_doubt") or {}), tape_dir, dict(doc.get("drift") or {}),
                   dict(doc.get("approvals") or {}))

    def how(self, call_id: str, target: str) -> str | None:
        """``None`` (not in doubt), ``reissue``, ``probe`` or ``person`` for this call."""
        doubt = self.in_doubt.get(call_id)
        if doubt is None:
            return None
        if doubt.get("target") != target:
            from stenograph.interpose.pytape import _stop

            _stop(f"effect {call_id}: the resumed program sends {target}, the crashed run's "
                  f"intent was {doubt.get('target')}")
        return str(doubt.get("settle") or "reissue")

    def needs_person(self, call_id: str, target: str, why: str) -> NoReturn:
        """Stop the resumed run: this call's outcome needs a person (exit 4)."""
        line = (f"effect {call_id} ({target}) is in doubt and {why}: find out whether it "
                f"happened, then `stenograph settle STORE TRAJ {call_id} --as done|not-done` "
                "and resume again")
        if self.tape_dir is not None:
            with contextlib.suppress(OSError):
                (self.tape_dir / ATTENTION).write_text(json.dumps(
                    {"call_id": call_id, "target": target, "why": why, "line": line}))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stenograph: {line}\n")
            sys.stderr.flush()
        os._exit(NEEDS_PERSON_EXIT)
