"""What the HTTP hooks share: classifying a URL, describing a request, rebuilding errors."""

from __future__ import annotations

import re
from typing import Any

from stenograph.interpose.fingerprint import fingerprint
from stenograph.interpose.pytape import PyTape
from stenograph.interpose.settings import getenv

_MODEL_PATH = re.compile(r"/(chat/completions|completions|responses|messages)/?$")


def _user_patterns() -> list[re.Pattern[str]]:
    raw = getenv("STENO_MODEL_URLS") or ""
    return [re.compile(p) for p in raw.split(",") if p.strip()]


_USER = _user_patterns()


def classify(url: str) -> str:
    """``model`` for a known model endpoint (OpenAI/Anthropic style, or user patterns)."""
    path = url.split("?", 1)[0]
    if _MODEL_PATH.search(path) or any(p.search(url) for p in _USER):
        return "model"
    return "http"


def describe(tape: PyTape, method: str, url: str, headers: list[tuple[str, str]],
             body: bytes) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(request as recorded, request as matched, fingerprint), all redacted the same way in
    record and replay (headers, which teach the rules the keys to scrub, first), so a
    replayed request is matched on the form its recording was written in."""
    rules = tape.rules
    red_headers = rules.header_items(headers)  # first, in both modes: it learns the keys
    ctype = next((v for k, v in headers if k.lower() == "content-type"), "")
    red_url = rules.url(url)
    red_body = rules.body(body, ctype)
    fp = fingerprint(method, red_url, red_body)
    match = {"method": method.upper(), "url": red_url, "body": red_body}
    if tape.mode != "record":
        return {}, match, fp
    recorded = {"method": method.upper(), "url": red_url,
                "headers": red_headers, "body": tape.spill(red_body)}
    return recorded, match, fp


def error_body(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}


def response_headers(tape: PyTape, items: list[tuple[str, str]]) -> list[list[str]]:
    return tape.rules.header_items(items)


def split_chunks(body: bytes, sizes: list[int]) -> list[bytes]:
    """A recorded body cut back into the chunks it arrived in (SSE replays chunk by chunk)."""
    out, at = [], 0
    for n in sizes:
        out.append(body[at:at + n])
        at += n
    return out
