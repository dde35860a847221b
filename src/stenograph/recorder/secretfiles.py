"""Secrets in workspace files: never copied into a snapshot as they are.

A snapshot copies the workspace into the blob store, and from there into every ``.steno``
people pass around. Two kinds of file content are redacted on the way in:

* **secret files**, by name (``SECRET_FILES``, a set a person would choose: ``.env``,
  keys, credentials, kube and docker configs...): every value is masked. A line
  ``NAME=value`` / ``name: value`` / ``"name": "value"`` keeps its name, its separators and
  its length, the value's characters become ``*``; a line with no such shape (the body
  of a PEM block) has every character but whitespace and punctuation masked.
* **any other text file**, by content: each value in a known key's shape
  (``keyshapes.py``, the maintained rule set) and each high-entropy value assigned to a
  secret-sounding name (``*_SECRET*``, ``*PASSWORD*``, ``*_TOKEN*``, ``*API_KEY*``...) is
  masked the same way. Binary files and files over ``SCAN_MAX`` are not scanned.

Masking keeps the file's length, so sizes and line numbers stay what they were. The
entry of a redacted file in the manifest says so (``Secret``: why, how many values, and a
salted scrypt digest of the real bytes -- slow to guess from, and enough for a replay to
tell whether the file it finds in the live workspace is the one recorded). A replay serves
a redacted file from the live workspace when the path exists there (as a redacted
environment variable takes the replaying environment's value), else the masked bytes.

Names can be added or removed in ``.stenoignore`` (``secret: GLOB`` / ``!secret: GLOB``)
and by ``--workspace-secret`` / ``--workspace-not-secret``.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.keyshapes import KeyShapes

SECRET_FILES: tuple[str, ...] = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".netrc", "_netrc", ".npmrc",
    ".pypirc", ".pgpass", ".git-credentials", ".aws/credentials", ".aws/config",
    "credentials.json", "service-account*.json", "*-credentials.json", ".kube/config",
    "kubeconfig", "*.kubeconfig", ".docker/config.json", "secrets.yaml", "secrets.yml",
    "secrets.json", "secrets.toml", ".secrets.toml",
)
NOT_SECRET: tuple[str, ...] = ("*.pub", "*.example", "*.sample", "*.template", "*.dist",
                               ".env.example", ".env.sample", ".env.template")
"""Names the set above would take that hold no secret by convention (public keys, the
examples a project commits); still scanned by content."""

SCAN_MAX = 4 << 20
"""Files bigger than this are stored as they are, not scanned (say so in the docs)."""

NAME_WORDS = (b"secret", b"passw", b"pwd", b"token", b"api_key", b"apikey", b"api-key",
              b"access_key", b"accesskey", b"private_key", b"credential", b"auth_key")
"""What a secret-sounding name contains (lower case): only lines holding one are matched
against ``_ASSIGN``, so a file is one C-speed ``find`` per word unless it names one."""
SECRET_NAME = re.compile(
    rb"(?i)(?:secret|passw(?:or)?d|pwd|token|api[_-]?key|access[_-]?key|private[_-]?key"
    rb"|client[_-]?secret|credential|auth[_-]?key)")
BENIGN = re.compile(rb"(?i)tokens|token[_-]?(?:limit|count|per|type|url|endpoint|file|path)"
                    rb"|tokeni[sz]|secret[_-]?(?:name|file|path|ref)|password[_-]?(?:file|hash"
                    rb"|prompt|field)")
_ASSIGN = re.compile(
    rb"""(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{1,80})["']?[ \t]*(?:=|:=|:|=>)[ \t]*"""
    rb"""(?:"(?P<dq>[^"\n]{8,400})"|'(?P<sq>[^'\n]{8,400})'|(?P<bare>[^\s"'#,;}\]]{8,400}))""")
MIN_ENTROPY = 3.0
"""Bits per character a value under a secret name needs to count as a secret
(``changeme`` and ``password`` do not; generated keys and real passwords do)."""
_NOT_A_VALUE = frozenset(b" \t()[]<>{}`")
"""A value with one of these is code or prose (``re.compile(...)``, ``list[str]``), not a
credential."""
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z_.]*")
"""A dotted name without digits (``self.input_tokens``, ``parts.password``): code."""
_LINE = re.compile(rb"""^(?P<lead>\s*["']?[A-Za-z0-9_.\-/:@ ]{1,120}?["']?\s*(?:=|:)\s*)"""
                   rb"""(?P<value>.*?)(?P<tail>[\s,]*)$""")
_KEEP = frozenset(b" \t\r\n\"',:;=[]{}()")


