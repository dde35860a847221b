"""stenograph: record an agent run to a durable log, replay it bit for bit.

``stenograph.model`` and ``stenograph.tool`` wrap callables so their calls are
recorded and replayed (see ``stenograph.interpose.calls``); they are imported on
first use, so ``import stenograph`` stays cheap for the CLI.

PYTEST_DONT_REWRITE: under ``stenograph record`` the hooks import this package before
pytest loads the plugin its ``pytest11`` entry point registers, and pytest would warn
that it cannot rewrite an imported module -- a warning the program never prints natively.
"""

from stenograph.version import __version__

__all__ = ["Approval", "ApprovalDenied", "__version__", "approval", "model", "tool"]


def __getattr__(name: str) -> object:  # no typing import: this runs in every taped process
    if name in ("model", "tool"):
        from stenograph.interpose import calls

        return getattr(calls, name)
    if name in ("approval", "Approval", "ApprovalDenied"):
        from stenograph.interpose import approvals

        return getattr(approvals, name)
    raise AttributeError(f"module 'stenograph' has no attribute {name!r}")
