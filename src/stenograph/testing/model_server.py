"""A loopback model server for demos and tests: OpenAI chat completions, the OpenAI
Responses API and Anthropic messages, scripted or seeded, streaming and not, with
failure knobs.

Why it exists: stenograph records what crosses the HTTP seam of an agent and replays
it offline. Testing that honestly needs the *official* SDKs talking real HTTP/1.1
(keep-alive, chunked SSE) to something that answers like the real APIs, yet gives
the same bytes for the same request on every run, so a recording made today can be
compared with one made tomorrow. So:

* **Deterministic.** The reply to a request depends only on the request, the script
  and the seed. Response ids, tool-call ids and ``created`` timestamps are hashes of
  the request; no ``Date`` header is sent. ``live_ids=True`` (``--live-ids``) brings
  back random ids and the wall clock, for showing what replay has to cope with.
* **Scripted or seeded.** A script is a list of turns (text and/or tool calls).
  The turn served is the number of assistant messages already in the request (for
  the Responses API: the number of runs of model output items, messages and
  function calls, in ``input``, plus those of the ``previous_response_id`` chain),
  so a conversation walks the script in order and a replayed request gets the same
  turn.
  Without a script, a reply is derived from a hash of the request and the seed
  (sometimes a call of one of the offered tools, with arguments built from its
  schema, on the first turn; otherwise a sentence).
* **Knobs** make the failure modes a recorder must capture happen on demand: fail
  the first N attempts of each distinct request with a 500, delay, close the
  connection before answering, cut a stream short. They are set for the whole server
  (constructor / CLI flags) or per request with the ``x-steno-test`` header, e.g.
  ``x-steno-test: fail=1, delay_ms=200``.

Routes::

    POST /v1/chat/completions   OpenAI chat completions (``"stream": true`` -> SSE)
    POST /v1/responses          OpenAI Responses API (``"stream": true`` -> SSE events:
                                response.created ... response.completed)
    GET  /v1/models[/ID]        OpenAI model list / model
    POST /v1/messages           Anthropic messages (``"stream": true`` -> SSE events)
    *    /echo                  the request as JSON: method, path, query, headers, body
    GET  /slow?ms=N             answers after N milliseconds
    GET  /stream?n=N&ms=M       N plain-text chunks, M ms apart (chunked encoding)

The ``/v1`` prefix is optional. ``/v1/*`` routes require an ``Authorization`` or
``x-api-key`` header (any value), like the real APIs, and answer 401 without one.

Knobs (header ``x-steno-test``, comma- or semicolon-separated ``key=value``; a bare
key means "every attempt"). Attempts are counted per distinct request (method, path,
query, body and the knob header itself; other headers, such as an SDK's retry
counter, are ignored). Attempt ``k`` (from 1):

    delay_ms=N        sleep N ms before answering (attempts <= delay_first, or all)
    delay_first=N     limit delay_ms to the first N attempts (0 = every attempt)
    close=N           attempts k <= N: close the connection (RST) without answering
    fail=N            attempts N_close < k <= N_close + N: answer fail_status
    fail_status=S     the status of a failed attempt (default 500)
    retry_after_ms=N  the ``retry-after-ms`` header on failures (default 10 so SDK
                      retries are quick; -1 omits it)
    chunk_delay_ms=N  sleep N ms between streamed events / chunks
    cut_after=N       streaming responses: drop the connection after N events

CLI::

    python -m stenograph.testing.model_server --port 0 [--script FILE] [--seed N]
        [--port-file PATH] [--live-ids] [--fail-first N] [--close-first N]
        [--delay-ms N] [--chunk-delay-ms N]

prints ``listening on http://127.0.0.1:PORT`` and stops cleanly on SIGTERM / SIGINT.

Python::

    with ModelServer(script=[{"text": "hi"}]) as srv:
        client = openai.OpenAI(base_url=srv.openai_base_url, api_key="x")
        ...
        srv.requests  # what the server received, failed attempts included
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stenograph.errors import BadInput

__all__ = [
    "KNOB_HEADER",
    "Knobs",
    "ModelServer",
    "ReceivedRequest",
    "ToolCall",
    "Turn",
    "load_script",
    "main",
]

KNOB_HEADER = "x-steno-test"
BASE_CREATED = 1_700_000_000
"""``created`` timestamps are this plus a hash of the request modulo a year: plausible
values that never depend on when the server runs."""
SYSTEM_FINGERPRINT = "fp_stenograph"
SERVER_HEADER = "stenograph-model-server"
ALWAYS = 1 << 30
"""What a bare knob (``close`` rather than ``close=2``) means: every attempt."""

_VOCAB = (
    "the agent reads a file and the model answers with a plan that the tape keeps "
    "so every replay sees the same reply tool result clock value and listing in order "
    "durable intent before effect small steps careful notes"
)
_WORDS: tuple[str, ...] = tuple(_VOCAB.split())
"""Seeded replies are sentences over this vocabulary (fixed: changing it changes replies)."""


# --------------------------------------------------------------------------- script


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a scripted turn; ``arguments`` is the JSON text of an object."""

    name: str
    arguments: str = "{}"
    id: str | None = None
    """A fixed id; by default the id is derived from the request (deterministic)."""