@dataclass(frozen=True)
class Masked:
    """A text with its secrets masked: the masked bytes, how many values were masked, and
    the values themselves (the hooks learn them: a tool that reads the file and sends it
    to the model must not put them in the log either)."""

    data: bytes
    hits: int
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Secret:
    """What a manifest entry says of a redacted file."""

    why: str  # "file" (by name) or "content" (values found in it)
    hits: int
    salt: str
    digest: str

    def to_wire(self) -> dict[str, Any]:
        return {"why": self.why, "hits": self.hits, "salt": self.salt, "digest": self.digest}

    @classmethod
    def from_wire(cls, w: Any) -> Secret | None:
        if not isinstance(w, dict) or not isinstance(w.get("digest"), str):
            return None
        return cls(str(w.get("why")), int(w.get("hits") or 0), str(w.get("salt") or ""),
                   str(w["digest"]))

    def matches(self, data: bytes) -> bool:
        """Are ``data`` the bytes this entry was taken from?"""
        return digest(data, bytes.fromhex(self.salt), self.why) == self.digest


def digest(data: bytes, salt: bytes, why: str) -> str:
    """A salted digest a replay can check a file against. A secret file (by name) may
    hold short, guessable values (a database password): scrypt, so a reader of the
    recording cannot cheaply try guesses (about 30 ms each here). Values found by
    content are long random keys by construction: a salted sha256 is enough, and keeps
    a workspace of many such files cheap to snapshot."""
    if why == "file":
        return hashlib.scrypt(data, salt=salt, n=1 << 14, r=8, p=1, dklen=16).hex()
    return hashlib.sha256(salt + data).hexdigest()[:32]


@dataclass(frozen=True)
class SecretRules:
    """Which files are secret by name, and the key shapes every text file is scanned
    for."""

    names: tuple[str, ...] = SECRET_FILES
    not_names: tuple[str, ...] = NOT_SECRET
    shapes: KeyShapes | None = None

    def with_lines(self, lines: list[str]) -> SecretRules:
        """These rules plus ``secret: GLOB`` / ``!secret: GLOB`` lines (``.stenoignore``)."""
        add = tuple(ln.split(":", 1)[1].strip() for ln in lines
                    if ln.startswith("secret:") and ln.split(":", 1)[1].strip())
        drop = tuple(ln.split(":", 1)[1].strip() for ln in lines
                     if ln.startswith("!secret:") and ln.split(":", 1)[1].strip())
        return SecretRules(self.names + add, self.not_names + drop, self.shapes)

    def with_file(self, root: str) -> SecretRules:
        """These rules plus the ``secret:`` lines of the root's ``.stenoignore``."""
        try:
            with open(os.path.join(root, ".stenoignore"), errors="replace") as f:
                lines = [ln.strip() for ln in f]
        except OSError:
            return self
        return self.with_lines(lines)

    def to_body(self) -> dict[str, Any]:
        return {"secret": list(self.names), "not_secret": list(self.not_names)}

    def secret_file(self, rel: str) -> bool:
        return _match(rel, self.names) and not _match(rel, self.not_names)

    def mask(self, rel: str, data: bytes) -> Masked | None:
        """``data`` with its secrets masked; None: nothing to mask."""
        whole = self.secret_file(rel)
        if not whole and (len(data) > SCAN_MAX or b"\0" in data[:8192]):
            return None
        masked = mask_file(data) if whole else mask_values(data, self.shapes)
        return masked if whole or masked.hits else None

    def redact(self, rel: str, data: bytes) -> tuple[Masked, Secret] | None:
        """``data`` masked, and what the entry says; None: nothing to redact (the bytes
        go in as they are)."""
        masked = self.mask(rel, data)
        if masked is None:
            return None
        salt = os.urandom(16)
        why = "file" if self.secret_file(rel) else "content"
        return masked, Secret(why, masked.hits, salt.hex(), digest(data, salt, why))


def _named_lines(data: bytes) -> list[tuple[int, int]]:
    """The (start, end) of every line that holds a word of ``NAME_WORDS``, in order."""
    low = data.lower()
    spans: set[tuple[int, int]] = set()
    for word in NAME_WORDS:
        at = low.find(word)
        while at >= 0:
            start = low.rfind(b"\n", 0, at) + 1
            end = low.find(b"\n", at)
            end = len(low) if end < 0 else end
            spans.add((start, end))
            at = low.find(word, end)
    return sorted(spans)


