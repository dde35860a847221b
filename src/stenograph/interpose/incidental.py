"""Incidental values inside requests: what build replay does not count as a change.

A new build reads clocks and entropy a different number of times, so a timestamp or a
random id it puts into a prompt or a tool argument is not the one the recording holds,
even when the build's behaviour is the same. Build replay compares requests with such
values *masked*, and only those that provably came from the tape:

* In the **recorded** request, a token is masked only if it is the rendering of a value
  the recorded run read from an incidental channel: a date or time (ISO 8601, ctime,
  RFC 2822, epoch seconds or milliseconds) within a second of a wall-clock value on the
  recording's clock streams (a naive time: in any UTC offset; a bare ``HH:MM:SS``: that
  time of day in UTC or this machine's offset), a uuid whose random part,
  or a hex string whose bytes, appear in the recording's entropy streams, a version-1
  uuid whose timestamp is such a time.
* In the **new** request, a token of the same kind is masked when it is plausible for the
  build replay: its clocks are served from the recording or continue from it, so a time
  must fall within a day of the recorded ones; a random id has only its shape to show.

Two requests match when their masked forms are equal: a constant id, a date the run did
not read (a fixed date in a template) or a time in a new format is compared as it is.
What this does not see: values transformed before they reach the request (a hash of a
timestamp, ``random.randint``'s output, a duration computed from two clock reads).
"""

from __future__ import annotations

import bisect
import re
import struct
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

CH_CLOCK, CH_ENTROPY = 1, 2
"""steno_shim.h channel numbers (tests/test_shim_constants.py checks them)."""

_CLOCKREC = struct.Struct("<iiqq")
_NAIVE_SLACK = 14 * 3600.0
_NEW_SLACK = 86400.0

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_H, _NH = r"(?<![0-9a-fA-F])", r"(?![0-9a-fA-F])"
_D, _ND = r"(?<!\d)(?<!\d\.)", r"(?![\d])"
_TOKENS = re.compile(
    rf"(?P<uuid>{_H}[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-"
    rf"[0-9a-fA-F]{{12}}{_NH})"
    rf"|(?P<hex>{_H}[0-9a-fA-F]{{16,}}{_NH})"  # before the numbers: a hex id may start with digits
    rf"|(?P<iso>(?<!\d)\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:\.\d{{1,9}})?)?)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?(?!\d))"
    rf"|(?P<rfc>{_DAY}, \d{{1,2}} {_MONTH} \d{{4}} \d{{2}}:\d{{2}}:\d{{2}} "
    r"(?:GMT|UTC|[+-]\d{4}))"
    rf"|(?P<ctime>{_DAY} {_MONTH} [ \d]\d \d{{2}}:\d{{2}}:\d{{2}} \d{{4}}{_ND})"
    rf"|(?P<epoch_ms>{_D}1\d{{12}}{_ND})"
    rf"|(?P<epoch>{_D}1\d{{9}}(?:\.\d{{1,9}})?{_ND})"
    r"|(?P<tod>(?<!\d)(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?!\d))"
)


@dataclass
class Incidentals:
    """The wall-clock values and entropy bytes a run read (from its tape)."""

    times: list[float] = field(default_factory=list)
    entropy: bytes = b""

    @classmethod
    def from_tape(cls, tape_dir: str | Path) -> Incidentals:
        """Every process's clock and entropy streams in a prepared tape directory."""
        from stenograph.recorder.tape import iter_records

        times: list[float] = []
        chunks: list[bytes] = []
        root = Path(tape_dir)
        for path in sorted(root.glob("*/*.clock")):
            for _ch, op, payload in iter_records(path.read_bytes()):
                if len(payload) < _CLOCKREC.size:
                    continue
                arg, rc, a, b = _CLOCKREC.unpack_from(payload)
                if rc:
                    continue
                if op == 1 and arg == 0:
                    times.append(a + b / 1e9)
                elif op == 2:
                    times.append(a + b / 1e6)
                elif op == 3 or (op == 4 and arg == 1):
                    times.append(float(a) + (b / 1e9 if op == 4 else 0.0))
        for path in sorted(root.glob("*/*.entropy")):
            for _ch, op, payload in iter_records(path.read_bytes()):
                if op in (1, 4) and len(payload) >= 16:
                    (rc,) = struct.unpack_from("<i", payload, 8)
                    chunks.append(payload[16:16 + max(rc, 0)])
                elif op in (2, 3) and len(payload) >= 8:
                    size, rc = struct.unpack_from("<Ii", payload)
                    chunks.append(payload[8:8 + (size if op == 2 and rc == 0 else max(rc, 0))])
        times.sort()
        return cls(times, b"".join(chunks))

    def read_time(self, lo: float, hi: float) -> bool:
        """Did the run read a wall-clock value in [lo, hi]?"""
        i = bisect.bisect_left(self.times, lo)
        return i < len(self.times) and self.times[i] <= hi

    def near(self, lo: float, hi: float) -> bool:
        """Is [lo, hi] within a day of the run's wall clock (a build replay's own reads)?"""
        if not self.times:
            return False
        return hi >= self.times[0] - _NEW_SLACK and lo <= self.times[-1] + _NEW_SLACK


