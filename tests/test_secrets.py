"""Secrets never reach the disk: 26 placements of a key, one real recording.

One program (``requests`` against a loopback server, under ``stenograph record`` and the
shim) puts a distinct secret in each placement; each parametrized case then searches
every byte of the kept store (segments and blobs), the ``.steno`` file and the decoded
events for that secret raw, hex (both cases), URL-encoded and base64 at each of the
three byte alignments. The program derives its secrets from a seed at run time, so its
own source (which the shim tapes as the interpreter reads it) does not carry them.
The recording is then replayed with the same environment: redaction must leave every
request matching its recording.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, quote_plus

import msgpack
import pytest

from stenograph.recorder.trajfile import read_trajectory

CLI = [sys.executable, "-m", "stenograph"]
MARKER = "PUBLIC-marker-0123456789"


def secret(i: int) -> str:
    """The secret of placement ``i`` (the program computes the same)."""
    return "Zq" + hashlib.sha256(f"steno-placement-{i}".encode()).hexdigest()[:22]


URL_PASSWORD = "Zq+/" + secret(18)[2:] + "=&"


def shaped(i: int) -> str:
    """A key in a provider's shape, for placements 27-33 (the program computes the same):
    no name says it is a secret, only its shape does."""
    s = secret(i)
    return {27: "sk-" + s * 2, 28: "sk-ant-api03-" + s * 2, 29: "ghp_" + (s * 2)[:36],
            30: "github_pat_" + (s * 4)[:82], 31: "xoxb-" + s,
            32: "AKIA" + s[2:18].upper(),
            33: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + s + "In0." + (s * 2)[:43]}[i]

ENV = {
    "SERVICE_TOKEN": secret(12),
    "SIGNING_KEY": secret(16),
    "HMAC_SECRET": secret(17),
    "URL_PASSWORD": URL_PASSWORD,
    "WORKER_SECRET": secret(21),
    "LLM_BEARER": secret(22),
    "DATABASE_URL": f"postgres://app:{secret(23)}@db.invalid:5432/app",
}

PLACEMENTS: dict[str, tuple[int, str]] = {
    "authorization header": (1, secret(1)),
    "x-api-key header": (2, secret(2)),
    "X-Secret-Key header": (3, secret(3)),
    "X-Api-Token header": (4, secret(4)),
    "cookie header": (5, secret(5)),
    "set-cookie response header, sent back": (6, secret(6)),
    "json api_key": (7, secret(7)),
    "json token at depth 4": (8, secret(8)),
    "json auth": (9, secret(9)),
    "query api_key": (10, secret(10)),
    "query auth": (11, secret(11)),
    "url path segment equal to an env secret": (12, secret(12)),
    "url userinfo password": (13, secret(13)),
    "urlencoded form api_key": (14, secret(14)),
    "multipart form api_key": (15, secret(15)),
    "base64 of an env secret in a body": (16, secret(16)),
    "hex of an env secret in a body": (17, secret(17)),
    "url-encoded env secret in a body": (18, URL_PASSWORD),
    "argv --api-key VALUE": (19, secret(19)),
    "argv --token=VALUE": (20, secret(20)),
    "argv element equal to an env secret": (21, secret(21)),
    "env LLM_BEARER": (22, secret(22)),
    "env DATABASE_URL password": (23, secret(23)),
    "token endpoint response": (24, secret(24)),
    "large body spilled to blobs": (25, secret(25)),
    "base64/hex of a key learnt from Authorization": (26, secret(26)),
    "OpenAI-shaped key in a URL path only": (27, shaped(27)),
    "Anthropic-shaped key base64-encoded in a JSON body": (28, shaped(28)),
    "GitHub token hex-encoded in a JSON body": (29, shaped(29)),
    "GitHub fine-grained token in a URL path only": (30, shaped(30)),
    "Slack token base64-encoded in a JSON body": (31, shaped(31)),
    "AWS access key id in a URL path only": (32, shaped(32)),
    "JWT in a JSON body under an innocent name": (33, shaped(33)),
}

PROGRAM = textwrap.dedent("""
    import base64, hashlib, os, sys
    from urllib.parse import quote
    import requests

    def S(i):
        return "Zq" + hashlib.sha256(f"steno-placement-{i}".encode()).hexdigest()[:22]

    def K(i):
        s = S(i)
        return {27: "sk-" + s * 2, 28: "sk-ant-api03-" + s * 2, 29: "ghp_" + (s * 2)[:36],
                30: "github_pat_" + (s * 4)[:82], 31: "xoxb-" + s,
                32: "AKIA" + s[2:18].upper(),
                33: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + s + "In0." + (s * 2)[:43]}[i]

    base, args = sys.argv[1], sys.argv[2:]
    s = requests.Session()
    def go(method, path, **kw):
        r = s.request(method, path if "://" in path else base + path, timeout=30, **kw)
        r.raise_for_status()
        return r
    def b64s(k):
        return " ".join(base64.b64encode(p + k).decode() for p in (b"", b"a", b"ab"))
    text = {"content-type": "text/plain"}

    go("GET", "/h/1", headers={"Authorization": "Bearer " + S(1)})
    go("GET", "/h/2", headers={"X-Api-Key": S(2)})
    go("GET", "/h/3", headers={"X-Secret-Key": S(3)})
    go("GET", "/h/4", headers={"X-Api-Token": S(4)})
    go("GET", "/h/5", headers={"Cookie": "sid=" + S(5)})
    go("GET", "/setcookie/6")
    go("GET", "/after-cookie/6")
    go("POST", "/j/7", json={"api_key": S(7)})
    go("POST", "/j/8", json={"a": {"b": [{"token": S(8)}]}, "max_tokens": 5})
    go("POST", "/j/9", json={"auth": S(9)})
    go("GET", "/q/10", params={"api_key": S(10), "n": "1"})
    go("GET", "/q/11", params={"auth": S(11)})
    go("GET", "/v1/keys/" + os.environ["SERVICE_TOKEN"] + "/info")
    go("GET", base.replace("http://", "http://app:" + S(13) + "@") + "/u/13")
    go("POST", "/f/14", data={"api_key": S(14), "q": "x"})
    go("POST", "/m/15", files={"api_key": (None, S(15)), "q": (None, "x")})
    go("POST", "/b/16", data=b64s(os.environ["SIGNING_KEY"].encode()), headers=text)
    k17 = os.environ["HMAC_SECRET"].encode()
    go("POST", "/b/17", data=k17.hex() + " " + k17.hex().upper(), headers=text)
    go("POST", "/b/18", data="v=" + quote(os.environ["URL_PASSWORD"], safe=""), headers=text)
    go("POST", "/a/19", json={"note": args[args.index("--api-key") + 1]})
    go("GET", "/a/20/" + next(a.split("=", 1)[1] for a in args if a.startswith("--token=")))
    go("POST", "/a/21", json={"note": args[-1]})
    go("GET", "/e/22", headers={"Authorization": "Bearer " + os.environ["LLM_BEARER"]})
    tok = go("POST", "/oauth/token", data={"grant_type": "client_credentials"}).json()
    go("POST", "/t/24", json={"note": tok["access_token"]})
    go("POST", "/big/25", headers={"Authorization": "Bearer " + S(25)},
       json={"note": "x" * 40000 + S(25)})
    k26 = S(26).encode()
    go("POST", "/b/26", headers={"Authorization": "Bearer " + S(26), **text},
       data=b64s(k26) + " " + k26.hex() + " " + k26.hex().upper())
    go("GET", "/k/27/" + K(27) + "/x")
    go("POST", "/k/28", json={"blob": base64.b64encode(K(28).encode()).decode()})
    go("POST", "/k/29", json={"data": K(29).encode().hex()})
    go("GET", "/k/30/" + K(30))
    go("POST", "/k/31", json={"attachment": base64.b64encode(b"cfg: " + K(31).encode()).decode()})
    go("GET", "/k/32/" + K(32))
    go("POST", "/k/33", json={"note": K(33)})
    print("visible", go("GET", "/visible").json()["visible"])
    print("done")
