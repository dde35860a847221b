"""Redaction cost on a 64 KiB body: ns per call, before/after the name-and-encoding rules.

Four figures per body, median of ``--reps`` rounds of ``--n`` calls each:

* ``baseline``: one ``bytes.replace`` of one known secret (the least any scrub costs);
* ``before``: the scrub as it was (each remembered secret, raw only);
* ``after``: ``RedactionRules.scrub`` (each secret raw, hex, URL-encoded, base64 at three
  alignments in two alphabets);
* ``path before`` / ``path after``: what recording one request body costs, old and
  new: the JSON parse, then the scrub when the body is described, spilled and committed
  (three scrubs before; one now, the later two see the same object already clean).

Bodies: a JSON chat request (no secret in it, the common case) and an opaque 64 KiB
body that carries the secret twice. ``--secrets`` is how many secrets are remembered
(environment, headers); a typical agent has one to three.

    python bench/redact.py [--json] [-n 200] [--reps 5] [--secrets 3]

A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from stenograph.interpose.redact import REDACTED, RedactionRules

SIZE = 64 << 10


def _secrets(n: int) -> list[str]:
    return [f"sk-test-{i:02d}-0123456789abcdefABCDEF" for i in range(n)]


def _bodies(secret: str) -> dict[str, bytes]:
    msg = {"role": "user", "content": "lorem ipsum dolor sit amet " * 40}
    doc = {"model": "gpt-x", "max_tokens": 512, "messages": []}
    while len(json.dumps(doc)) + len(json.dumps(msg)) < SIZE:
        doc["messages"].append(msg)
    doc["user"] = ""
    doc["user"] = "u" * (SIZE - len(json.dumps(doc)))
    half = SIZE // 2 - len(secret)
    opaque = b"x" * half + secret.encode() + b"y" * half + secret.encode()
    return {"json chat request": json.dumps(doc).encode(),
            "opaque, secret inside": opaque[:SIZE]}


def _before(seen: set[str]) -> Callable[[bytes], bytes]:
    red = REDACTED.encode()

    def scrub(value: bytes) -> bytes:
        for s in seen:
            b = s.encode()
            if b in value:
                value = value.replace(b, red)
        return value
    return scrub


def _path_before(seen: set[str]) -> Callable[[bytes], bytes]:
    scrub = _before(seen)

    def path(d: bytes) -> bytes:
        if d[:1] == b"{":
            json.loads(d)
        return scrub(scrub(d))
    return path


def _time(fn: Callable[[bytes], object], data: bytes, n: int, reps: int) -> float:
    rounds = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn(data)
        rounds.append((time.perf_counter_ns() - t) / n)
    return statistics.median(rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--secrets", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    secrets = _secrets(a.secrets)
    rules = RedactionRules.from_env({}, [])
    for s in secrets:
        rules.learn(s)
    first = secrets[0].encode()
    red = REDACTED.encode()
    out: dict[str, dict[str, float]] = {}
    for name, data in _bodies(secrets[0]).items():
        def fresh(d: bytes) -> bytes:
            rules._clean.clear()  # the memo of clean bodies would skip the scan
            return rules.scrub(d)

        def path_after(d: bytes) -> bytes:
            rules._clean.clear()
            return rules.scrub(rules.scrub(rules.body(d, "application/json")))

        out[name] = {
            "baseline": _time(lambda d: d.replace(first, red), data, a.n, a.reps),
            "before": _time(_before(set(secrets)), data, a.n, a.reps),
            "after": _time(fresh, data, a.n, a.reps),
            "path before": _time(_path_before(set(secrets)), data, a.n, a.reps),
            "path after": _time(path_after, data, a.n, a.reps),
        }
    if a.json:
        print(json.dumps({"bytes": SIZE, "secrets": a.secrets, "ns_per_call": out}))
        return
    print(f"{SIZE} byte body, {a.secrets} remembered secret(s); ns per call (median)")
    for name, f in out.items():
        print(f"  {name}: baseline {f['baseline']:,.0f}  before {f['before']:,.0f}  "
              f"after {f['after']:,.0f} ({f['after'] / f['before']:.1f}x before); "
              f"request path before {f['path before']:,.0f}  after {f['path after']:,.0f}")


if __name__ == "__main__":
    main()
