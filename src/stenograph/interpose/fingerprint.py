"""Request fingerprints and the readable diff shown when a replay diverges.

A request is matched by method, URL and canonical body. Headers are kept in the
recording but not matched: SDKs put retry counts, timeouts and platform strings
in them, which differ between harmless runs. JSON bodies are canonicalised
(sorted keys, no whitespace) so key order does not matter.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def canonical_url(url: str) -> str:
    p = urlsplit(url)
    host = (p.hostname or "").lower()
    port = p.port
    default = {"http": 80, "https": 443}.get(p.scheme.lower())
    netloc = host if port in (None, default) else f"{host}:{port}"
    return urlunsplit((p.scheme.lower(), netloc, p.path or "/", p.query, ""))


def parse_json(body: bytes) -> Any:
    """The body as JSON, or ``None`` if it is not JSON."""
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def canonical_body(body: bytes) -> bytes:
    doc = parse_json(body)
    if doc is None:
        return body
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint(method: str, url: str, body: bytes) -> str:
    h = hashlib.sha256()
    h.update(method.upper().encode())
    h.update(b"\0")
    h.update(canonical_url(url).encode())
    h.update(b"\0")
    h.update(canonical_body(body))
    return h.hexdigest()


def _flatten(doc: Any, prefix: str = "$") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(doc, dict):
        if not doc:
            out[prefix] = {}
        for k, v in doc.items():
            out.update(_flatten(v, f"{prefix}.{k}"))
    elif isinstance(doc, list):
        if not doc:
            out[prefix] = []
        for i, v in enumerate(doc):
            out.update(_flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = doc
    return out


def _short(v: Any, width: int = 120) -> str:
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) <= width else s[: width - 3] + "..."


def request_diff(recorded: dict[str, Any], actual: dict[str, Any], limit: int = 20) -> list[str]:
    """Lines describing how ``actual`` differs from ``recorded`` (JSON-aware)."""
    lines: list[str] = []
    if recorded["method"] != actual["method"]:
        lines.append(f"method: recorded {recorded['method']}, asked {actual['method']}")
    if canonical_url(recorded["url"]) != canonical_url(actual["url"]):
        lines.append(f"url: recorded {recorded['url']}")
        lines.append(f"     asked    {actual['url']}")
    rb, ab = recorded["body"], actual["body"]
    rj, aj = parse_json(rb), parse_json(ab)
    if rj is not None and aj is not None:
        fr, fa = _flatten(rj), _flatten(aj)
        for path in sorted(set(fr) | set(fa), key=lambda p: (p.count("."), p)):
            if path not in fa:
                lines.append(f"body {path}: removed (recorded {_short(fr[path])})")
            elif path not in fr:
                lines.append(f"body {path}: added {_short(fa[path])}")
            elif fr[path] != fa[path]:
                lines.append(f"body {path}: recorded {_short(fr[path])}")
                lines.append(f"     {' ' * len(path)}  asked    {_short(fa[path])}")
    elif rb != ab:
        rt = rb.decode("utf-8", "replace").splitlines()
        at = ab.decode("utf-8", "replace").splitlines()
        diff = list(difflib.unified_diff(rt, at, "recorded", "asked", lineterm="", n=1))
        lines.extend(f"body {d}" for d in diff) if diff else lines.append(
            f"body: {len(rb)} bytes recorded, {len(ab)} asked")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more differences"]
    return lines


def json_diff(recorded: dict[str, Any], actual: dict[str, Any],
              limit: int = 50) -> list[dict[str, Any]]:
    """How ``actual`` differs from ``recorded``, as ``{"path", "recorded", "asked"}``
    objects (a JSON body by leaf path; another body as a whole); absent = ``None``."""
    out: list[dict[str, Any]] = []
    if recorded["method"] != actual["method"]:
        out.append({"path": "method", "recorded": recorded["method"],
                    "asked": actual["method"]})
    if canonical_url(recorded["url"]) != canonical_url(actual["url"]):
        out.append({"path": "url", "recorded": recorded["url"], "asked": actual["url"]})
    rb, ab = recorded["body"], actual["body"]
    rj, aj = parse_json(rb), parse_json(ab)
    if rj is not None and aj is not None:
        fr, fa = _flatten(rj), _flatten(aj)
        for path in sorted(set(fr) | set(fa), key=lambda p: (p.count("."), p)):
            if fr.get(path, _ABSENT) != fa.get(path, _ABSENT):
                out.append({"path": f"body {path}", "recorded": fr.get(path),
                            "asked": fa.get(path)})
    elif rb != ab:
        out.append({"path": "body", "recorded": rb.decode("utf-8", "replace")[:4000],
                    "asked": ab.decode("utf-8", "replace")[:4000]})
    return out[:limit]


_ABSENT = object()


def request_json(req: dict[str, Any], limit: int = 64_000) -> dict[str, Any]:
    """A request as a report shows it: method, URL, and the body as JSON when it is JSON
    (else its text, cut at ``limit`` characters)."""
    body = req["body"]
    doc = parse_json(body)
    if doc is None:
        text = body.decode("utf-8", "replace")
        doc = text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"
    return {"method": req["method"], "url": req["url"], "body": doc}


def distance(recorded: dict[str, Any], actual: dict[str, Any]) -> int:
    """How unlike two requests are (for picking the nearest recorded candidate)."""
    return len(request_diff(recorded, actual, limit=10_000))
