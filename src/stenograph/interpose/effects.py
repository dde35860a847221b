"""Which calls are effects, and what an effect carries on the wire.

An HTTP request is an effect when it is not a model call and not read-only: methods
POST, PUT, PATCH and DELETE, unless its URL matches ``STENO_READONLY_URLS``; any method
when its URL matches ``STENO_EFFECT_URLS`` (both comma-separated regex lists, searched
in the URL). A ``@stenograph.tool(effect=True)`` is one by declaration.

Before an effect is dispatched its intent is made durable (``PyTape.intent``). An HTTP
effect leaves with two headers: ``Idempotency-Key`` (``idempotency_key``: derived from
what the intent does, so a resumed run sends the same key for the same intent and never
for another; a key the program set is kept and recorded) and
``Stenograph-Fencing-Token: <trajectory>:<epoch>``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from functools import lru_cache

from stenograph.fencing import HEADER as FENCING_HEADER

EFFECT_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IDEMPOTENCY_HEADER = "Idempotency-Key"


@lru_cache(maxsize=8)
def _patterns(spec: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p.strip()) for p in spec.split(",") if p.strip())


def is_effect(method: str, url: str, channel: str, effect_urls: str = "",
              readonly_urls: str = "") -> bool:
    if channel == "model":
        return False
    if any(p.search(url) for p in _patterns(effect_urls)):
        return True
    if any(p.search(url) for p in _patterns(readonly_urls)):
        return False
    return method.upper() in EFFECT_METHODS


MCP_METHODS = ("initialize", "ping", "notifications/", "tools/list", "resources/", "prompts/",
               "completion/", "logging/", "roots/", "sampling/", "elicitation/", "server/",
               "tasks/")
"""JSON-RPC methods of MCP's own that change nothing (``tools/call`` is the one that acts)."""

mcp_calls_in_flight = 0
"""``tools/call`` requests the MCP SDK hook is making now (``interpose/mcp_client.py``):
each has its own intent, so its HTTP request is not a second effect."""


def mcp_traffic(headers: Sequence[tuple[str, str]], body: bytes) -> bool:
    """Is this request an MCP client's transport traffic (streamable HTTP) that is no
    effect of its own: a JSON-RPC message of MCP's own methods, an answer to the server,
    the session's ``DELETE``, or a ``tools/call`` the SDK hook made an intent for? A
    ``tools/call`` sent by a client the hook does not see stays an HTTP effect."""
    mcp_headers = any(k.lower().startswith("mcp-") for k, _ in headers)
    if not body:
        return mcp_headers
    if b'"jsonrpc"' not in body[:4096]:  # (an upload is not parsed to find out)
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    msgs = doc if isinstance(doc, list) else [doc]
    if not msgs or not all(isinstance(m, dict) and m.get("jsonrpc") == "2.0" for m in msgs):
        return False
    for m in msgs:
        method = m.get("method")
        if method == "tools/call":
            if mcp_calls_in_flight <= 0:
                return False
        elif isinstance(method, str):
            if not method.startswith(MCP_METHODS):
                return False
        elif not mcp_headers:  # an answer: MCP's when its headers say so
            return False
    return True


def idempotency_key(traj: str, proc: str, stream: str, fingerprint: str,
                    occurrence: int) -> str:
    """The key an effect carries, from the intent's identity: the trajectory, the process,
    the stream it was made on (``http``, ``tool``, ``tool/0/http``), the request itself
    (its fingerprint: method, URL and body, or a tool's name and arguments) and how many
    identical requests that process made before it. Not its position: positions shift
    when a served call's body does not run, and a key derived from one was once sent
    again for a different payment. The same intent gets the same key in every resume;
    two intents get two keys, even when one asks exactly what the other did."""
    ident = f"{traj}\0{proc}\0{stream}\0{fingerprint}\0{occurrence}"
    return "steno-" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def program_key(headers: Sequence[tuple[str, str]]) -> str | None:
    """The idempotency key the program set itself, if any."""
    for k, v in headers:
        if k.lower() == IDEMPOTENCY_HEADER.lower():
            return v
    return None


def fencing_token(traj: str, epoch: int) -> str:
    return f"{traj}:{epoch}"


def wire_headers(traj: str, epoch: int, key: str,
                 headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The headers to add to an effect's request (none the program already set)."""
    have = {k.lower() for k, _ in headers}
    out = []
    if IDEMPOTENCY_HEADER.lower() not in have:
        out.append((IDEMPOTENCY_HEADER, key))
    if FENCING_HEADER.lower() not in have:
        out.append((FENCING_HEADER, fencing_token(traj, epoch)))
    return out
