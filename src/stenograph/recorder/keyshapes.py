"""Known key shapes: secrets recognised by what they look like, not by the name they go by.

Redaction by name (``Authorization``, ``*_TOKEN``, ``"api_key"``) misses a key sent in a
URL path, base64- or hex-encoded in a JSON body, or written in a file under an innocent
name. So every request, response and snapshotted file is also searched for the formats
providers give their keys. The rule set is a maintained one: the regex detectors of
Yelp's ``detect-secrets`` (AWS, GitHub, GitLab, Slack, Stripe, OpenAI, JWT, Twilio,
SendGrid, npm, PyPI, Discord, Telegram, Mailchimp, Artifactory, Azure, Square, IBM,
Softlayer, Cloudant; its IP-address and basic-auth detectors are left out: an address is
no secret, and URL passwords are redacted by name already), plus ``OURS`` below for
shapes it does not know.

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
    ("GitHub fine-grained token", r"github_pat_[A-Za-z0-9_]{40,}"),
    ("GitHub token", r"gh[pousr]_[A-Za-z0-9_]{36,}"),
    ("Google API key", r"AIza[0-9A-Za-z_\-]{35}"),
    ("Hugging Face token", r"hf_[A-Za-z0-9]{30,}"),
    ("Stripe key", r"(?:sk|rk|pk)_(?:test|live)_[0-9a-zA-Z]{24,}"),
    ("Slack token", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("JWT", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}"),
    ("private key block", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                          r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"),
)
"""Shapes ``detect-secrets`` 1.5 lacks or matches too narrowly: Anthropic keys; OpenAI keys
without the ``T3BlbkFJ`` marker its rule needs; fine-grained GitHub tokens; Google and
Hugging Face keys; Stripe test keys; Slack tokens whose parts are not digits; a JWT with
its signature (its detector's match stops before it); and a private key's whole PEM block
(its detector matches only the ``BEGIN`` line)."""

LEFT_OUT = frozenset({"IPPublicDetector", "BasicAuthDetector", "PrivateKeyDetector"})

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
                shapes.append(Shape(f"{cls.secret_type} (detect-secrets)", rx.pattern))
    shapes += [Shape(n, p) for n, p in OURS]
    return shapes


class KeyShapes:
    """A compiled rule set: ``found`` gives the secrets in a text, raw or encoded."""

    def __init__(self, shapes: Iterable[Shape]) -> None:
        self.shapes = list(shapes)
        self._res: list[re.Pattern[bytes]] = []
        for s in self.shapes:
            try:
                self._res.append(re.compile(s.pattern.encode()))
            except re.error:
                continue  # a rule this Python cannot compile is skipped, not fatal

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
        if not self._res or len(raw) < 8:
            return []
        out = list(self._raw(raw))
        for run in _B64_RUN.findall(raw):
            for dec in _b64_decodings(run):
                out += self._raw(dec)
        for run in _HEX_RUN.findall(raw):
            try:
                out += self._raw(binascii.unhexlify(run))
            except (binascii.Error, ValueError):
                continue
        return sorted(set(out), key=len, reverse=True)

    def _raw(self, raw: bytes) -> Iterator[str]:
        for rx in self._res:
            for m in rx.finditer(raw):
                groups = [g for g in m.groups() if g] if rx.groups else []
                best = max(groups, key=len) if groups else b""
                secret = best if len(best) >= 8 else m.group(0)
                if len(secret) >= 8:
                    yield secret.decode("utf-8", "replace")


def _b64_decodings(run: bytes) -> Iterator[bytes]:
    """``run`` decoded as base64 (standard or URL-safe), from each of its first four
    offsets: a run cut out of a longer text may not start on a 4-character boundary."""
    std = run.replace(b"-", b"+").replace(b"_", b"/").rstrip(b"=")
    for k in range(4):
        part = std[k:]
        part = part[:len(part) - len(part) % 4]
        if len(part) < MIN_ENCODED - 4:
            return
        try:
            yield base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            continue
