"""Fencing tokens: a service's guard against a worker that lost its lease.

Every effect a recorded or resumed run sends carries ``Stenograph-Fencing-Token:
<trajectory>:<epoch>``; claiming a trajectory raises its epoch. A service that keeps
the highest epoch it has seen per trajectory and refuses anything lower can never be
reached by a stale worker (one paused past its lease and then continued) once the new
holder has sent anything. ``Gate`` is that check, small enough for a test double, and
``Gate.wsgi`` wraps a WSGI application with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

HEADER = "Stenograph-Fencing-Token"


def parse(token: str | None) -> tuple[str, int] | None:
    """``(trajectory, epoch)`` from a header value, or None if it is not one."""
    if not token or ":" not in token:
        return None
    traj, _, epoch = token.rpartition(":")
    return (traj, int(epoch)) if traj and epoch.isdigit() else None


class Gate:
    """Admit a token unless a higher epoch of its trajectory was admitted before."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, token: str | None) -> bool:
        """True for no token at all (not a fenced caller) and for a current one."""
        parsed = parse(token)
        if token and parsed is None:
            return False
        if parsed is None:
            return True
        traj, epoch = parsed
        with self._lock:
            if epoch < self._highest.get(traj, -1):
                return False
            self._highest[traj] = epoch
            return True

    def highest(self, traj: str) -> int | None:
        with self._lock:
            return self._highest.get(traj)

    def wsgi(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        """``app`` behind the gate: a stale token gets ``409 Conflict``."""
        environ_key = "HTTP_" + HEADER.upper().replace("-", "_")

        def gated(environ: dict[str, Any], start_response: Callable[..., Any]
                  ) -> Iterable[bytes]:
            if not self.admit(environ.get(environ_key)):
                start_response("409 Conflict", [("Content-Type", "text/plain")])
                return [b"stale fencing token\n"]
            return app(environ, start_response)

        return gated
