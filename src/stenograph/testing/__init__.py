"""Test and demo helpers that ship with stenograph.

``model_server`` is a loopback HTTP server that speaks the OpenAI chat-completions
and Anthropic messages APIs with scripted or seeded replies. It exists so that the
demo, the tests and the golden logs can drive the *official* SDKs over real HTTP
without a network, an account or a bill, and get the same bytes back every time.

The names below are loaded lazily: ``python -m stenograph.testing.model_server``
must not find its own module already imported by this package (runpy warns, and the
module would exist twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stenograph.testing.model_server import (
        Knobs,
        ModelServer,
        ReceivedRequest,
        ToolCall,
        Turn,
        load_script,
    )

__all__ = ["Knobs", "ModelServer", "ReceivedRequest", "ToolCall", "Turn", "load_script"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stenograph.testing import model_server

        return getattr(model_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