@dataclass(frozen=True)
class Turn:
    """One assistant reply: text, tool calls, or both (API-neutral)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def parse(cls, obj: Any, where: str = "turn") -> Turn:
        """Build a turn from its JSON form, rejecting anything we would silently drop."""
        if isinstance(obj, Turn):
            return obj
        if isinstance(obj, str):
            return cls(text=obj)
        if not isinstance(obj, Mapping):
            raise BadInput("a script turn must be an object or a string", where)
        unknown = set(obj) - {"text", "tool_calls"}
        if unknown:
            raise BadInput(f"unknown key(s) {sorted(unknown)} in a script turn", where)
        text = obj.get("text", "")
        if not isinstance(text, str):
            raise BadInput("'text' must be a string", where)
        raw_calls = obj.get("tool_calls", [])
        if not isinstance(raw_calls, list):
            raise BadInput("'tool_calls' must be a list", where)
        calls = tuple(_parse_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(raw_calls))
        if not text and not calls:
            raise BadInput("a script turn needs 'text' or 'tool_calls'", where)
        return cls(text=text, tool_calls=calls)


@dataclass(frozen=True)
class Branch:
    """A script turn that depends on what the model was given: ``then`` when ``text``
    occurs in the request's messages (or Responses ``input``, or Anthropic ``system``),
    else ``otherwise``. It lets a test plant a divergence the way a real model makes
    one: a changed tool result or prompt changes the reply."""

    text: str
    then: Turn
    otherwise: Turn

    @classmethod
    def parse(cls, obj: Mapping[str, Any], where: str) -> Branch:
        unknown = set(obj) - {"if", "then", "else"}
        if unknown:
            raise BadInput(f"unknown key(s) {sorted(unknown)} in a branch turn", where)
        if not isinstance(obj.get("if"), str) or not obj["if"]:
            raise BadInput("a branch turn's 'if' must be a non-empty string", where)
        if "then" not in obj or "else" not in obj:
            raise BadInput("a branch turn needs 'then' and 'else'", where)
        return cls(obj["if"], Turn.parse(obj["then"], f"{where}.then"),
                   Turn.parse(obj["else"], f"{where}.else"))

    def choose(self, req: Mapping[str, Any]) -> Turn:
        seen = json.dumps([req.get("messages"), req.get("input"), req.get("system")],
                          ensure_ascii=False)
        return self.then if self.text in seen or json.dumps(self.text)[1:-1] in seen \
            else self.otherwise


def _parse_call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, Mapping):
        raise BadInput("a tool call must be an object", where)
    unknown = set(obj) - {"name", "arguments", "id"}
    if unknown:
        raise BadInput(f"unknown key(s) {sorted(unknown)} in a tool call", where)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput("a tool call needs a 'name'", where)
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError as e:
            raise BadInput(f"'arguments' is not JSON: {e}", where) from None
        if not isinstance(parsed, dict):
            raise BadInput("'arguments' must be a JSON object", where)
        text = args
    elif isinstance(args, Mapping):
        text = json.dumps(args)
    else:
        raise BadInput("'arguments' must be an object or its JSON text", where)
    call_id = obj.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise BadInput("'id' must be a string", where)
    return ToolCall(name=name, arguments=text, id=call_id)


def load_script(source: str | os.PathLike[str] | Sequence[Any] | Mapping[str, Any]
                ) -> list[Turn | Branch]:
    """A script from a file path, a JSON list of turns, or ``{"turns": [...]}``; a turn
    ``{"if": TEXT, "then": TURN, "else": TURN}`` is a ``Branch``."""
    where = "script"
    data: Any = source
    if isinstance(source, str | os.PathLike):
        where = os.fspath(source)
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as e:
            raise BadInput(f"cannot read script: {e.strerror}", where) from None
        except ValueError as e:
            raise BadInput(f"script is not JSON: {e}", where) from None
    if isinstance(data, Mapping):
        data = data.get("turns")
    if not isinstance(data, Sequence) or isinstance(data, str | bytes):
        raise BadInput("a script is a list of turns (or an object with 'turns')", where)
    return [Branch.parse(t, f"{where}[{i}]") if isinstance(t, Mapping) and "if" in t
            else Turn.parse(t, f"{where}[{i}]") for i, t in enumerate(data)]


# --------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class Knobs:
    """Failure and timing behaviour; see the module docstring for the semantics."""

    fail: int = 0
    fail_status: int = 500
    close: int = 0
    delay_ms: int = 0
    delay_first: int = 0
    chunk_delay_ms: int = 0
    cut_after: int = -1
    retry_after_ms: int = 10

    def merged(self, header: str | None) -> Knobs:
        """These knobs overridden by an ``x-steno-test`` header value.

        Raises ``ValueError`` naming the bad entry: a typo in a test knob must fail
        the test loudly rather than quietly test nothing.
        """
        if not header:
            return self
        names = {f.name for f in fields(self)}
        changes: dict[str, int] = {}
        for item in re.split(r"[,;]", header):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if key not in names:
                raise ValueError(f"unknown {KNOB_HEADER} knob {key!r}")
            if not sep:
                if key not in ("fail", "close"):
                    raise ValueError(f"{KNOB_HEADER} knob {key!r} needs a value")
                changes[key] = ALWAYS
                continue
            try:
                changes[key] = int(value.strip())
            except ValueError:
                raise ValueError(
                    f"{KNOB_HEADER} knob {key!r}: {value!r} is not an integer"
                ) from None
        return replace(self, **changes)


@dataclass
class ReceivedRequest:
    """One request as the server saw it (failed and aborted attempts included)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """Lower-cased names; repeated headers joined with ``", "``."""
    body: bytes
    attempt: int
    """1 for the first time this exact request arrived, 2 for the first retry..."""
    status: int | None = None
    """The status answered; None if the connection was closed without an answer."""
    closed: bool = False
    """True if the server dropped the connection (``close`` or ``cut_after``)."""
    client_port: int = 0
    """The client's source port: equal for two requests means the connection was reused
    (keep-alive), which is how tests tell pooled clients from one-shot ones."""

    def json(self) -> Any:
        return json.loads(self.body)


