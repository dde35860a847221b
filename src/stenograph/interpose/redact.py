"""Redaction: secrets never reach the log.

Applied to every request before it is written (record) and before it is
fingerprinted (both modes), so a replay run with a dummy API key still matches a
recording made with the real one. A value is redacted by its *name* (header, query
parameter, JSON field at any depth, urlencoded or multipart form field) when the name
is in a fixed list or matches ``NAME_PATTERN``; a password in a URL's userinfo is
redacted too. Response headers that set credentials (``set-cookie``) are redacted;
response bodies are not, because replay must hand the program the bytes it got,
except those of token endpoints (``TOKEN_URL``), whose secret fields are.

Secret *values* seen in redacted places, in the environment and in ``sys.argv`` are
remembered (per process) and scrubbed from everything else written, response bodies
and blobs included, raw and encoded (base64 at each byte alignment, hex, URL-encoded):
a server that echoes a key back must not smuggle it onto disk. Replay then serves the
scrubbed bytes, which the replay reports if the program's output depends on them.

A value in the shape of a known key (``recorder/keyshapes.py``: a maintained rule set)
is remembered the same way wherever it appears, whatever it is called: a URL path, a
JSON body (raw, or base64- or hex-encoded), a response, an environment variable.

The recorder redacts what the shim tells it with the same rules (``recorder/
tapesecrets.py``, ``runner/redaction.py``): a child's command line, a program's own
request on a taped connection, each send's first bytes (``mask``: in place).

The rules in force are written into the recording (``RunStarted``) so a reader
knows what was removed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

from stenograph.interpose.settings import getenv
from stenograph.recorder.keyshapes import KeyShapes, hook_path
from stenograph.recorder.secretfiles import read_values

REDACTED = "<redacted>"

DEFAULT_HEADERS = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key",
    "cookie", "set-cookie", "x-auth-token", "x-amz-security-token", "openai-organization",
    "openai-project",
})
DEFAULT_QUERY = frozenset({"api_key", "apikey", "key", "token", "access_token", "sig", "signature"})
DEFAULT_JSON = frozenset({"api_key", "apikey", "password", "secret", "client_secret"})

NAME_PATTERN = (r"key|token|secret|auth(?!or(?!iz))|passw|credential|bearer|session|cookie"
                r"|private")
"""A name containing one of these (any case) holds a secret. ``auth`` spares ``author``
and ``authority`` but not ``authorization``."""
BENIGN_NAME = re.compile(r"rate-?limit|tokens|tokeniz|keyword|keyboard", re.IGNORECASE)
"""Names the pattern matches that carry counts or settings, not secrets
(``x-ratelimit-remaining-tokens``, ``--max-tokens 512``, ``--tokenizer gpt2``): a
redacted one would change what a replayed program is given."""
TOKEN_URL = re.compile(r"token|oauth|auth(?!or(?!iz))|login|credential", re.IGNORECASE)
"""A URL path matching this is a token endpoint: its response body is redacted too."""

MIN_SECRET = 8
"""Shorter values are not scrubbed elsewhere: they would match innocent bytes."""

_MEMO, _MEMO_MIN = 8, 4096
"""A large body already scrubbed under the same secrets is not scanned again: a request
body is scrubbed when described, spilled and committed, each a pass per pattern."""

_QUOTED_REDACTED = (quote(REDACTED, safe="").encode(), quote(REDACTED, safe="").lower().encode())
"""What a client sends for a replayed ``REDACTED`` put in a URL path: scrubbed back, so
the replayed request matches its recording."""


def _env_set(name: str) -> frozenset[str]:
    raw = _getenv(name) or ""
    return frozenset(x.strip().lower() for x in raw.split(",") if x.strip())


def _getenv(name: str) -> str | None:
    return getenv(name)


def _env_regex(name: str) -> re.Pattern[str] | None:
    raw = _getenv(name) or ""
    return re.compile(raw, re.IGNORECASE) if raw else None


def secretish(value: str) -> bool:
    """Worth scrubbing wherever it appears: long enough, and not a word or a path (the
    environment's ``SSH_AUTH_SOCK``) whose every copy would otherwise be erased."""
    return (len(value) >= MIN_SECRET and REDACTED not in value and not value.startswith("/")
            and (len(value) >= 16 or any(c.isdigit() for c in value)))


def encodings(secret: bytes) -> list[bytes]:
    """Every form of ``secret`` a program is likely to write: raw, hex (both cases),
    URL-encoded, and the part of its base64 (standard and URL-safe alphabet) that does not
    depend on its neighbours, at each of the three byte alignments."""
    out = {secret, secret.hex().encode(), secret.hex().upper().encode(),
           quote(secret, safe="").encode(), quote_plus(secret, safe="").encode(),
           quote(secret, safe="").lower().encode()}
    n = len(secret)
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + secret)
        frag = enc[-(-8 * k // 6):(8 * (k + n)) // 6]
        if len(frag) >= MIN_SECRET:
            out.add(frag)
            out.add(frag.translate(bytes.maketrans(b"+/", b"-_")))
    return sorted(out, key=len, reverse=True)


@dataclass
class RedactionRules:
    headers: frozenset[str] = DEFAULT_HEADERS
    query: frozenset[str] = DEFAULT_QUERY
    json_fields: frozenset[str] = DEFAULT_JSON
    names: re.Pattern[str] = re.compile(NAME_PATTERN, re.IGNORECASE)
    values: re.Pattern[str] | None = None
    shapes: KeyShapes = field(default_factory=lambda: KeyShapes([]))
    """Known key shapes (``recorder/keyshapes.py``; the recording's own at replay)."""
    seen: set[str] = field(default_factory=set)
    _bytes: list[bytes] = field(default_factory=list, repr=False)
    _strs: list[str] = field(default_factory=list, repr=False)
    _values_b: re.Pattern[bytes] | None = field(default=None, repr=False)
    _gen: int = field(default=0, repr=False)
    _clean: list[tuple[str | bytes, int]] = field(default_factory=list, repr=False)
    _shaped: list[str | bytes] = field(default_factory=list, repr=False)
    _heads_by: dict[bytes, list[bytes]] = field(default_factory=dict, repr=False)
    _heads_gen: int = field(default=-1, repr=False)

    def __post_init__(self) -> None:
        if self.values is not None:
            self._values_b = re.compile(self.values.pattern.encode(), re.IGNORECASE)
        self._rebuild()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None,
                 argv: list[str] | None = None,
                 shapes: KeyShapes | None = None) -> RedactionRules:
        """Defaults plus ``STENO_REDACT_HEADERS`` / ``_QUERY`` / ``_JSON`` (comma lists of
        names), ``STENO_REDACT_NAMES`` (a regex of more secret names) and
        ``STENO_REDACT_VALUES`` (a regex of secret values); the secrets of the process's
        environment and argv are known from the start."""
        extra = _getenv("STENO_REDACT_NAMES") or ""
        rules = cls(
            headers=DEFAULT_HEADERS | _env_set("STENO_REDACT_HEADERS"),
            query=DEFAULT_QUERY | _env_set("STENO_REDACT_QUERY"),
            json_fields=DEFAULT_JSON | _env_set("STENO_REDACT_JSON"),
            names=re.compile(NAME_PATTERN + (f"|{extra}" if extra else ""), re.IGNORECASE),
            values=_env_regex("STENO_REDACT_VALUES"),
            shapes=shapes if shapes is not None else KeyShapes.read(
                hook_path(_getenv("STENO_TAPE"), _getenv("STENO_PYSOCK"))),
        )
        if shapes is None:  # in a run: what the workspace's files hold is secret too
            where = hook_path(_getenv("STENO_TAPE"), _getenv("STENO_PYSOCK"))
            rules.learn(*read_values(os.path.dirname(where) if where else None))
        for k, v in (os.environ if environ is None else environ).items():
            if not k.startswith("STENO_"):
                rules.env_value(k, v)
        rules.argv(sys.argv if argv is None else argv)
        return rules

    def to_body(self) -> dict[str, Any]:
        return {"headers": sorted(self.headers), "query": sorted(self.query),
                "json_fields": sorted(self.json_fields), "names": self.names.pattern,
                "values": self.values.pattern if self.values else None,
                "token_urls": TOKEN_URL.pattern, "key_shapes": self.shapes.to_json()}

    # -- names ---------------------------------------------------------------------------

    def secret_name(self, name: str, exact: frozenset[str] = frozenset()) -> bool:
        low = name.lower()
        return low in exact or (bool(self.names.search(name)) and not BENIGN_NAME.search(name))

    def env_value(self, name: str, value: str) -> str:
        """The environment variable as recorded: a secret name's value redacted, a URL's
        password removed; what is removed is learnt."""
        if self.secret_name(name):
            self.learn(value)
            return REDACTED
        self.learn_shapes(value)
        return self.scrub(self._userinfo(value))

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` with values of secret-named flags (``--api-key V``, ``--api-key=V``)
        and elements equal to a known secret redacted."""
        out: list[str] = []
        after_flag = False
        for a in argv:
            self.learn_shapes(a)
            if after_flag and not a.startswith("-"):
                self.learn(a)
                out.append(REDACTED)
                after_flag = False
                continue
            after_flag = False
            flag, eq, val = a.partition("=")
            if a.startswith("-") and self.secret_name(flag.lstrip("-")):
                if eq:
                    self.learn(val)
                    out.append(f"{flag}={REDACTED}")
                    continue
                after_flag = True
            out.append(REDACTED if a in self.seen else self._userinfo(self.scrub(a)))
        return out

    def header_items(self, items: list[tuple[str, str]]) -> list[list[str]]:
        """Header pairs with secret values replaced (names kept, order kept)."""
        out = []
        for k, v in items:
            if self.secret_name(k, self.headers):
                self.learn(v)
                v = REDACTED
            else:
                self.learn_shapes(v)
            out.append([k, self.scrub(v)])
        return out

    # -- values --------------------------------------------------------------------------

    def learn(self, *values: str) -> None:
        """Remember secrets to scrub everywhere, with each word of one (``Bearer KEY``),
        each cookie value (``sid=KEY; Path=/``) and a Basic credential's password. Many at
        once cost one rebuild (a workspace's secret files can hold thousands)."""
        parts: list[str] = []
        for value in values:
            parts.append(value)
            for word in re.split(r"[\s;,]+", value):
                parts += [word, word.partition("=")[2]]
            if value[:6].lower() == "basic ":
                with contextlib.suppress(ValueError, UnicodeDecodeError):
                    parts.append(
                        base64.b64decode(value[6:].strip()).decode().partition(":")[2])
        new = [p for p in parts if secretish(p) and p not in self.seen]
        if new:
            self.seen.update(new)
            self._rebuild()

    def learn_shapes(self, value: Any) -> None:
        """Remember every known key shape in ``value`` (nested; raw or encoded), so that
        ``scrub`` removes it, and its encodings, from everything written. The strings of
        ``value`` are looked through as one text: a response holds dozens of short ones,
        and the shapes' regexes ran over each of them apart."""
        if not self.shapes:
            return
        parts: list[bytes] = []
        self._gather(value, parts)
        if parts:
            for s in self.shapes.found(b"\n".join(parts)):
                self.learn(s)

    def _gather(self, value: Any, parts: list[bytes]) -> None:
        if isinstance(value, str | bytes):
            if len(value) < MIN_SECRET:
                return
            if len(value) >= _MEMO_MIN:
                if any(v is value for v in self._shaped):
                    return
                self._shaped = [*self._shaped[-(_MEMO - 1):], value]
            parts.append(value.encode("utf-8", "surrogateescape")
                         if isinstance(value, str) else value)
        elif isinstance(value, dict):
            for v in value.values():
                self._gather(v, parts)
        elif isinstance(value, list):
            for v in value:
                self._gather(v, parts)

    def _rebuild(self) -> None:
        pats: set[bytes] = set()
        for s in tuple(self.seen):  # another thread may be learning
            pats.update(encodings(s.encode()))
        pats.update(_QUOTED_REDACTED)
        self._gen += 1
        self._bytes = sorted(pats, key=len, reverse=True)
        self._strs = [p.decode("utf-8", "replace") for p in self._bytes]

    def _values(self, value: Any) -> Any:
        pat = self._values_b if isinstance(value, bytes) else self.values
        if pat is None:
            return value
        found = pat.findall(value)
        for m in found:
            if isinstance(m, str | bytes):
                self.learn(m if isinstance(m, str) else m.decode("utf-8", "replace"))
        return pat.sub(REDACTED if isinstance(value, str) else REDACTED.encode(), value) \
            if found else value

    def scrub(self, value: Any) -> Any:
        """Replace every remembered secret, in any of its encodings, inside ``value``
        (nested)."""
        if isinstance(value, str | bytes):
            if len(value) >= _MEMO_MIN and any(v is value and g == self._gen
                                               for v, g in self._clean):
                return value
            value = self._values(value)
            if isinstance(value, str):
                for s in self._strs:
                    if s in value:
                        value = value.replace(s, REDACTED)
            else:
                red = REDACTED.encode()
                for b in self._bytes:
                    if b in value:
                        value = value.replace(b, red)
            if len(value) >= _MEMO_MIN:
                self._clean = [*self._clean[-(_MEMO - 1):], (value, self._gen)]
            return value
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    def mask(self, data: bytes) -> bytes:
        """``data`` with its key shapes learnt, then every remembered secret in any of its
        encodings overwritten by as many ``*``, and one cut off at the end (8 bytes of it
        or more) too: for bytes whose length a record's layout fixes and which end where a
        copy stopped, such as the socket tape's send heads (``recorder/tapesecrets.py``)."""
        self.learn_shapes(data)
        for b in self._bytes:
            if b in data:
                data = data.replace(b, b"*" * len(b))
        heads = self._heads()
        longest = max(map(len, self._bytes), default=0)
        for i in range(max(0, len(data) - longest), len(data) - MIN_SECRET + 1):
            cands = heads.get(data[i:i + MIN_SECRET])
            if cands and any(p.startswith(data[i:]) for p in cands):
                return data[:i] + b"*" * (len(data) - i)
        return data

    def _heads(self) -> dict[bytes, list[bytes]]:
        """The remembered encodings by their first ``MIN_SECRET`` bytes (``mask``'s cut-off
        copies), made once per set of secrets."""
        if self._heads_gen != self._gen:
            heads: dict[bytes, list[bytes]] = {}
            for b in self._bytes:
                heads.setdefault(b[:MIN_SECRET], []).append(b)
            self._heads_by, self._heads_gen = heads, self._gen
        return self._heads_by

    # -- requests --------------------------------------------------------------------------

    def _userinfo(self, url: str) -> str:
        if "@" not in url or "://" not in url:
            return url
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            return url
        if not password:
            return url
        self.learn(password)
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))

    def url(self, url: str) -> str:
        """Userinfo password, secret-named query parameters and copies of known secrets
        (a path segment, say) redacted."""
        self.learn_shapes(url)
        url = self._userinfo(url)
        parts = urlsplit(url)
        if parts.query:
            pairs = parse_qsl(parts.query, keep_blank_values=True)
            secret = [self.secret_name(k, self.query) for k, _ in pairs]
            if any(secret):
                for (_, v), s in zip(pairs, secret, strict=True):
                    if s:
                        self.learn(v)
                q = urlencode([(k, REDACTED if s else v)
                               for (k, v), s in zip(pairs, secret, strict=True)])
                url = urlunsplit(parts._replace(query=q))
        return self.scrub(url)

    def body(self, body: bytes, content_type: str = "") -> bytes:
        """Secret-named JSON, urlencoded and multipart fields redacted, then known secrets
        scrubbed; a body without them is returned unchanged."""
        self.learn_shapes(body)
        if body:
            ctype = content_type.lower()
            if body[:1] in (b"{", b"["):
                body = self._json(body)
            elif "x-www-form-urlencoded" in ctype:
                body = self._form(body)
            elif "multipart/" in ctype:
                m = re.search(r'boundary="?([^";]+)', content_type, re.IGNORECASE)
                if m:
                    body = self._multipart(body, m.group(1).encode())
        return self.scrub(body)

    def _json(self, body: bytes) -> bytes:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return body
        if not self._has_field(doc, {}):
            return body
        changed = [False]
        out = self._scrub_doc(doc, changed)
        return json.dumps(out, separators=(",", ":")).encode() if changed[0] else body

    def _has_field(self, doc: Any, memo: dict[str, bool]) -> bool:
        """Whether a secret-named field is anywhere in ``doc``: a walk that builds nothing,
        each distinct name matched once (a chat request repeats ``role``/``content``)."""
        stack = [doc]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                for k, x in v.items():
                    hit = memo.get(k)
                    if hit is None:
                        hit = memo[k] = isinstance(k, str) and self.secret_name(
                            k, self.json_fields)
                    if hit and isinstance(x, str | list):
                        return True
                    if isinstance(x, dict | list):
                        stack.append(x)
            elif isinstance(v, list):
                stack.extend(x for x in v if isinstance(x, dict | list))
        return False

    def _scrub_doc(self, doc: Any, changed: list[bool]) -> Any:
        if isinstance(doc, dict):
            out = {}
            for k, v in doc.items():
                if isinstance(k, str) and self.secret_name(k, self.json_fields):
                    v = self._redact_strings(v, changed)
                    out[k] = v if isinstance(v, str) else self._scrub_doc(v, changed)
                else:
                    out[k] = self._scrub_doc(v, changed)
            return out
        if isinstance(doc, list):
            return [self._scrub_doc(v, changed) for v in doc]
        return doc

    def _redact_strings(self, v: Any, changed: list[bool]) -> Any:
        """A secret-named field's string value (or list of strings); numbers such as
        ``max_tokens`` are not secrets."""
        if isinstance(v, str):
            if v != REDACTED:
                self.learn(v)
                changed[0] = True
            return REDACTED
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return [self._redact_strings(x, changed) for x in v]
        return v

    def _form(self, body: bytes) -> bytes:
        try:
            pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True)
        except (ValueError, UnicodeDecodeError):
            return body
        secret = [self.secret_name(k, self.json_fields | self.query) for k, _ in pairs]
        if not any(secret):
            return body
        for (_, v), s in zip(pairs, secret, strict=True):
            if s:
                self.learn(v)
        return urlencode([(k, REDACTED if s else v)
                          for (k, v), s in zip(pairs, secret, strict=True)]).encode()

    def _multipart(self, body: bytes, boundary: bytes) -> bytes:
        sep = b"--" + boundary
        pieces = body.split(sep)
        for i, piece in enumerate(pieces):
            head, mark, content = piece.partition(b"\r\n\r\n")
            m = re.search(rb'name="([^"]*)"', head) if mark else None
            if m is None or not self.secret_name(m.group(1).decode("utf-8", "replace"),
                                                 self.json_fields | self.query):
                continue
            value, end = (content[:-2], b"\r\n") if content.endswith(b"\r\n") else (content, b"")
            self.learn(value.decode("utf-8", "replace"))
            pieces[i] = head + mark + REDACTED.encode() + end
        return sep.join(pieces)

    # -- responses -------------------------------------------------------------------------

    def response(self, entry: dict[str, Any], blobs: Any = None) -> dict[str, Any]:
        """A token endpoint's response with its secret fields redacted (a body that is not
        JSON or a form is replaced whole), the secrets learnt; other entries unchanged.
        A spilled body is redacted in the blob store and its unredacted blob removed."""
        req, resp = entry.get("request"), entry.get("response")
        if not isinstance(req, dict) or not isinstance(resp, dict):
            return entry
        url = req.get("url")
        if not isinstance(url, str) or not TOKEN_URL.search(urlsplit(url).path):
            return entry
        raw = resp.get("body")
        ref = None
        if isinstance(raw, dict) and blobs is not None:
            from stenograph.recorder.blobs import BlobRef

            ref = BlobRef.from_body(raw)
            raw = blobs.get(ref)
        if not isinstance(raw, bytes) or not raw:
            return entry
        ctype = next((str(v) for k, v in resp.get("headers", []) if k.lower() == "content-type"),
                     "")
        red = self._json(raw) if raw[:1] in (b"{", b"[") else raw
        if red is raw and "x-www-form-urlencoded" in ctype.lower():
            red = self._form(raw)
        if red is raw and raw[:1] not in (b"{", b"["):
            self.learn(raw.decode("utf-8", "replace").strip())
            red = REDACTED.encode()
        if red == raw:
            return entry
        body: Any = red
        if ref is not None:
            body = blobs.put(red).to_body()
            with contextlib.suppress(OSError):
                blobs.path_of(ref.sha256).unlink()
        return {**entry, "response": {**resp, "body": body}}