@functools.lru_cache(maxsize=64)
def _globs(globs: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Globs as two regexes: those matched against a file's name, and those with a ``/``
    matched against its path (anywhere below the root)."""
    names = [fnmatch.translate(g) for g in globs if "/" not in g] or ["(?!)"]
    paths = [fnmatch.translate(f"*/{g}") for g in globs if "/" in g]
    paths += [fnmatch.translate(g) for g in globs if "/" in g]
    return re.compile("|".join(names)), re.compile("|".join(paths or ["(?!)"]))


def _match(rel: str, globs: tuple[str, ...]) -> bool:
    by_name, by_path = _globs(globs)
    return bool(by_name.match(rel.rsplit("/", 1)[-1]) or by_path.match(rel))


def _masked(chunk: bytes) -> bytes:
    return bytes(c if c in _KEEP else 0x2A for c in chunk)


def mask_file(data: bytes) -> Masked:
    """A secret file, every value masked (see the module docstring): names kept."""
    out, hits = [], 0
    values: list[bytes] = []
    for line in data.splitlines(keepends=True):
        body = line.rstrip(b"\r\n")
        end = line[len(body):]
        if not body.strip() or body.lstrip().startswith((b"#", b";", b"-----BEGIN",
                                                         b"-----END", b"[")):
            out.append(line)
            continue
        m = _LINE.match(body)
        if m and b"://" not in m.group("lead")[-4:]:
            out.append(m.group("lead") + _masked(m.group("value")) + m.group("tail") + end)
            values.append(m.group("value").strip(b"\"' "))
        else:
            out.append(_masked(body) + end)
            values += body.split()
        hits += 1
    return Masked(b"".join(out), hits, _texts(values))


def _texts(values: list[bytes]) -> tuple[str, ...]:
    return tuple(sorted({v.decode("utf-8", "replace") for v in values if v}))


def entropy(value: bytes) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def _credential(value: bytes) -> bool:
    """Could ``value``, assigned to a secret-sounding name, be the secret itself? High
    entropy, no whitespace or brackets, not a variable reference or a dotted name."""
    return (entropy(value) >= MIN_ENTROPY and not value.startswith(b"$")
            and not any(c in _NOT_A_VALUE for c in value)
            and not _IDENTIFIER.fullmatch(value))


def mask_values(data: bytes, shapes: KeyShapes | None) -> Masked:
    """Any text: values in a known key's shape, and high-entropy values assigned to a
    secret-sounding name, masked in place."""
    spans: list[tuple[int, int]] = []
    if shapes:
        for secret in shapes.found_raw(data):
            raw = secret.encode()
            at = data.find(raw)
            while at >= 0:
                spans.append((at, at + len(raw)))
                at = data.find(raw, at + len(raw))
    for start, end in _named_lines(data):
        for m in _ASSIGN.finditer(data, start, end):
            group = "dq" if m.group("dq") else "sq" if m.group("sq") else "bare"
            name, value = m.group("name"), m.group(group)
            if (SECRET_NAME.search(name) and not BENIGN.search(name)
                    and _credential(value)):
                spans.append(m.span(group))
    if not spans:
        return Masked(data, 0)
    buf = bytearray(data)
    spans.sort()
    hits, last = 0, -1
    values = []
    for a, b in spans:
        if b <= last:
            continue
        a = max(a, last)
        values.append(data[a:b])
        buf[a:b] = _masked(bytes(buf[a:b]))
        hits += 1
        last = b
    return Masked(bytes(buf), hits, _texts(values))


VALUES_FILE = "secret-values.json"
"""The values masked in the workspace's files, for the hooks to learn (beside the key
shapes: ``keyshapes.hook_path``'s directory). Written with mode 0600 into the run's own
private directory, removed with it."""


def write_values(values: set[str], directory: str | os.PathLike[str]) -> None:
    import json

    path = os.path.join(directory, VALUES_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(sorted(values), f)


def read_values(directory: str | None) -> list[str]:
    import json

    if not directory:
        return []
    try:
        with open(os.path.join(directory, VALUES_FILE)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return []
    return [str(v) for v in doc] if isinstance(doc, list) else []


def recorded_secrets(started: Mapping[str, Any], shapes: KeyShapes | None) -> SecretRules:
    """The secret-file rules a recording was made with (its own names, its key shapes),
    for the snapshots a resume takes of the same workspace."""
    ws = started.get("workspace") or {}
    names, not_names = ws.get("secret"), ws.get("not_secret")
    if not isinstance(names, list) or not isinstance(not_names, list):
        return SecretRules(shapes=shapes)  # an older recording: today's defaults
    return SecretRules(tuple(str(n) for n in names), tuple(str(n) for n in not_names),
                       shapes)
