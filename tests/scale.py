"""How many examples a property test runs: ``examples(n)`` is ``n`` times ``STENO_SCALE``.

``make test`` (and a plain ``pytest``) runs a third of each test's full count, so the suite
stays under ten minutes on two cores; ``make soak`` runs them at ``STENO_SCALE=3``, three
times the full count. The full counts stay written at each test, where a reader looks.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("STENO_SCALE", "0.33"))


def examples(full: int) -> int:
    """The examples to run of a test whose full count is ``full`` (never under 5)."""
    return max(5, round(full * SCALE))
