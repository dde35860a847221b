"""Known key shapes: secrets recognised by what they look like, not by the name they go by.

Redaction by name (``Authorization``, ``*_TOKEN``, ``"api_key"``) misses a key sent in a
URL path, base64- or hex-encoded in a JSON body, or written in a file under an innocent
name. So every request, response and snapshotted file is also searched for the formats
providers give their keys. The rule set is a maintained one: the regex detectors of
Yelp's ``detect-secrets`` (AWS, GitHub, GitLab, Slack, Stripe, OpenAI, JWT, Twilio,
SendGrid, npm, PyPI, Discord, Telegram, Mailchimp, Artifactory, Azure, Square, Softlayer,
Cloudant), plus ``OURS`` below for shapes it does not know. Left out: its IP-address
detector (an address is no secret), its basic-auth one (URL passwords are redacted by
name already) and its keyword detectors (a name such as ``cloudant_password`` followed by
a value: names are redacted by the name rules, and in files by the entropy rule of
``secretfiles.py``; those regexes try every position of a text and cost 10 ms on a 50 KB
chat request).

A text is not searched whole: its token-like runs (letters, digits and ``_-.:/+=~@%``,
16 characters or more) are cut out with a C-speed ``translate`` and ``split`` and only
those are matched, raw and (for runs that are base64 or hex) decoded; PEM blocks, which
span lines, are looked for directly.

``detect-secrets`` is imported only by the parent (``maintained``): the recorded program
must not have ``requests`` and ``yaml`` imported into it. The patterns reach the hooks as
a file, ``key-shapes.json`` in the tape directory (``STENO_TAPE``) or, recording, beside
the exchange socket (``STENO_PYSOCK``); the set a recording was made with is kept in its
``RunStarted`` so a replay redacts exactly as the recording did (its requests must match
their fingerprints whatever version of the rules is installed later).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

OURS: tuple[tuple[str, str], ...] = (
    ("Anthropic API key", r"sk-ant-[a-z]{2,10}\d{0,3}-[A-Za-z0-9_\-]{32,}"),
    ("OpenAI API key", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{40,}"),
    ("sk- key", r"(?<![A-Za-z0-9_\-])sk-(?=[A-Za-z0-9_\-]*[0-9A-Z])[A-Za-z0-9_\-]{20,}"),
    ("GitHub fine-grained token", r"github_pat_[A-Za-z0-9_]{40,}"),
    ("GitHub token", r"gh[pousr]_[A-Za-z0-9_]{36,}"),
    ("Google API key", r"AIza[0-9A-Za-z_\-]{35}"),
    ("Hugging Face token", r"hf_[A-Za-z0-9]{30,}"),
    ("Stripe key", r"(?:sk|rk|pk)_(?:test|live)_[0-9a-zA-Z]{24,}"),
    ("Slack token", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("JWT", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}"),
    ("private key block", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----\s*"
                          r"[A-Za-z0-9+/=:-]{16}[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY"
                          r"(?: BLOCK)?-----"),
)
"""Shapes ``detect-secrets`` 1.5 lacks or matches too narrowly: Anthropic keys; OpenAI keys
without the ``T3BlbkFJ`` marker its rule needs; the common ``sk-`` form many providers and
proxies share (DeepSeek, LiteLLM, OpenRouter...: ``sk-`` and 20 or more key characters, not
preceded by one -- ``task-...`` is no key -- with a digit or a capital among them, so that
hyphenated words such as ``sk-learn-compatible-estimator`` are not); fine-grained GitHub
tokens; Google and Hugging Face keys; Stripe test keys; Slack tokens whose parts are not
digits; a JWT with its signature (its detector's match stops before it); and a private
key's whole PEM block (its detector matches only the ``BEGIN`` line)."""

LEFT_OUT = frozenset({"IPPublicDetector", "BasicAuthDetector", "PrivateKeyDetector"})
KEYWORD_FORMS = ("(?:(?<=\\W)|(?<=^))", "aws.{0,20}")
"""How detect-secrets' keyword detectors begin (see the module docstring)."""
MIN_TOKEN = 16
"""Shortest run of token characters a key can be (AWS's ``AKIA`` + 16 is the shortest
known shape)."""
_TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                         b"_-.:/+=~@%")
_TO_MARK = bytes(0x78 if c in _TOKEN_CHARS else 0x20 for c in range(256))
_RUN = b"x" * MIN_TOKEN
_PEM = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----\s*"
                  rb"[A-Za-z0-9+/=:-]{16}[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