""")


class _Handler(BaseHTTPRequestHandler):
    """Echoes every request (path, headers, body) back, as an unhelpful server does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("content-length") or 0)))

    def _answer(self, body: bytes) -> None:
        extra: list[tuple[str, str]] = []
        if self.path.startswith("/oauth/token"):
            out = json.dumps({"access_token": secret(24), "token_type": "bearer",
                              "expires_in": 3600}).encode()
        elif self.path.startswith("/visible"):
            pad = "y" * 40000  # a large response: spilled to a blob
            out = json.dumps({"visible": MARKER, "pad": pad}).encode()
        else:
            if self.path.startswith("/setcookie"):
                extra.append(("set-cookie", f"sc={secret(6)}; Path=/; HttpOnly"))
            out = json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                              "body": body.decode("latin-1")}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)


@dataclass
class Recording:
    steno: Path
    store: Path
    stdout: str
    replay: subprocess.CompletedProcess[bytes]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STENO_") and k != "LD_PRELOAD"}
    return {**env, **ENV}


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    tmp = tmp_path_factory.mktemp("secrets")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    prog = tmp / "prog.py"
    prog.write_text(PROGRAM)
    steno, store = tmp / "run.steno", tmp / "store"
    argv = [sys.executable, str(prog), f"http://127.0.0.1:{srv.server_address[1]}",
            "--api-key", secret(19), f"--token={secret(20)}", secret(21)]
    try:
        rec = subprocess.run([*CLI, "record", "--store", str(store), "-o", str(steno), "--",
                              *argv], cwd=tmp, env=_env(), capture_output=True, timeout=120)
    finally:
        srv.shutdown()
        srv.server_close()
    assert rec.returncode == 0, rec.stderr.decode(errors="replace")
    rep = subprocess.run([*CLI, "replay", str(steno)], cwd=tmp, env=_env(),
                         capture_output=True, timeout=120)
    yield Recording(steno, store, rec.stdout.decode(), rep)