# --------------------------------------------------------------------------- replies


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class _Ident:
    """Ids and timestamps of one response, derived from the request."""

    digest: str
    created: int
    live: bool

    def sub(self, label: str) -> str:
        if self.live:
            return uuid.uuid4().hex[:24]
        return _sha(self.digest, label)[:24]


def _tools_offered(req: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, JSON schema) of the tools in an OpenAI or Anthropic request."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    tools = req.get("tools")
    if not isinstance(tools, list):
        return out
    for t in tools:
        if not isinstance(t, Mapping):
            continue
        fn = t.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.append((fn["name"], fn.get("parameters") or {}))
        elif isinstance(t.get("name"), str):
            # Anthropic says input_schema; a Responses API function tool, parameters
            out.append((t["name"], t.get("input_schema") or t.get("parameters") or {}))
    return out


def _args_for(schema: Mapping[str, Any], digest: bytes) -> dict[str, Any]:
    """Deterministic arguments that satisfy the shape of a simple JSON schema."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return {}
    required = schema.get("required")
    names = [n for n in props if not isinstance(required, list) or n in required]
    args: dict[str, Any] = {}
    for i, name in enumerate(names):
        b = digest[(i + 8) % len(digest)]
        kind = props[name].get("type") if isinstance(props[name], Mapping) else None
        if kind == "integer":
            args[name] = b
        elif kind == "number":
            args[name] = b / 4
        elif kind == "boolean":
            args[name] = b % 2 == 0
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = _WORDS[b % len(_WORDS)]
    return args


def _seeded_turn(req: Mapping[str, Any], seed: int, turn_index: int) -> Turn:
    """A reply that depends only on the request's content and the seed.

    The stream flags are left out of the hash so the streaming and the non-streaming
    form of one request say the same thing.
    """
    content = {k: v for k, v in req.items() if k not in ("stream", "stream_options")}
    d = hashlib.sha256(b"seeded\0%d\0" % seed + _canonical(content)).digest()
    tools = _tools_offered(req)
    if tools and turn_index == 0 and d[0] % 4 != 0:
        name, schema = tools[d[1] % len(tools)]
        return Turn(tool_calls=(ToolCall(name=name, arguments=json.dumps(_args_for(schema, d))),))
    n = 6 + d[2] % 12
    words = [_WORDS[d[3 + i] % len(_WORDS)] for i in range(n)]
    return Turn(text=" ".join(words).capitalize() + ".")


def _pieces(text: str, size: int = 0) -> list[str]:
    """Split text the way a model streams it: word by word, or in ``size`` slices."""
    if not text:
        return []
    if size:
        return [text[i : i + size] for i in range(0, len(text), size)]
    return re.findall(r"\s*\S+\s*|\s+", text)


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def _openai_reply(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> dict[str, Any]:
    cid = f"chatcmpl-{ident.sub('id')}"
    calls = [
        {
            "id": c.id or f"call_{ident.sub(f'call{i}')}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(turn.tool_calls)
    ]
    prompt = _tokens(json.dumps(req.get("messages"), sort_keys=True))
    completion = _tokens(turn.text + "".join(c.arguments for c in turn.tool_calls))
    return {
        "id": cid,
        "calls": calls,
        "created": ident.created,
        "model": str(req.get("model", "")),
        "finish_reason": "tool_calls" if calls else "stop",
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def openai_body(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> dict[str, Any]:
    r = _openai_reply(req, turn, ident)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn.text or None,
        "refusal": None,
    }
    if r["calls"]:
        message["tool_calls"] = r["calls"]
    return {
        "id": r["id"],
        "object": "chat.completion",
        "created": r["created"],
        "model": r["model"],
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": r["finish_reason"]}
        ],
        "usage": r["usage"],
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def openai_stream(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> Iterator[bytes]:
    """SSE events as the real API sends them: role, content deltas, tool-call deltas
    (id and name first, then argument fragments), finish reason, usage, ``[DONE]``."""
    r = _openai_reply(req, turn, ident)
    opts = req.get("stream_options")
    include_usage = isinstance(opts, Mapping) and bool(opts.get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": r["id"],
            "object": "chat.completion.chunk",
            "created": r["created"],
            "model": r["model"],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            obj["usage"] = None
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": "" if turn.text else None, "refusal": None})
    for piece in _pieces(turn.text):
        yield chunk({"content": piece})
    for i, call in enumerate(r["calls"]):
        fn = call["function"]
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ]
            }
        )
        for piece in _pieces(fn["arguments"], 12):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, r["finish_reason"])
    if include_usage:
        final = {
            "id": r["id"],
            "object": "chat.completion.chunk",
            "created": r["created"],
            "model": r["model"],
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [],
            "usage": r["usage"],
        }
        yield b"data: " + json.dumps(final).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _anthropic_blocks(turn: Turn, ident: _Ident) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    for i, c in enumerate(turn.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": c.id or f"toolu_{ident.sub(f'tool{i}')}",
                "name": c.name,
                "input": json.loads(c.arguments),
            }
        )
    return blocks


def _anthropic_usage(req: Mapping[str, Any], turn: Turn, output: bool = True) -> dict[str, Any]:
    prompt = _tokens(json.dumps([req.get("system"), req.get("messages")], sort_keys=True))
    completion = _tokens(turn.text + "".join(c.arguments for c in turn.tool_calls))
    return {
        "input_tokens": prompt,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": completion if output else 1,
    }


def anthropic_body(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> dict[str, Any]:
    return {
        "id": f"msg_{ident.sub('id')}",
        "type": "message",
        "role": "assistant",
        "model": str(req.get("model", "")),
        "content": _anthropic_blocks(turn, ident),
        "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(req, turn),
    }


def anthropic_stream(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> Iterator[bytes]:
    """SSE events in the order of the real API: message_start, ping, per block
    start / deltas (text_delta, input_json_delta) / stop, message_delta, message_stop."""

    def event(obj: dict[str, Any]) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj).encode())

    full = anthropic_body(req, turn, ident)
    start = dict(full, content=[], stop_reason=None, usage=_anthropic_usage(req, turn, False))
    yield event({"type": "message_start", "message": start})
    yield event({"type": "ping"})
    for i, block in enumerate(full["content"]):
        if block["type"] == "text":
            yield event(
                {"type": "content_block_start", "index": i, "content_block": dict(block, text="")}
            )
            for piece in _pieces(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                yield event({"type": "content_block_delta", "index": i, "delta": delta})
        else:
            yield event(
                {"type": "content_block_start", "index": i, "content_block": dict(block, input={})}
            )
            for piece in _pieces(json.dumps(block["input"]), 12):
                delta = {"type": "input_json_delta", "partial_json": piece}
                yield event({"type": "content_block_delta", "index": i, "delta": delta})
        yield event({"type": "content_block_stop", "index": i})
    yield event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": full["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": full["usage"]["output_tokens"]},
        }
    )
    yield event({"type": "message_stop"})


# ------------------------------------------------------------- OpenAI Responses API

_MODEL_OUTPUT_TYPES = frozenset(
    {"function_call", "reasoning", "custom_tool_call", "web_search_call", "file_search_call"}
)
"""Input item types that are the model's own output sent back (with assistant messages)."""


