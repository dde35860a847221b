"""A key of the common ``sk-`` form (``sk-`` and 20 or more key characters, which no
provider's own rule knows) never reaches the log, wherever only its shape gives it away.

One program, recorded under the shim, sends a distinct such key in each placement: in a
URL path, base64- and hex-encoded in JSON bodies (``requests``: the hooks), as a bare
argument of a child (``ProcessStarted``), in the URL and the encoded body of a ``curl``
POST (the socket tape: the intent's target, its first bytes, its ``by``, the send's
head) and in the path of a ``urllib`` GET (the socket tape alone: the send's head). The
program derives its keys at run time, so its source (snapshotted with the workspace)
does not carry them, and the server answers without echoing anything. Every byte of the
store and of the ``.steno`` file is searched for each key, raw and encoded, and ``log
scan`` searches the decoded events (tape chunks inflated); the recording then replays
bit for bit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgpack
import pytest

from stenograph.recorder.chunks import chunk_data
from stenograph.recorder.keyshapes import KeyShapes, maintained
from stenograph.recorder.trajfile import read_trajectory

CLI = [sys.executable, "-m", "stenograph"]
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def key(i: int, n: int = 20) -> str:
    """Placement ``i``'s key: ``sk-`` and ``n`` key characters (the program computes the
    same)."""
    d = hashlib.sha256(f"steno-sk-{i}".encode()).digest() * 2
    return "sk-" + "".join(ALPHABET[b % len(ALPHABET)] for b in d[:n])


PLACEMENTS: dict[str, str] = {
    "URL path only (requests)": key(1),
    "base64 in a JSON body (requests)": key(2),
    "hex in a JSON body (requests)": key(3, 27),
    "bare argument of a child (ProcessStarted)": key(4),
    "URL path of a curl POST (socket tape intent, by, send head)": key(5),
    "base64 in a curl POST's JSON body (socket tape intent arguments)": key(6, 32),
    "URL path of a urllib GET (socket tape send head only)": key(7),
}

PROGRAM = textwrap.dedent("""
    import base64, hashlib, json, subprocess, sys, urllib.request
    import requests

    ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

    def K(i, n=20):
        d = hashlib.sha256(f"steno-sk-{i}".encode()).digest() * 2
        return "sk-" + "".join(ALPHABET[b % len(ALPHABET)] for b in d[:n])

    base = sys.argv[1]
    s = requests.Session()
    s.get(base + "/k/" + K(1) + "/x", timeout=30).raise_for_status()
    s.post(base + "/b64", json={"blob": base64.b64encode(K(2).encode()).decode()},
           timeout=30).raise_for_status()
    s.post(base + "/hex", json={"data": K(3, 27).encode().hex()}, timeout=30).raise_for_status()
    subprocess.run([sys.executable, "-c", "import sys; print(len(sys.argv))", K(4)],
                   check=True)
    body = json.dumps({"blob": base64.b64encode(K(6, 32).encode()).decode()})
    out = subprocess.run(["curl", "-s", "-X", "POST", "-H", "Content-Type: application/json",
                          "-d", body, base + "/pay/" + K(5)], capture_output=True, text=True)
    print("curl", out.returncode, out.stdout)
    with urllib.request.urlopen(base + "/u/" + K(7), timeout=10) as r:
        print("urllib", r.read().decode())
    print("done")
""")


class _Handler(BaseHTTPRequestHandler):
    """Answers every request the same, echoing nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._answer()

    def _answer(self) -> None:
        out = b'{"ok": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@dataclass
class Recording:
    steno: Path
    store: Path
    record: subprocess.CompletedProcess[str]
    replay: subprocess.CompletedProcess[str]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("STENO_") and k != "LD_PRELOAD" and "proxy" not in k.lower()}


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    if shutil.which("curl") is None:
        pytest.skip("no curl")
    tmp = tmp_path_factory.mktemp("sk")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    (tmp / "prog.py").write_text(PROGRAM)
    steno, store = tmp / "run.steno", tmp / "store"
    argv = [sys.executable, str(tmp / "prog.py"), f"http://127.0.0.1:{srv.server_address[1]}"]
    try:
        rec = subprocess.run([*CLI, "record", "--store", str(store), "-o", str(steno), "--",
                              *argv], cwd=tmp, env=_env(), capture_output=True, text=True,
                             timeout=180)
    finally:
        srv.shutdown()
        srv.server_close()
    assert rec.returncode == 0, rec.stderr[-3000:]
    rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp, env=_env(),
                         capture_output=True, text=True, timeout=180)
    yield Recording(steno, store, rec, rep)


