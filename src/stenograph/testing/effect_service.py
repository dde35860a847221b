"""A loopback service with real effects, for crash-and-resume tests and the example.

Payments/provisioning style, on 127.0.0.1:

* ``POST /payments`` ``{"amount": n, "to": s}``: makes a payment. Honours
  ``Idempotency-Key``: a key seen before returns the first answer again and makes no
  new payment (a different body under the same key is ``422``).
* ``POST /servers`` ``{"name": s}``: provisions a server. **No** idempotency support:
  every call makes one, whatever its headers say.
* ``GET /servers?name=s``: the read probe for it: the servers of that name.
* ``GET /payments?to=s&amount=n``: the payments made to ``s`` (of ``n``): a probe's read.
* ``GET /stats``: what happened, as ground truth for tests: ``{"payments": n,
  "servers": n, "by_key": {key: count}, "by_name": {name: count}, "requests": n,
  "rejected_stale": n}``.

Every mutating request is checked against a ``fencing.Gate``: a stale
``Stenograph-Fencing-Token`` gets ``409`` and no effect. ``--delay-ms`` holds each
answer back after the effect is made (the window in which a crash leaves an effect
in doubt).

    python -m stenograph.testing.effect_service --port 0 --port-file PATH
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stenograph.fencing import HEADER, Gate


class _Server(ThreadingHTTPServer):
    """A listen queue for a fleet: 64 agents paying at once overflowed the default of 5,
    and the kernel reset the connections it could not queue."""

    request_queue_size = 512


class Drop(Exception):
    """Raised by an ``on_effect`` hook: the request is dropped unanswered, not applied
    (a crash injected between the intent and the effect)."""


class EffectService:
    """The service; ``with EffectService() as svc:`` runs it on a free port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, delay_ms: int = 0) -> None:
        self.gate = Gate()
        self.delay_ms = delay_ms
        self._lock = threading.Lock()
        self.payments: list[dict[str, Any]] = []
        self.servers: list[dict[str, Any]] = []
        self._answers: dict[str, tuple[str, bytes]] = {}
        self.by_key: Counter[str] = Counter()
        self.bodies_by_key: dict[str, set[str]] = {}
        """Every distinct body sent under each idempotency key (payments and servers):
        more than one under a key is a key sent for another intent."""
        self.requests = 0
        self.rejected_stale = 0
        self.on_effect: Any = None
        """Test instrumentation: called as ``on_effect(path, headers)`` when a mutating
        request arrives, before anything is done with it (raise ``Drop`` to drop it)."""
        self.after_effect: Any = None
        """Called as ``after_effect(path, headers)`` once the effect is applied, before
        the answer is sent (raise ``Drop``: applied, never answered)."""
        self.on_read: Any = None
        """Called as ``on_read(path)`` when a GET arrives (raise ``Drop`` to drop it)."""
        self.after_answer: Any = None
        """Called as ``after_answer(path, headers)`` once a mutating request's answer has
        been written (a crash after the effect's answer left)."""
        self._httpd = _Server((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> EffectService:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="effect-service")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> EffectService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def applied(self) -> set[str]:
        """The idempotency keys of the payments made: the ground truth of what happened."""
        with self._lock:
            return set(self._answers)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"payments": len(self.payments), "servers": len(self.servers),
                    "by_key": dict(self.by_key),
                    "keys_reused": sorted(k for k, v in self.bodies_by_key.items()
                                          if len(v) > 1),
                    "by_name": dict(Counter(s["name"] for s in self.servers)),
                    "requests": self.requests, "rejected_stale": self.rejected_stale}

    # -- the endpoints (called with the body parsed; return status, JSON) ----------

    def pay(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
        canon = json.dumps(body, sort_keys=True)
        with self._lock:
            if key is not None:
                self.bodies_by_key.setdefault(key, set()).add(f"/payments {canon}")
            if key is not None and key in self._answers:
                seen_body, answer = self._answers[key]
                if seen_body != canon:
                    return 422, {"error": "Idempotency-Key reused with another body"}
                self.by_key[key] += 1
                return 200, {**json.loads(answer), "replayed": True}
            payment = {"id": f"pay_{len(self.payments) + 1}", "amount": body.get("amount"),
                       "to": body.get("to")}
            self.payments.append(payment)
            if key is not None:
                self._answers[key] = (canon, json.dumps(payment).encode())
                self.by_key[key] += 1
            return 201, payment

    def provision(self, body: dict[str, Any], key: str | None = None
                  ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if key is not None:
                self.bodies_by_key.setdefault(key, set()).add(
                    f"/servers {json.dumps(body, sort_keys=True)}")
            server = {"id": f"srv_{len(self.servers) + 1}", "name": body.get("name")}
            self.servers.append(server)
            return 201, server

    def find_servers(self, name: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            return 200, {"servers": [s for s in self.servers if s["name"] == name]}

    def find_payments(self, to: str, amount: str) -> tuple[int, dict[str, Any]]:
        """The payments made to ``to`` (of ``amount``, if given): what a probe asks."""
        with self._lock:
            return 200, {"payments": [p for p in self.payments if p["to"] == to and (
                not amount or str(p["amount"]) == amount)]}


def _handler(svc: EffectService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # head and body leave at once, not 40 ms apart

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with svc._lock:
                svc.requests += 1
            url = urlsplit(self.path)
            if svc.on_read is not None and url.path != "/stats":
                try:
                    svc.on_read(url.path)
                except Drop:
                    self.close_connection = True
                    return
            if url.path == "/stats":
                self._send(200, svc.stats())
            elif url.path == "/servers":
                self._send(*svc.find_servers(parse_qs(url.query).get("name", [""])[0]))
            elif url.path == "/payments":
                q = parse_qs(url.query)
                self._send(*svc.find_payments(q.get("to", [""])[0],
                                              q.get("amount", [""])[0]))
            else:
                self._send(404, {"error": "no such endpoint"})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            with svc._lock:
                svc.requests += 1
            path = urlsplit(self.path).path
            try:
                if svc.on_effect is not None:
                    svc.on_effect(path, dict(self.headers.items()))
            except Drop:
                self.close_connection = True
                return
            if not svc.gate.admit(self.headers.get(HEADER)):
                with svc._lock:
                    svc.rejected_stale += 1
                self._send(409, {"error": "stale fencing token"})
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, {"error": "body is not JSON"})
                return
            if path == "/payments":
                status, out = svc.pay(body, self.headers.get("Idempotency-Key"))
            elif path == "/servers":
                status, out = svc.provision(body, self.headers.get("Idempotency-Key"))
            else:
                self._send(404, {"error": "no such endpoint"})
                return
            if svc.delay_ms:
                time.sleep(svc.delay_ms / 1000)
            try:
                if svc.after_effect is not None:
                    svc.after_effect(path, dict(self.headers.items()))
            except Drop:
                self.close_connection = True
                return
            self._send(status, out)
            self.wfile.flush()
            if svc.after_answer is not None:
                svc.after_answer(path, dict(self.headers.items()))

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", default=None)
    ap.add_argument("--delay-ms", type=int, default=0)
    a = ap.parse_args()
    svc = EffectService(a.host, a.port, a.delay_ms)
    if a.port_file:
        Path(a.port_file).write_text(str(svc._httpd.server_address[1]))
    print(f"effect service on {svc.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        svc._httpd.serve_forever()


if __name__ == "__main__":
    main()