"""A private key block with a body (a masked one, all ``*``, is not one)."""

MIN_ENCODED = 24
"""Shortest base64 or hex run decoded to look for a key inside."""
_B64_RUN = re.compile(rb"[A-Za-z0-9+/_\-]{%d,}={0,2}" % MIN_ENCODED)
_HEX_RUN = re.compile(rb"(?:[0-9a-fA-F]{2}){%d,}" % (MIN_ENCODED // 2))


@dataclass(frozen=True)
class Shape:
    name: str
    pattern: str


FILE = "key-shapes.json"
"""The rule set a run's hooks read: in the tape directory, else the exchange socket's."""


def hook_path(tape: str | None, pysock: str | None) -> str | None:
    """Where the hooks of a process find the rule set (see ``FILE``)."""
    if tape:
        return str(Path(tape) / FILE)
    if pysock:
        return str(Path(pysock).parent / FILE)
    return None


def for_run(started: dict[str, object] | None = None) -> KeyShapes:
    """The rules a run redacts with: a recording's own (kept in ``RunStarted``) when
    replaying or resuming it, else the maintained set."""
    red = started.get("redaction") if isinstance(started, dict) else None
    if isinstance(red, dict) and "key_shapes" in red:
        return KeyShapes.from_json(red["key_shapes"])
    return KeyShapes(maintained())


def install(shapes: KeyShapes, directory: str | Path) -> None:
    """Write ``shapes`` where the hooks read them (the tape directory, or the one the
    exchange socket is in)."""
    shapes.write(Path(directory) / FILE)


def maintained() -> list[Shape]:
    """The rule set in force: ``detect-secrets``' regex detectors, then ``OURS``. Without
    ``detect-secrets`` importable, ``OURS`` alone (what was used is recorded)."""
    shapes: list[Shape] = []
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.plugins.base import RegexBasedDetector
    except ImportError:
        get_mapping_from_secret_type_to_class = None  # type: ignore[assignment]
    if get_mapping_from_secret_type_to_class is not None:
        for cls in sorted(get_mapping_from_secret_type_to_class().values(),
                          key=lambda c: c.__name__):
            if not issubclass(cls, RegexBasedDetector) or cls.__name__ in LEFT_OUT:
                continue
            for rx in cls.denylist:
                if not rx.pattern.startswith(KEYWORD_FORMS):
                    shapes.append(Shape(f"{cls.secret_type} (detect-secrets)", rx.pattern))
    shapes += [Shape(n, p) for n, p in OURS]
    return shapes


class KeyShapes:
    """A compiled rule set: ``found`` gives the secrets in a text, raw or encoded."""

    def __init__(self, shapes: Iterable[Shape]) -> None:
        self.shapes = list(shapes)
        self._res: list[re.Pattern[bytes]] = []
        self._needs: list[tuple[bytes, ...] | None] = []
        for s in self.shapes:
            try:
                rx = re.compile(s.pattern.encode())
            except re.error:
                continue  # a rule this Python cannot compile is skipped, not fatal
            self._res.append(rx)
            self._needs.append(required_literals(s.pattern))

    # -- files and bodies -----------------------------------------------------------------

    def to_json(self) -> list[list[str]]:
        return [[s.name, s.pattern] for s in self.shapes]

    @classmethod
    def from_json(cls, doc: object) -> KeyShapes:
        if not isinstance(doc, list):
            return cls([])
        return cls(Shape(str(x[0]), str(x[1])) for x in doc
                   if isinstance(x, list) and len(x) == 2)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @classmethod
    def read(cls, path: str | Path | None) -> KeyShapes:
        if not path:
            return cls([])
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            return cls([])

    # -- finding --------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self._res)

    def found(self, data: str | bytes) -> list[str]:
        """The secrets in ``data``: each key shape found raw, and inside any base64 or
        hex run long enough to hold one (decoded). What is returned is the key itself
        (the decoded one for an encoded copy): learnt, every encoding of it is scrubbed
        (``interpose.redact.encodings``)."""
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        if not self._res or len(raw) < MIN_TOKEN:
            return []
        tokens = _tokens(raw)
        out = self._in_tokens(raw, tokens)
        for tok in tokens:
            if len(tok) < MIN_ENCODED:
                continue
            for dec in _decodings(tok):
                out += self._in_tokens(dec, _tokens(dec))
        return sorted(set(out), key=len, reverse=True)

    def found_raw(self, data: bytes) -> list[str]:
        """The key shapes in ``data`` as it is (no decoding): what a file scan uses."""
        if not self._res or len(data) < MIN_TOKEN:
            return []
        return sorted(set(self._in_tokens(data, _tokens(data))), key=len, reverse=True)

    def _in_tokens(self, raw: bytes, tokens: list[bytes]) -> list[str]:
        out = list(self._raw(b"\n".join(tokens))) if tokens else []
        if b"-----BEGIN " in raw:
            out += [m.group(0).decode("utf-8", "replace") for m in _PEM.finditer(raw)]
        return out

    def _raw(self, raw: bytes) -> Iterator[str]:
        for rx, needs in zip(self._res, self._needs, strict=True):
            if needs is not None and not any(lit in raw for lit in needs):
                continue  # a literal every match holds is absent: no regex pass
            for m in rx.finditer(raw):
                groups = [g for g in m.groups() if g] if rx.groups else []
                best = max(groups, key=len) if groups else b""
                secret = best if len(best) >= 8 else m.group(0)
                if len(secret) >= 8:
                    yield secret.decode("utf-8", "replace")


def required_literals(pattern: str) -> tuple[bytes, ...] | None:
    """Literal strings one of which every match of ``pattern`` contains (a cheap
    ``bytes in`` test before the regex runs over a whole file), or None if none is
    known. Read off the parsed pattern: its first run of three or more literal
    characters, or an alternation whose every branch starts with two or more."""
    try:
        import re._parser as sre_parse  # type: ignore[import-not-found]
        from re._constants import BRANCH, IN, LITERAL, SUBPATTERN  # type: ignore
    except ImportError:
        return None
    try:
        tree = sre_parse.parse(pattern)
    except re.error:
        return None

    def run_of(items: list[tuple[object, object]]) -> bytes:
        out = bytearray()
        for op, av in items:
            if op is not LITERAL or not isinstance(av, int) or av > 127:
                break
            out.append(av)
        return bytes(out)

    items = list(tree)
    for i in range(len(items)):
        lit = run_of(items[i:])
        if len(lit) >= 3:
            return (lit,)
        op, av = items[i]
        if op is SUBPATTERN and isinstance(av, tuple):
            inner = list(av[-1])
            if len(inner) == 1 and inner[0][0] is BRANCH:
                branches = [run_of(list(b)) for b in inner[0][1][1]]
                if all(len(b) >= 2 for b in branches):
                    return tuple(branches)
        if op is BRANCH:
            branches = [run_of(list(b)) for b in av[1]]  # type: ignore[index]
            if all(len(b) >= 2 for b in branches):
                return tuple(branches)
        if op is not IN and op is not LITERAL:
            continue
    return None


def _tokens(raw: bytes) -> list[bytes]:
    """The runs of token characters long enough to be a key (``MIN_TOKEN``): every byte
    mapped to ``x`` (token) or a space, then ``bytes.find`` (memmem) for a run of ``x``
    -- the cost is one pass in C however many short words the text has."""
    marked = raw.translate(_TO_MARK)
    out: list[bytes] = []
    at = marked.find(_RUN)
    while at >= 0:
        end = marked.find(b" ", at + MIN_TOKEN)
        if end < 0:
            end = len(marked)
        out.append(raw[at:end])
        at = marked.find(_RUN, end)
    return out


def _decodings(tok: bytes) -> Iterator[bytes]:
    """A token decoded as hex, or as base64 (standard or URL-safe), if it is one."""
    if _HEX_RUN.fullmatch(tok):
        try:
            decoded = binascii.unhexlify(tok)
        except (binascii.Error, ValueError):
            return
        yield decoded
        return
    m = _B64_RUN.search(tok)
    if m is not None:
        yield from _b64_decodings(m.group(0))


def _b64_decodings(run: bytes) -> Iterator[bytes]:
    """``run`` decoded as base64 (standard or URL-safe), from each of its first four
    offsets: a run cut out of a longer text may not start on a 4-character boundary. Its
    last 2 or 3 characters are decoded too (padded): a short key's last bytes are there."""
    std = run.replace(b"-", b"+").replace(b"_", b"/").rstrip(b"=")
    for k in range(4):
        part = std[k:]
        part = part[:len(part) - 1] if len(part) % 4 == 1 else part
        part += b"=" * (-len(part) % 4)
        if len(part) < MIN_ENCODED - 4:
            return
        try:
            yield base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            continue
