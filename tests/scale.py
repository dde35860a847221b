"""How many examples a property test runs: ``examples(n)`` is ``n`` times ``STENO_SCALE``.

``make test`` (and a plain ``pytest``) runs a quarter of each test's full count, so the
suite stays under ten minutes on two cores; ``make soak`` runs them at ``STENO_SCALE=3``, three
times the full count. The full counts stay written at each test, where a reader looks.
"""

from __future__ import annotations

import os

SCALE = float(os.environ.get("STENO_SCALE", "0.25"))


def examples(full: int, least: int = 5) -> int:
    """The examples to run of a test whose full count is ``full`` (never under ``least``:
    fewer for a test whose every example is a whole recorded and replayed run)."""
    return max(least, round(full * SCALE))
