"""MCP tool calls in the trajectory: the official SDK's ``ClientSession.call_tool``.

An MCP server the agent starts is a child of the recorded tree: its pipes and its work
are on the tape, and a replay runs both ends. What the tape does not say is *which tool
was called with what*: that is in the JSON-RPC bytes, which the tape checks but does not
read. So under record each ``tools/call`` the SDK makes (mcp 1.x and 2.x; the OpenAI
Agents SDK and others go through it) leaves a ``ToolResult`` on the ``mcp`` channel --
the tool, its arguments, whether it failed, the start of its answer -- that ``show`` and
``view`` list in its turn, and that counts as the model's tool call being made. It is a
trace, not an effect: nothing here changes what the call does, and replay adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from stenograph.interpose.pytape import current

BRIEF = 400
"""How much of a call's arguments and answer the trace keeps."""


def _text(result: Any) -> str:
    parts = []
    for c in getattr(result, "content", None) or []:
        t = getattr(c, "text", None)
        if isinstance(t, str):
            parts.append(t)
    return " ".join(parts)[:BRIEF]


def _failed(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def install(mod: Any) -> None:
    """Wrap ``mod.ClientSession.call_tool`` (once)."""
    cls = getattr(mod, "ClientSession", None)
    orig: Callable[..., Awaitable[Any]] | None = getattr(cls, "call_tool", None)
    if cls is None or orig is None or getattr(orig, "_stenograph", False):
        return
    count = [0]

    async def call_tool(self: Any, name: str, arguments: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
        error: BaseException | None = None
        result: Any = None
        try:
            result = await orig(self, name, arguments, *args, **kwargs)
        except BaseException as exc:
            error = exc
        tape = current()
        if tape is not None and tape.mode == "record":
            with tape.shim.paused():
                n, count[0] = count[0], count[0] + 1
                args_text = json.dumps(arguments, default=str, sort_keys=True)[:BRIEF]
                failed = error is not None or _failed(result)
                tape.notify({"kind": "ToolResult", "channel": "mcp",
                             "call_id": f"{tape.proc}/mcp/{n}", "proc": tape.proc,
                             "target": f"mcp {name} {args_text}",
                             "as": "failed" if failed else "done",
                             "answer": repr(error)[:BRIEF] if error is not None
                             else _text(result)})
        if error is not None:
            raise error
        return result

    call_tool._stenograph = True  # type: ignore[attr-defined]
    call_tool.__wrapped__ = orig  # type: ignore[attr-defined]
    call_tool.__name__, call_tool.__doc__ = orig.__name__, orig.__doc__
    cls.call_tool = call_tool
