"""What a model call was made against: the model asked for, the model that answered,
the tool schemas and the system prompt -- so a resume can tell when the live
continuation talks to something else than the recording did.

``signature`` reads them from a model exchange's request and response bodies (OpenAI
chat completions and Responses, Anthropic messages; streamed or not). Tool schemas and
the system prompt are kept as sha256 of their canonical JSON, the tools also one by one
(by name), so a changed schema names its tool.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from stenograph.recorder.policy import usage_of

FIELDS = ("model", "served", "tools", "system")


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"),
                                     default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Signature:
    model: str | None = None
    served: str | None = None
    tools: str | None = None
    system: str | None = None
    tool_schemas: dict[str, str] = field(default_factory=dict)
    """Tool name -> sha256 of its schema."""

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Signature:
        return cls(**{k: body.get(k) for k in FIELDS},
                   tool_schemas=dict(body.get("tool_schemas") or {}))

    def differences(self, live: Signature) -> list[tuple[str, Any, Any]]:
        """(field, recorded, live) for every field both know and that differs."""
        out = []
        for f in FIELDS:
            old, new = getattr(self, f), getattr(live, f)
            if old is not None and new is not None and old != new:
                out.append((f, old, new))
        return out

    def changed_tools(self, live: Signature) -> list[str]:
        return sorted(n for n, sha in self.tool_schemas.items()
                      if n in live.tool_schemas and live.tool_schemas[n] != sha)


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return fn["name"]
    return tool.get("name") if isinstance(tool.get("name"), str) else None


def request_signature(body: bytes) -> Signature:
    """The request side: model asked for, tools, system prompt."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Signature()
    if not isinstance(doc, dict):
        return Signature()
    tools = doc.get("tools")
    system = doc.get("system", doc.get("instructions"))
    if system is None:
        msgs = doc.get("messages") or doc.get("input")
        if isinstance(msgs, list):
            system = [m.get("content") for m in msgs if isinstance(m, dict)
                      and m.get("role") in ("system", "developer")] or None
    schemas = {}
    for t in tools if isinstance(tools, list) else []:
        name = _tool_name(t)
        if name:
            schemas[name] = _sha(t)
    return Signature(doc.get("model") if isinstance(doc.get("model"), str) else None, None,
                     _sha(tools) if tools is not None else None,
                     _sha(system) if system is not None else None, schemas)


def tool_calls_of(response_body: bytes) -> list[str]:
    """The names of the tools a model reply calls (any of the formats, streamed or not)."""
    from stenograph.recorder.policy import json_objects

    names: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            fn = v.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
            elif v.get("type") in ("tool_use", "function_call") and isinstance(
                    v.get("name"), str):
                names.append(v["name"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for doc in json_objects(response_body):
        walk(doc)
    return sorted(set(names))


def signature(request_body: bytes, response_body: bytes | None) -> Signature:
    sig = request_signature(request_body)
    served = usage_of(response_body)[0] if response_body else None
    return Signature(sig.model, served, sig.tools, sig.system, sig.tool_schemas)