def encoded(value: str) -> dict[str, bytes]:
    """Every form of ``value`` searched for, computed independently of the code under test:
    for base64, the characters that depend on the value alone, at offsets 0, 1 and 2."""
    raw = value.encode()
    out = {"raw": raw, "hex": raw.hex().encode(), "HEX": raw.hex().upper().encode(),
           "url": quote(value, safe="").encode(), "url+": quote_plus(value).encode()}
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw)
        start = {0: 0, 1: 2, 2: 3}[k]
        end = (8 * (k + len(raw))) // 6
        out[f"base64@{k}"] = enc[start:end]
        out[f"urlsafe-base64@{k}"] = base64.urlsafe_b64encode(b"\0" * k + raw)[start:end]
    return out


def _disk(rec: Recording) -> dict[str, bytes]:
    files = {str(p): p.read_bytes() for p in sorted(rec.store.rglob("*")) if p.is_file()}
    files[str(rec.steno)] = rec.steno.read_bytes()
    for i, ev in enumerate(read_trajectory(rec.steno).events):
        files[f"event {i} {ev.kind}"] = msgpack.packb(ev.body, use_bin_type=True)
    return files


def test_the_program_ran_and_its_recording_replays(recording: Recording) -> None:
    assert "done" in recording.stdout
    assert recording.replay.returncode == 0, recording.replay.stderr.decode(errors="replace")
    assert recording.replay.stdout.decode() == recording.stdout
    assert any((recording.store / "blobs").rglob("*")), "no body was spilled to blobs/"


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_no_encoding_of_the_secret_reaches_disk(recording: Recording, name: str) -> None:
    _, value = PLACEMENTS[name]
    leaks = [f"{how} in {where}" for where, data in _disk(recording).items()
             for how, enc in encoded(value).items() if enc in data]
    assert not leaks, f"{name}: {leaks[:5]}"


def _scan(path: Path, *values: str) -> subprocess.CompletedProcess[str]:
    flags = [a for v in values for a in ("--secret", v)]
    return subprocess.run([*CLI, "log", "scan", str(path), *flags], capture_output=True,
                          text=True, timeout=60)


def test_log_scan_finds_no_secret(recording: Recording) -> None:
    values = [v for _, v in PLACEMENTS.values()]
    for path in (recording.steno, recording.store):
        p = _scan(path, *values)
        assert p.returncode == 0, p.stdout
        assert p.stdout.startswith("not found")


def test_log_scan_finds_a_value_raw_and_encoded(recording: Recording, tmp_path: Path) -> None:
    for path in (recording.steno, recording.store):
        p = _scan(path, MARKER)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "blob " in p.stdout and "(of event " in p.stdout and "raw at" in p.stdout
    body = json.dumps({"b64": base64.b64encode(b"a" + MARKER.encode()).decode(),
                       "hex": MARKER.encode().hex().upper()})
    made = tmp_path / "made"
    subprocess.run([*CLI, "log", "append", str(made), "--traj", "t", "--kind", "Note",
                    "--body", body], check=True, capture_output=True, timeout=60)
    hit = _scan(made, MARKER)
    assert hit.returncode == 1, hit.stdout + hit.stderr
    assert "event 0" in hit.stdout and "encoded as" in hit.stdout
    assert "raw at" not in hit.stdout


def test_names_that_count_or_configure_are_kept() -> None:
    from stenograph.interpose.redact import RedactionRules

    rules = RedactionRules.from_env({"HF_TOKENIZERS_PARALLELISM": "false-but-long-123"}, [])
    assert rules.argv(["p", "--max-tokens", "512", "--tokenizer", "gpt2-large-2024",
                       "--author", "ada-lovelace-1815", "--auth-key", "Zq0123456789"]) == [
        "p", "--max-tokens", "512", "--tokenizer", "gpt2-large-2024",
        "--author", "ada-lovelace-1815", "--auth-key", "<redacted>"]
    body = b'{"max_tokens":5,"author":"bob","session":{"id":7},"k":[{"private_key":"x"}]}'
    assert rules.body(body, "application/json") == (
        b'{"max_tokens":5,"author":"bob","session":{"id":7},"k":[{"private_key":"<redacted>"}]}')
    hdrs = rules.header_items([("x-ratelimit-remaining-tokens", "99"), ("X-Auth", "abc")])
    assert hdrs == [["x-ratelimit-remaining-tokens", "99"], ["X-Auth", "<redacted>"]]
