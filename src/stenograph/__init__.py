"""stenograph: record an agent run to a durable log, replay it bit for bit.

``stenograph.model`` and ``stenograph.tool`` wrap callables so their calls are
recorded and replayed (see ``stenograph.interpose.calls``); they are imported on
first use, so ``import stenograph`` stays cheap for the CLI.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "model", "tool"]


def __getattr__(name: str) -> Any:
    if name in ("model", "tool"):
        from stenograph.interpose import calls

        return getattr(calls, name)
    raise AttributeError(f"module 'stenograph' has no attribute {name!r}")
