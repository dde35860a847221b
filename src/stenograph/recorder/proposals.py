"""The tool calls a model reply proposes: what an effect in doubt is matched against
(``didwhat``), kept apart from the fold that uses them (``effects``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A tool call a model reply proposes: its id, the tool, its arguments as sent (JSON
    text; a stream's may be partial)."""

    id: str
    name: str
    arguments: str = ""


def proposed_calls(response_body: Any) -> list[ToolCall]:
    """Each tool call a model reply proposes, in order (OpenAI chat completions and
    Responses, Anthropic; streamed or not); none for a body kept in the blob store (over
    32 KiB) or not JSON."""
    import json

    if not isinstance(response_body, bytes):
        return []
    text = response_body.decode("utf-8", "replace").strip()
    docs = [text] if text.startswith("{") else [
        ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    out: dict[str, ToolCall] = {}

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            fn, cid = v.get("function"), v.get("id") or v.get("call_id")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(cid, str):
                out.setdefault(cid, ToolCall(cid, fn["name"], str(fn.get("arguments") or "")))
            elif v.get("type") in ("tool_use", "function_call") and isinstance(
                    v.get("name"), str) and isinstance(cid, str):
                args = v.get("input") if isinstance(v.get("input"), dict) else v.get("arguments")
                out.setdefault(cid, ToolCall(cid, v["name"], args if isinstance(args, str)
                                             else json.dumps(args or {})))
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for d in docs:
        try:
            walk(json.loads(d))
        except ValueError:
            continue
    return list(out.values())