def responses_turns_in(items: Any) -> int:
    """How many assistant turns a Responses API ``input`` holds.

    One turn of the model can be several items (a message and three function calls),
    so a turn is a maximal run of model-output items; the function_call_output or user
    message that follows ends it. This is what makes the turn index of a Responses
    conversation agree with the chat one (one assistant message per turn).
    """
    if not isinstance(items, list):
        return 0
    turns, in_run = 0, False
    for it in items:
        if not isinstance(it, Mapping):
            continue
        out = it.get("role") == "assistant" or it.get("type") in _MODEL_OUTPUT_TYPES
        if out and not in_run:
            turns += 1
        in_run = out
    return turns


def _responses_tools(req: Mapping[str, Any]) -> list[Any]:
    """The request's tools as the API echoes them: function tools with their defaults."""
    tools = req.get("tools")
    if not isinstance(tools, list):
        return []
    out: list[Any] = []
    for t in tools:
        if isinstance(t, Mapping) and t.get("type") == "function":
            out.append(
                {
                    "type": "function",
                    "name": t.get("name"),
                    "description": t.get("description"),
                    "parameters": t.get("parameters"),
                    "strict": t.get("strict", True),
                }
            )
        else:
            out.append(t)
    return out


def _responses_items(turn: Turn, ident: _Ident) -> list[dict[str, Any]]:
    """The finished output items of a turn: a message (if any text), then function calls."""
    items: list[dict[str, Any]] = []
    if turn.text:
        items.append(
            {
                "id": f"msg_{ident.sub('msg')}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": turn.text, "annotations": [], "logprobs": []}
                ],
            }
        )
    for i, c in enumerate(turn.tool_calls):
        items.append(
            {
                "id": f"fc_{ident.sub(f'fc{i}')}",
                "type": "function_call",
                "status": "completed",
                "call_id": c.id or f"call_{ident.sub(f'call{i}')}",
                "name": c.name,
                "arguments": c.arguments,
            }
        )
    return items


