"""What a model request and its reply say, whatever API carried them.

The trajectory view reads model exchanges of four shapes: OpenAI chat completions,
OpenAI Responses, Anthropic messages (each streamed or not) and ``stenograph.model``
calls (arguments and a result value). This module turns each request into its context
(system prompt, ordered messages, tool schemas) and each reply into what the model
chose (text, tool calls with their ids, stop reason, token counts, the model that
served it). A stream is assembled the way the client library assembles it, so a
streamed turn and its non-streamed twin give the same reply.

Pure functions of bytes and values; unknown shapes give an empty context or reply,
never an exception: a recording of an API this module does not know is still shown.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

API_CHAT = "openai.chat"
API_RESPONSES = "openai.responses"
API_ANTHROPIC = "anthropic.messages"
API_CALL = "stenograph.model"
API_UNKNOWN = "unknown"


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=repr).encode()


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def api_of(url: str, doc: Any) -> str:
    path = url.split("?", 1)[0].rstrip("/")
    if url.startswith("model:"):
        return API_CALL
    if path.endswith("/chat/completions"):
        return API_CHAT
    if path.endswith("/responses"):
        return API_RESPONSES
    if path.endswith("/messages"):
        return API_ANTHROPIC
    if isinstance(doc, dict):
        if "input" in doc or "instructions" in doc:
            return API_RESPONSES
        if "system" in doc or ("max_tokens" in doc and "messages" in doc):
            return API_ANTHROPIC
        if "messages" in doc:
            return API_CHAT
    return API_UNKNOWN


def decoded(body: bytes, headers: Any) -> bytes:
    """A response body as the client library read it: recorded bodies are the bytes on the
    wire, so a gzip/deflate/zstd ``content-encoding`` is undone here (a body that does not
    decode is returned as it is)."""
    enc = ""
    for h in headers if isinstance(headers, list) else []:
        if isinstance(h, (list, tuple)) and len(h) == 2 and str(h[0]).lower() == \
                "content-encoding":
            enc = str(h[1]).strip().lower()
    if not body or enc in ("", "identity"):
        return body
    try:
        if enc in ("gzip", "x-gzip", "deflate"):
            import zlib

            wbits = 47 if enc != "deflate" else (15 if body[:1] == b"\x78" else -15)
            return zlib.decompress(body, wbits)
        if enc == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30)
        if enc == "br":
            import brotli  # type: ignore[import-not-found]

            return bytes(brotli.decompress(body))
    except Exception:  # not what the header says: shown as recorded
        return body
    return body


def loads(body: bytes | None) -> Any:
    """The JSON of a body, or its text when it is not JSON, or None."""
    if not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


@dataclass(frozen=True)
class Context:
    """What the model was given: the parts that decide its answer, in order."""

    api: str
    model: str | None
    system: Any
    messages: list[Any]
    tools: list[Any]

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of system, messages and tools (not the model
        name, not sampling settings: a context is what the model reads)."""
        return digest({"system": self.system, "messages": self.messages,
                       "tools": self.tools})


def context_of(url: str, body: bytes | None) -> Context:
    doc = loads(body)
    api = api_of(url, doc)
    if not isinstance(doc, dict):
        return Context(api, None, None, [doc] if doc is not None else [], [])
    if api == API_CALL:
        kwargs = doc.get("kwargs") if isinstance(doc.get("kwargs"), dict) else {}
        args = doc.get("args") if isinstance(doc.get("args"), list) else []
        msgs = kwargs.get("messages")
        if msgs is None:
            msgs = next((a for a in args if isinstance(a, list)), None)
        if msgs is None:
            msgs = [*args, *({k: v} for k, v in sorted(kwargs.items()) if k != "tools")]
        model = kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
        return Context(api, model, kwargs.get("system"),
                       list(msgs) if isinstance(msgs, list) else [msgs],
                       list(kwargs.get("tools") or []))
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    tools = list(doc.get("tools") or []) if isinstance(doc.get("tools"), list) else []
    if api == API_RESPONSES:
        inp = doc.get("input")
        msgs = inp if isinstance(inp, list) else ([] if inp is None else [
            {"role": "user", "content": inp}])
        return Context(api, model, doc.get("instructions"), list(msgs), tools)
    msgs = doc.get("messages") if isinstance(doc.get("messages"), list) else []
    return Context(api, model, doc.get("system"), list(msgs), tools)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Any
    """The arguments as the model wrote them: parsed JSON when they parse, else text."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Reply:
    """What the model chose in one turn."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    served_model: str | None = None
    streamed: bool = False
    error: str | None = None
    """The call failed (no response, an error status): what went wrong, else None."""

    @property
    def action(self) -> Any:
        """The turn's chosen action, as compared across runs: the tool calls (name and
        arguments; ids are the model's own labels), or the answer's text (a failed call:
        its error)."""
        if self.error is not None:
            return {"failed": self.error}
        if self.tool_calls:
            return [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        return {"answer": self.text}

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool_calls": [c.to_json() for c in self.tool_calls],
                "stop_reason": self.stop_reason,
                "usage": {"input_tokens": self.input_tokens,
                          "output_tokens": self.output_tokens},
                "served_model": self.served_model, "streamed": self.streamed,
                "error": self.error}


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def sse_events(body: bytes) -> list[dict[str, Any]] | None:
    """The JSON objects of an SSE body's ``data:`` lines, or None when it is not SSE."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith(("{", "[")) or "data:" not in text:
        return None
    from stenograph.recorder.policy import json_objects

    return list(json_objects(body))


def reply_of(api: str, body: bytes | None) -> Reply:
    """The reply of a model exchange's response body (any of the HTTP APIs)."""
    if not body:
        return Reply()
    events = sse_events(body)
    if events is not None:
        return _stream(api, events)
    doc = loads(body)
    return _whole(doc) if isinstance(doc, dict) else Reply(
        text=doc if isinstance(doc, str) else None)