def _interval(kind: str, text: str) -> tuple[float, float] | None:
    """The UTC seconds a time token can stand for (its precision; a naive one in any
    offset), or None if it is not a valid time."""
    try:
        if kind == "epoch":
            v = float(text)
            return v - 1, v + 1
        if kind == "epoch_ms":
            v = int(text) / 1000
            return v - 1, v + 1
        if kind == "rfc":
            dt = parsedate_to_datetime(text)
            naive, width = False, 1.0
        elif kind == "ctime":
            dt = datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")
            naive, width = True, 1.0
        else:
            s = text.replace("Z", "+00:00")
            dt = datetime.fromisoformat(s)
            naive = dt.tzinfo is None
            width = 86400.0 if len(text) == 10 else 60.0 if len(s.split("+")[0]) <= 16 else 1.0
    except (ValueError, TypeError, OverflowError, IndexError):
        return None
    if naive:
        dt = dt.replace(tzinfo=UTC)
    lo = dt.timestamp()
    hi = lo + width
    if naive:
        return lo - _NAIVE_SLACK, hi + _NAIVE_SLACK
    return lo - 1, hi


def _tod(text: str) -> float:
    h, m, rest = text.split(":")
    return int(h) * 3600 + int(m) * 60 + float(rest)


def _read_tod(secs: float, inc: Incidentals) -> bool:
    """Did the run read a wall-clock value with this time of day (UTC, or this machine's
    offset), to the second?"""
    offsets = {0, time.localtime().tm_gmtoff}
    for t in inc.times:
        for off in offsets:
            d = abs((t + off) % 86400 - secs)
            if min(d, 86400 - d) <= 1.0:
                return True
    return False


def _uuid1_time(text: str) -> float | None:
    u = uuid.UUID(text)
    if u.version != 1:
        return None
    return (u.time - 0x01B21DD213814000) / 1e7


def _recorded_token(kind: str, text: str, inc: Incidentals) -> bool:
    """Is this token in a recorded request a value the recorded run read?"""
    if kind == "uuid":
        t = _uuid1_time(text)
        if t is not None:
            return inc.read_time(t - 1, t + 1)
        return bytes.fromhex(text.replace("-", ""))[:6] in inc.entropy
    if kind == "hex":
        raw = bytes.fromhex(text[: len(text) // 2 * 2])
        return raw[:8] in inc.entropy
    if kind == "tod":
        return _read_tod(_tod(text), inc)
    span = _interval(kind, text)
    return span is not None and inc.read_time(*span)


def _new_token(kind: str, text: str, inc: Incidentals) -> bool:
    """Is this token in the build's request plausibly an incidental value of its own?"""
    if kind == "uuid":
        t = _uuid1_time(text)
        return t is None or inc.near(t, t)
    if kind in ("hex", "tod"):
        return True
    span = _interval(kind, text)
    return span is not None and inc.near(*span)


_KIND_OF = {"iso": "time", "rfc": "time", "ctime": "time", "epoch": "time",
            "epoch_ms": "time", "uuid": "uuid", "hex": "hex", "tod": "time"}


def mask(text: str, inc: Incidentals, *, recorded: bool) -> tuple[str, int]:
    """``text`` with its incidental values replaced by ``«kind»``, and how many."""
    check = _recorded_token if recorded else _new_token
    out: list[str] = []
    at = n = 0
    for m in _TOKENS.finditer(text):
        kind = m.lastgroup or ""
        if check(kind, m.group(), inc):
            out.append(text[at:m.start()])
            out.append(f"«{_KIND_OF[kind]}»")
            at = m.end()
            n += 1
    out.append(text[at:])
    return "".join(out), n


def _pieces(text: str) -> list[tuple[str, str]]:
    """``text`` as alternating ("", literal) and (kind, token) pieces."""
    out: list[tuple[str, str]] = []
    at = 0
    for m in _TOKENS.finditer(text):
        out.append(("", text[at:m.start()]))
        out.append((m.lastgroup or "", m.group()))
        at = m.end()
    out.append(("", text[at:]))
    return out


def differences(recorded: str, asked: str, inc: Incidentals) -> int | None:
    """How many tokens of ``asked`` are the build's own incidental values in place of
    the recorded run's, if that is the only way the two differ; else None. Tokens are
    compared in place: the text between them must be equal, and a token that differs
    must be, in the recorded request, a value the recorded run read and, in the new one,
    a plausible value of the same kind and format."""
    if recorded == asked:
        return 0
    a, b = _pieces(recorded), _pieces(asked)
    if len(a) != len(b):
        return None
    n = 0
    for (ka, ta), (kb, tb) in zip(a, b, strict=True):
        if ta == tb:
            continue
        if not ka or ka != kb or not _recorded_token(ka, ta, inc) \
                or not _new_token(kb, tb, inc):
            return None
        n += 1
    return n


def request_text(method: str, url: str, body: bytes) -> str:
    """A request as build replay compares it: method, canonical URL and body."""
    from stenograph.interpose.fingerprint import canonical_body, canonical_url

    return "\0".join([method.upper(), canonical_url(url),
                      canonical_body(body).decode("utf-8", "replace")])


def incidental_only(recorded: object, asked: object, inc: Incidentals) -> bool:
    """Do two values differ only by incidental values (so a diff need not show them)?"""
    if not isinstance(recorded, str) or not isinstance(asked, str) or recorded == asked:
        return False
    return bool(differences(recorded, asked, inc))