def responses_body(
    req: Mapping[str, Any], turn: Turn, ident: _Ident, *, final: bool = True
) -> dict[str, Any]:
    """A Response object; ``final=False`` is the in-progress one a stream starts with."""
    prompt = _tokens(json.dumps([req.get("instructions"), req.get("input")], sort_keys=True))
    completion = _tokens(turn.text + "".join(c.arguments for c in turn.tool_calls))
    text = req.get("text") if isinstance(req.get("text"), Mapping) else {}
    reasoning = req.get("reasoning") if isinstance(req.get("reasoning"), Mapping) else {}
    return {
        "id": f"resp_{ident.sub('id')}",
        "object": "response",
        "created_at": ident.created,
        "status": "completed" if final else "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "max_tool_calls": req.get("max_tool_calls"),
        "model": str(req.get("model", "")),
        "output": _responses_items(turn, ident) if final else [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "service_tier": "default",
        "store": req.get("store", True),
        "temperature": req.get("temperature", 1.0),
        "text": {"format": {"type": "text"}, **text},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": _responses_tools(req),
        "top_p": req.get("top_p", 1.0),
        "truncation": req.get("truncation", "disabled"),
        "usage": (
            {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }
            if final
            else None
        ),
        "user": req.get("user"),
        "metadata": req.get("metadata") or {},
    }


def responses_stream(req: Mapping[str, Any], turn: Turn, ident: _Ident) -> Iterator[bytes]:
    """SSE events in the order of the real API: response.created, response.in_progress,
    then per output item: output_item.added, (message) content_part.added,
    output_text.delta..., output_text.done, content_part.done, or (function call)
    function_call_arguments.delta..., function_call_arguments.done; output_item.done;
    and response.completed carrying the whole response with its usage. Every event has
    a ``sequence_number`` counting from 0."""
    seq = 0

    def event(obj: dict[str, Any]) -> bytes:
        nonlocal seq
        obj = {"type": obj["type"], "sequence_number": seq, **obj}
        seq += 1
        return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj).encode())

    full = responses_body(req, turn, ident)
    start = responses_body(req, turn, ident, final=False)
    yield event({"type": "response.created", "response": start})
    yield event({"type": "response.in_progress", "response": start})
    for n, item in enumerate(full["output"]):
        where = {"item_id": item["id"], "output_index": n}
        if item["type"] == "message":
            added = dict(item, status="in_progress", content=[])
            yield event({"type": "response.output_item.added", "output_index": n, "item": added})
            part = item["content"][0]
            at = {**where, "content_index": 0}
            empty = dict(part, text="")
            yield event({"type": "response.content_part.added", **at, "part": empty})
            for piece in _pieces(part["text"]):
                yield event(
                    {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
                )
            yield event(
                {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []}
            )
            yield event({"type": "response.content_part.done", **at, "part": part})
        else:
            added = dict(item, status="in_progress", arguments="")
            yield event({"type": "response.output_item.added", "output_index": n, "item": added})
            for piece in _pieces(item["arguments"], 12):
                delta = {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                yield event(delta)
            yield event(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        yield event({"type": "response.output_item.done", "output_index": n, "item": item})
    yield event({"type": "response.completed", "response": full})


# --------------------------------------------------------------------------- HTTP


class _Abort(Exception):
    """Unwinds a handler whose connection was dropped on purpose."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], app: ModelServer) -> None:
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def close_all(self) -> None:
        """Wake handler threads parked on idle keep-alive connections, so a stopped
        server leaves no thread or socket behind."""
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError | _Abort | OSError):
            return  # clients hanging up (timeouts, cancelled streams) are routine here
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = SERVER_HEADER
    timeout = 120  # idle keep-alive connections are closed after this
    server: _HTTPServer

    # -- plumbing ----------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        # Streams are many small writes: without NODELAY, Nagle holds each one until the
        # client's delayed ACK (40 ms), which would turn a stream into seconds.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read ``requests``; a line per request on stderr is noise

    def send_response(self, code: int, message: str | None = None) -> None:
        # No Date header unless live: the response must be a function of the request.
        self.send_response_only(code, message)
        self.send_header("Server", SERVER_HEADER)
        if self.server.app.live_ids:
            self.send_header("Date", self.date_time_string())

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _abort(self) -> None:
        """Drop the connection with a RST: what a crashed or overloaded peer looks like."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.close()
        self._rec.closed = True
        raise _Abort

    def _send(
        self, status: int, body: bytes, ctype: str = "application/json", **extra: str
    ) -> None:
        self._rec.status = status
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, obj: Any, **extra: str) -> None:
        self._send(status, json.dumps(obj).encode(), **extra)

    def _stream(self, events: Iterator[bytes], ctype: str, **extra: str) -> None:
        """Chunked transfer, one HTTP chunk per event, flushed as it is produced."""
        knobs = self._knobs
        self._rec.status = 200
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in extra.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        for n, ev in enumerate(events):
            if knobs.cut_after >= 0 and n >= knobs.cut_after:
                self._abort()
            if n and knobs.chunk_delay_ms:
                time.sleep(knobs.chunk_delay_ms / 1000)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        self.wfile.write(b"0\r\n\r\n")

    # -- dispatch ----------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        app = self.server.app
        try:
            body = self._read_body()
            url = urlsplit(self.path)
            headers: dict[str, str] = {}
            for k, v in self.headers.items():
                k = k.lower()
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
            knob_header = headers.get(KNOB_HEADER)
            key = _sha(self.command, url.path, url.query, body, knob_header or "")
            self._rec = app._received(
                self.command, url.path, url.query, headers, body, key, self.client_address[1]
            )
            try:
                self._knobs = app.knobs.merged(knob_header)
            except ValueError as e:
                self._send_json(400, {"error": {"message": str(e), "type": "steno_test_knob"}})
                return
            if not self._apply_knobs(url.path):
                self._route(url.path, parse_qs(url.query), headers, body)
        except _Abort:
            self.close_connection = True
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client gave up (a timeout, a cancelled stream)

    def _apply_knobs(self, path: str) -> bool:
        """Delay, drop or fail this attempt as the knobs say; True if it was answered."""
        k, attempt = self._knobs, self._rec.attempt
        if k.delay_ms and (k.delay_first == 0 or attempt <= k.delay_first):
            time.sleep(k.delay_ms / 1000)
        if attempt <= k.close:
            self._abort()
        if attempt <= k.close + k.fail:
            extra = {"retry-after-ms": str(k.retry_after_ms)} if k.retry_after_ms >= 0 else {}
            msg = f"injected failure (attempt {attempt}, {KNOB_HEADER} fail={k.fail})"
            self._send_json(k.fail_status, self._error_body(path, msg, "api_error"), **extra)
            return True  # the connection stays usable, as after a real 500
        return False

    @staticmethod
    def _error_body(path: str, message: str, kind: str) -> dict[str, Any]:
        """An error in the shape of the API the path belongs to, so SDKs parse it."""
        if path.endswith("/messages"):
            return {"type": "error", "error": {"type": kind, "message": message}}
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def _route(
        self, path: str, query: dict[str, list[str]], headers: dict[str, str], body: bytes
    ) -> None:
        app = self.server.app
        api = path[3:] if path.startswith("/v1/") else path
        if path == "/echo":
            self._send_json(200, _echo(self.command, path, self._rec.query, headers, body))
        elif path in ("/slow", "/stream") and self.command == "GET":
            try:
                ms = int(query.get("ms", ["0"])[0])
                n = int(query.get("n", ["5"])[0])
            except ValueError:
                self._send_json(400, {"error": {"message": "ms and n must be integers"}})
                return
            if path == "/slow":
                time.sleep(ms / 1000)
                self._send_json(200, {"slept_ms": ms})
                return
            if ms:
                self._knobs = replace(self._knobs, chunk_delay_ms=ms)
            self._stream((b"chunk %d\n" % i for i in range(n)), "text/plain; charset=utf-8")
        elif api in ("/chat/completions", "/responses", "/messages", "/models") or api.startswith(
            "/models/"
        ):
            if not (headers.get("authorization") or headers.get("x-api-key")):
                msg = "missing credentials: send an Authorization or x-api-key header"
                kind = "authentication_error" if api == "/messages" else "invalid_request_error"
                self._send_json(401, self._error_body(path, msg, kind))
            elif api.startswith("/models"):
                if self.command != "GET":
                    self._send_json(405, self._error_body(path, "use GET", "invalid_request_error"))
                elif api == "/models":
                    self._send_json(200, {"object": "list", "data": [app.model_card()]})
                else:
                    self._send_json(200, app.model_card(api[len("/models/") :]))
            elif self.command != "POST":
                self._send_json(405, self._error_body(path, "use POST", "invalid_request_error"))
            else:
                self._complete(path, api, body)
        else:
            self._send_json(404, {"error": {"message": f"no route {self.command} {path}"}})

    def _complete(self, path: str, api: str, body: bytes) -> None:
        app = self.server.app
        if api == "/responses":
            self._respond(path, body)
            return
        try:
            req = json.loads(body)
            if not isinstance(req, dict) or not isinstance(req.get("messages"), list):
                raise ValueError("the body must be a JSON object with a 'messages' list")
        except ValueError as e:
            self._send_json(400, self._error_body(path, str(e), "invalid_request_error"))
            return
        turn_index = sum(
            1 for m in req["messages"] if isinstance(m, Mapping) and m.get("role") == "assistant"
        )
        turn = app.turn_for(req, turn_index)
        if app.serve_as is not None:  # a provider that moved the name to a new snapshot
            req = {**req, "model": app.serve_as}
        ident = app.ident(path, req)
        request_id = f"req_{ident.sub('request')}"
        anthropic = api == "/messages"
        if req.get("stream"):
            events = (anthropic_stream if anthropic else openai_stream)(req, turn, ident)
            self._stream(events, "text/event-stream; charset=utf-8", x_request_id=request_id)
        else:
            obj = (anthropic_body if anthropic else openai_body)(req, turn, ident)
            self._send_json(200, obj, x_request_id=request_id)

    def _respond(self, path: str, body: bytes) -> None:
        """``POST /v1/responses``: ``input`` is a string (one user message) or a list of
        items; ``previous_response_id`` continues a response this server made."""
        app = self.server.app
        try:
            req = json.loads(body)
            if not isinstance(req, dict) or not isinstance(req.get("input"), str | list):
                raise ValueError("the body must be a JSON object with an 'input' string or list")
            prev = req.get("previous_response_id")
            earlier = 0
            if prev is not None:
                found = app._response_turns.get(prev) if isinstance(prev, str) else None
                if found is None:
                    raise ValueError(f"previous response {prev!r} not found")
                earlier = found
        except ValueError as e:
            self._send_json(400, self._error_body(path, str(e), "invalid_request_error"))
            return
        turn_index = earlier + responses_turns_in(req["input"])
        turn = app.turn_for(req, turn_index)
        if app.serve_as is not None:
            req = {**req, "model": app.serve_as}
        ident = app.ident(path, req)
        with app._lock:
            app._response_turns[f"resp_{ident.sub('id')}"] = turn_index + 1
        request_id = f"req_{ident.sub('request')}"
        if req.get("stream"):
            events = responses_stream(req, turn, ident)
            self._stream(events, "text/event-stream; charset=utf-8", x_request_id=request_id)
        else:
            self._send_json(200, responses_body(req, turn, ident), x_request_id=request_id)


def _echo(
    method: str, path: str, query: str, headers: dict[str, str], body: bytes
) -> dict[str, Any]:
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "method": method,
        "path": path,
        "query": query,
        "headers": headers,
        "body": text,
        "body_b64": base64.b64encode(body).decode(),
    }


# --------------------------------------------------------------------------- API


class ModelServer:
    """The server, run in a background thread on an ephemeral loopback port.

    ``script`` (a list of turns, ``{"turns": [...]}`` or a JSON file path) makes
    replies scripted; otherwise they are seeded by ``seed``. ``knobs`` are the
    defaults every request starts from (``x-steno-test`` overrides them).
    """

    def __init__(
        self,
        script: str | os.PathLike[str] | Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
        knobs: Knobs | None = None,
        live_ids: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str | None = None,
    ) -> None:
        self.script: list[Turn | Branch] | None = None if script is None else load_script(
            script)
        self.seed = seed
        self.knobs = knobs or Knobs()
        self.live_ids = live_ids
        self.model = model or ("steno-scripted-1" if self.script is not None else "steno-seeded-1")
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._requests: list[ReceivedRequest] = []
        self._attempts: dict[str, int] = {}
        self._response_turns: dict[str, int] = {}
        """Responses API: response id -> turns up to and including it (previous_response_id)."""
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.serve_as: str | None = None
        """The model every reply says answered it (None: the model asked for): set it to
        play a provider that serves a new version under the same name (drift)."""

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> ModelServer:
        if self._httpd is not None:
            return self
        self._httpd = _HTTPServer((self._host, self._port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"steno-model-server:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        httpd.close_all()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the model server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash): the Anthropic base URL."""
        return f"http://{self._host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: what ``openai.OpenAI(base_url=...)`` expects."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    # -- what was received ---------------------------------------------------------

    @property
    def requests(self) -> list[ReceivedRequest]:
        """Every request received so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def requests_to(self, path: str) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path == path]

    def reset(self) -> None:
        """Forget received requests and attempt counts (a fresh server, same port)."""
        with self._lock:
            self._requests.clear()
            self._attempts.clear()
            self._response_turns.clear()

    def _received(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        key: str,
        client_port: int,
    ) -> ReceivedRequest:
        with self._lock:
            attempt = self._attempts.get(key, 0) + 1
            self._attempts[key] = attempt
            rec = ReceivedRequest(method, path, query, headers, body, attempt)
            rec.client_port = client_port
            self._requests.append(rec)
            return rec

    # -- replies -------------------------------------------------------------------

    def turn_for(self, req: Mapping[str, Any], turn_index: int) -> Turn:
        if self.script is None:
            return _seeded_turn(req, self.seed, turn_index)
        if turn_index < len(self.script):
            t = self.script[turn_index]
            return t.choose(req) if isinstance(t, Branch) else t
        n = len(self.script)
        return Turn(text=f"[stenograph model server: script exhausted after {n} turns]")

    def ident(self, path: str, req: Mapping[str, Any]) -> _Ident:
        if self.live_ids:
            return _Ident(uuid.uuid4().hex, int(time.time()), True)
        digest = _sha(b"%d" % self.seed, path, _canonical(req))
        return _Ident(digest, BASE_CREATED + int(digest[:8], 16) % 31_536_000, False)

    def model_card(self, model_id: str | None = None) -> dict[str, Any]:
        mid = model_id or self.model
        created = BASE_CREATED + int(_sha(mid)[:8], 16) % 31_536_000
        return {"id": mid, "object": "model", "created": created, "owned_by": "stenograph"}


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m stenograph.testing.model_server",
        description="Loopback OpenAI/Anthropic-compatible model server with scripted "
        "or seeded, deterministic replies.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--script", help="JSON file: a list of turns, or {'turns': [...]}")
    p.add_argument("--seed", type=int, default=0, help="seed for unscripted replies")
    p.add_argument("--port-file", help="write the port number here once listening")
    p.add_argument("--live-ids", action="store_true", help="random ids, wall-clock times")
    p.add_argument("--model", help="the model id /v1/models lists")
    p.add_argument("--fail-first", type=int, default=0, metavar="N")
    p.add_argument("--fail-status", type=int, default=500, metavar="S")
    p.add_argument("--close-first", type=int, default=0, metavar="N")
    p.add_argument("--delay-ms", type=int, default=0, metavar="N")
    p.add_argument("--chunk-delay-ms", type=int, default=0, metavar="N")
    a = p.parse_args(argv)
    knobs = Knobs(
        fail=a.fail_first,
        fail_status=a.fail_status,
        close=a.close_first,
        delay_ms=a.delay_ms,
        chunk_delay_ms=a.chunk_delay_ms,
    )
    try:
        srv = ModelServer(
            a.script,
            seed=a.seed,
            knobs=knobs,
            live_ids=a.live_ids,
            host=a.host,
            port=a.port,
            model=a.model,
        )
        srv.start()
    except BadInput as e:
        print(f"model_server: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{a.host}:{a.port}"
        print(f"model_server: error: cannot listen: {e.strerror} ({where})", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if a.port_file:
            tmp = f"{a.port_file}.tmp{os.getpid()}"
            Path(tmp).write_text(f"{srv.port}\n")
            os.replace(tmp, a.port_file)  # readers never see a half-written file
        print(f"listening on {srv.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
