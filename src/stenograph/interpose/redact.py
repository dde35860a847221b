"""Redaction: secrets never reach the log.

Applied to every request before it is written (record) and before it is
fingerprinted (both modes), so a replay run with a dummy API key still matches a
recording made with the real one. Response headers that set credentials
(``set-cookie``) are redacted too; response bodies are not, because replay must
hand the program the bytes it got.

Secret *values* seen in redacted places are remembered (per process) and
scrubbed from everything else written, response bodies included: a server that
echoes a key back must not smuggle it onto disk. Replay then serves the scrubbed
bytes, which the replay reports if the program's output depends on them.

The rules in force are written into the recording (``RunStarted``) so a reader
knows what was removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "<redacted>"

DEFAULT_HEADERS = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key",
    "cookie", "set-cookie", "x-auth-token", "x-amz-security-token", "openai-organization",
    "openai-project",
})
DEFAULT_QUERY = frozenset({"api_key", "apikey", "key", "token", "access_token", "sig", "signature"})
DEFAULT_JSON = frozenset({"api_key", "apikey", "password", "secret", "client_secret"})


def _env_set(name: str) -> frozenset[str]:
    from stenograph.interpose.pytape import getenv

    raw = getenv(name) or ""
    return frozenset(x.strip().lower() for x in raw.split(",") if x.strip())


MIN_SECRET = 8
"""Shorter values are not scrubbed elsewhere: they would match innocent bytes."""


@dataclass
class RedactionRules:
    headers: frozenset[str] = DEFAULT_HEADERS
    query: frozenset[str] = DEFAULT_QUERY
    json_fields: frozenset[str] = DEFAULT_JSON
    seen: set[str] = field(default_factory=set)

    @classmethod
    def from_env(cls) -> RedactionRules:
        """Defaults plus ``STENO_REDACT_HEADERS`` / ``_QUERY`` / ``_JSON`` (comma lists)."""
        return cls(
            headers=DEFAULT_HEADERS | _env_set("STENO_REDACT_HEADERS"),
            query=DEFAULT_QUERY | _env_set("STENO_REDACT_QUERY"),
            json_fields=DEFAULT_JSON | _env_set("STENO_REDACT_JSON"),
        )

    def to_body(self) -> dict[str, Any]:
        return {"headers": sorted(self.headers), "query": sorted(self.query),
                "json_fields": sorted(self.json_fields)}

    def header_items(self, items: list[tuple[str, str]]) -> list[list[str]]:
        """Header pairs with secret values replaced (names kept, order kept)."""
        out = []
        for k, v in items:
            if k.lower() in self.headers:
                self._saw(v)
                v = REDACTED
            out.append([k, v])
        return out

    def _saw(self, value: str) -> None:
        for part in (value, *value.split()):
            if len(part) >= MIN_SECRET:
                self.seen.add(part)

    def scrub(self, value: Any) -> Any:
        """Replace every remembered secret value inside ``value`` (nested)."""
        if not self.seen:
            return value
        if isinstance(value, str):
            for s in self.seen:
                if s in value:
                    value = value.replace(s, REDACTED)
            return value
        if isinstance(value, bytes):
            for s in self.seen:
                b = s.encode()
                if b in value:
                    value = value.replace(b, REDACTED.encode())
            return value
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        if not parts.query:
            return url
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if not any(k.lower() in self.query for k, _ in pairs):
            return url
        for k, v in pairs:
            if k.lower() in self.query:
                self._saw(v)
        q = urlencode([(k, REDACTED if k.lower() in self.query else v) for k, v in pairs])
        return urlunsplit(parts._replace(query=q))

    def body(self, body: bytes) -> bytes:
        """Redact configured JSON fields; a non-JSON body is returned unchanged."""
        if not self.json_fields or not body or body[:1] not in (b"{", b"["):
            return body
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return body
        if not _has_field(doc, self.json_fields):
            return body
        return json.dumps(_scrub(doc, self.json_fields, self.seen), separators=(",", ":")).encode()


def _has_field(doc: Any, names: frozenset[str]) -> bool:
    if isinstance(doc, dict):
        return any(k.lower() in names or _has_field(v, names) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_has_field(v, names) for v in doc)
    return False


def _scrub(doc: Any, names: frozenset[str], seen: set[str] | None = None) -> Any:
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k.lower() in names:
                if seen is not None and isinstance(v, str) and len(v) >= MIN_SECRET:
                    seen.add(v)
                out[k] = REDACTED
            else:
                out[k] = _scrub(v, names, seen)
        return out
    if isinstance(doc, list):
        return [_scrub(v, names, seen) for v in doc]
    return doc