def encoded(value: str) -> dict[str, bytes]:
    """``value`` raw, hex (both cases) and the part of its base64 (both alphabets) that
    depends on it alone, at each byte alignment."""
    raw = value.encode()
    out = {"raw": raw, "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode()}
    for k in range(3):
        start, end = {0: 0, 1: 2, 2: 3}[k], (8 * (k + len(raw))) // 6
        out[f"base64@{k}"] = base64.b64encode(b"\0" * k + raw)[start:end]
        out[f"urlsafe-base64@{k}"] = base64.urlsafe_b64encode(b"\0" * k + raw)[start:end]
    return out


def _files(rec: Recording) -> dict[str, bytes]:
    """Every file of the store and the ``.steno`` file, byte for byte; and each event of
    the file decoded, tape chunks inflated."""
    out = {str(p): p.read_bytes() for p in sorted(rec.store.rglob("*")) if p.is_file()}
    out[str(rec.steno)] = rec.steno.read_bytes()
    for i, ev in enumerate(read_trajectory(rec.steno).events):
        out[f"event {i} {ev.kind}"] = msgpack.packb(ev.body, use_bin_type=True)
        if ev.kind == "TapeChunk":
            out[f"event {i} records"] = chunk_data(ev.body)
    return out


def test_the_keys_are_only_known_by_their_shape() -> None:
    """No provider's rule would have found them; the ``sk-`` rule does, raw and encoded."""
    shapes = KeyShapes(maintained())
    for k in PLACEMENTS.values():
        assert [s.name for s in shapes.shapes
                if s.name != "sk- key" and KeyShapes([s]).found(k)] == [], k
        assert k in shapes.found(f"/v1/{k}/x")
        assert k in shapes.found(json.dumps({"b": base64.b64encode(k.encode()).decode()}))
        assert k in shapes.found(json.dumps({"h": k.encode().hex()}))
    for word in ("sk-learn-compatible-estimator", "task-2024ABCDEFGHIJKLMNOPQRS",
                 "risk-assessment-report-final-v2"):
        assert shapes.found(word) == [], word


def test_the_program_ran_and_replays_bit_for_bit(recording: Recording) -> None:
    assert "curl 0" in recording.record.stdout and "done" in recording.record.stdout
    assert recording.replay.returncode == 0, recording.replay.stderr[-3000:]
    assert recording.replay.stdout == recording.record.stdout
    assert "bit-identical" in recording.replay.stderr


def test_every_place_was_recorded_redacted(recording: Recording) -> None:
    """The places the keys went through are in the log, each with ``<redacted>``."""
    events = read_trajectory(recording.steno).events
    started = [str(e.body["command"]) for e in events if e.kind == "ProcessStarted"]
    assert any("-c import sys" in c and c.endswith("<redacted>") for c in started), started
    assert any(c.startswith("curl ") and "/pay/<redacted>" in c for c in started), started
    intents = [e.body for e in events if e.kind == "ToolIntent" and e.body.get("channel") == "net"]
    (pay,) = [b for b in intents if "/pay/" in str(b.get("target"))]
    assert str(pay["target"]).endswith("/pay/<redacted>"), pay
    assert "<redacted>" in str(pay.get("arguments")), pay
    assert "/pay/<redacted>" in str(pay.get("by")), pay
    urls = [str(e.body["request"]["url"]) for e in events if e.kind == "Exchange"]
    assert any(u.endswith("/k/<redacted>/x") for u in urls), urls
    heads = b"".join(chunk_data(e.body) for e in events if e.kind == "TapeChunk")
    assert b"GET /u/" + b"*" * len(PLACEMENTS[
        "URL path of a urllib GET (socket tape send head only)"]) in heads


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_no_encoding_of_the_key_reaches_disk(recording: Recording, name: str) -> None:
    value = PLACEMENTS[name]
    leaks = [f"{how} in {where}" for where, data in _files(recording).items()
             for how, enc in encoded(value).items() if enc in data]
    assert not leaks, f"{name}: {leaks[:5]}"


def test_log_scan_finds_no_key(recording: Recording) -> None:
    flags = [a for v in PLACEMENTS.values() for a in ("--secret", v)]
    for path in (recording.steno, recording.store):
        p = subprocess.run([*CLI, "log", "scan", str(path), *flags], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("not found"), p.stdout + p.stderr


def test_a_send_head_is_masked_in_place() -> None:
    """The socket tape's send heads keep their layout: each secret overwritten by as many
    ``*``, a key cut off at the head's end too; a chunk without a send is the same
    object, and the digest (the real bytes') is untouched."""
    import struct

    from stenograph.interpose.redact import RedactionRules
    from stenograph.recorder.tapesecrets import masked_sends

    k = key(9, 30)
    rules = RedactionRules.from_env({}, ["prog", k], KeyShapes(maintained()))
    clock = struct.pack("<BBHI", 1, 1, 0, 24) + bytes(24)
    chunk = clock * 3
    assert masked_sends(chunk, rules.mask) is chunk

    def send(head: bytes) -> bytes:
        payload = struct.pack("<IIiQII", 3, 900, 900, 0xFEEDFACE, len(head), 0) + head
        return struct.pack("<BBHI", 10, 2, 0, len(payload)) + payload

    full = b"GET /v1/keys/" + k.encode() + b" HTTP/1.1\r\n"
    cut = (b"POST /a/long/path/to/" + k.encode())[:64 - 20]  # the head ends mid-key
    out = masked_sends(clock + send(full) + send(cut), rules.mask)
    assert len(out) == len(clock + send(full) + send(cut))
    assert k.encode()[:8] not in out and b"\xce\xfa\xed\xfe" in out
    assert b"GET /v1/keys/" + b"*" * len(k) + b" HTTP/1.1" in out
    assert out.endswith(b"POST /a/long/path/to/" + b"*" * (len(cut) - 21))