def reply_of_value(value: Any) -> Reply:
    """The reply of a ``stenograph.model`` call: its result value (a dict in one of the
    APIs' shapes is read as that reply; a string is the answer)."""
    if isinstance(value, dict):
        r = _whole(value)
        if r != Reply():
            return r
    if isinstance(value, str):
        return Reply(text=value)
    if isinstance(value, bytes):
        return reply_of(API_UNKNOWN, value)
    return Reply(text=None if value is None else json.dumps(value, default=repr))


def _whole(doc: dict[str, Any]) -> Reply:
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    tin = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    tout = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    if isinstance(doc.get("choices"), list):  # chat completions
        choice = doc["choices"][0] if doc["choices"] else {}
        msg = choice.get("message") or {}
        calls = tuple(ToolCall(str(c.get("id")), str((c.get("function") or {}).get("name")),
                               _args((c.get("function") or {}).get("arguments")))
                      for c in msg.get("tool_calls") or [] if isinstance(c, dict))
        return Reply(msg.get("content"), calls, choice.get("finish_reason"), tin, tout, model)
    if isinstance(doc.get("output"), list):  # responses
        texts, calls = [], []
        for item in doc["output"]:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                texts += [c.get("text", "") for c in item.get("content") or []
                          if isinstance(c, dict) and c.get("type") == "output_text"]
            elif item.get("type") == "function_call":
                calls.append(ToolCall(str(item.get("call_id") or item.get("id")),
                                      str(item.get("name")), _args(item.get("arguments"))))
        return Reply("".join(texts) if texts else None, tuple(calls),
                     doc.get("status"), tin, tout, model)
    if isinstance(doc.get("content"), list):  # anthropic
        texts, calls = [], []
        for block in doc["content"]:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                calls.append(ToolCall(str(block.get("id")), str(block.get("name")),
                                      block.get("input")))
        return Reply("".join(texts) if texts else None, tuple(calls),
                     doc.get("stop_reason"), tin, tout, model)
    return Reply()


@dataclass
class _Partial:
    id: str = ""
    name: str = ""
    args: list[str] = field(default_factory=list)
    value: Any = None


def _stream(api: str, events: list[dict[str, Any]]) -> Reply:
    for ev in events:  # a Responses stream ends with the whole response
        if ev.get("type") == "response.completed" and isinstance(ev.get("response"), dict):
            r = _whole(ev["response"])
            return Reply(r.text, r.tool_calls, r.stop_reason, r.input_tokens,
                         r.output_tokens, r.served_model, True)
    text: list[str] = []
    calls: dict[int, _Partial] = {}
    stop = model = None
    tin = tout = 0
    for ev in events:
        if isinstance(ev.get("model"), str):
            model = ev["model"]
        usage = ev.get("usage") if isinstance(ev.get("usage"), dict) else None
        if usage:
            tin = _int(usage.get("prompt_tokens", usage.get("input_tokens"))) or tin
            tout = _int(usage.get("completion_tokens", usage.get("output_tokens"))) or tout
        kind = ev.get("type")
        if isinstance(ev.get("choices"), list):  # chat completions chunks
            for ch in ev["choices"]:
                delta = ch.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    p = calls.setdefault(_int(tc.get("index")), _Partial())
                    p.id = tc.get("id") or p.id
                    fn = tc.get("function") or {}
                    p.name = fn.get("name") or p.name
                    if isinstance(fn.get("arguments"), str):
                        p.args.append(fn["arguments"])
                if ch.get("finish_reason"):
                    stop = ch["finish_reason"]
        elif kind == "message_start":
            msg = ev.get("message") or {}
            model = msg.get("model") if isinstance(msg.get("model"), str) else model
            u = msg.get("usage") or {}
            tin = _int(u.get("input_tokens")) or tin
            tout = _int(u.get("output_tokens")) or tout
        elif kind == "content_block_start":
            block = ev.get("content_block") or {}
            if block.get("type") == "tool_use":
                calls[_int(ev.get("index"))] = _Partial(str(block.get("id")),
                                                        str(block.get("name")))
            elif block.get("type") == "text" and block.get("text"):
                text.append(str(block["text"]))
        elif kind == "content_block_delta":
            delta = ev.get("delta") or {}
            if delta.get("type") == "text_delta":
                text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                calls.setdefault(_int(ev.get("index")), _Partial()).args.append(
                    str(delta.get("partial_json", "")))
        elif kind == "message_delta":
            stop = (ev.get("delta") or {}).get("stop_reason") or stop
    tool_calls = tuple(
        ToolCall(p.id, p.name, _args("".join(p.args)) if p.args else (
            {} if api == API_ANTHROPIC else ""))
        for _i, p in sorted(calls.items()))
    return Reply("".join(text) if text else None, tool_calls, stop, tin, tout, model, True)


@dataclass(frozen=True)
class Answer:
    """A tool's result as the program handed it back to the model."""

    call_id: str
    content: Any
    is_error: bool = False


def answers_in(ctx: Context) -> list[Answer]:
    """The tool results a request carries (they answer the previous turns' calls)."""
    out = []
    for m in ctx.messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool" and "tool_call_id" in m:  # chat completions
            out.append(Answer(str(m["tool_call_id"]), m.get("content")))
        elif m.get("type") == "function_call_output":  # responses
            out.append(Answer(str(m.get("call_id")), m.get("output")))
        elif isinstance(m.get("content"), list):  # anthropic
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append(Answer(str(b.get("tool_use_id")), b.get("content"),
                                      bool(b.get("is_error"))))
    return out
