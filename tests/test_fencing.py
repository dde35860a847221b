"""Fencing tokens, checked by a real WSGI server on 127.0.0.1 and by the effect service.

A worker whose lease was taken over keeps an old epoch: once the service has seen the
new holder's token, the old one is refused with 409 and no effect is made.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from stenograph.fencing import HEADER, Gate, parse
from stenograph.testing.effect_service import EffectService


def test_parse_and_admit() -> None:
    assert parse("run-1:3") == ("run-1", 3)
    assert parse("a:b:7") == ("a:b", 7)  # a trajectory id may hold colons
    assert parse("nope") is None and parse("x:") is None and parse(None) is None
    g = Gate()
    assert g.admit(None)  # an unfenced caller
    assert not g.admit("garbage")  # a token that is not one
    assert g.admit("t:1") and g.admit("t:1") and g.admit("t:2")
    assert not g.admit("t:1")  # stale once epoch 2 was seen
    assert g.admit("other:0")  # per trajectory
    assert g.highest("t") == 2


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def gated_app() -> Iterator[tuple[str, list[str]]]:
    made: list[str] = []

    def app(environ: dict, start_response: object) -> list[bytes]:
        made.append(environ.get("PATH_INFO", ""))
        start_response("200 OK", [("Content-Type", "text/plain")])  # type: ignore[operator]
        return [b"done\n"]

    srv = make_server("127.0.0.1", 0, Gate().wsgi(app), handler_class=_Quiet)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", made
    finally:
        srv.shutdown()
        srv.server_close()


def _post(url: str, token: str | None, body: bytes = b"{}") -> int:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={HEADER: token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_wsgi_middleware_refuses_a_stale_worker(gated_app: tuple[str, list[str]]) -> None:
    url, made = gated_app
    assert _post(url + "/a", "job:1") == 200
    assert _post(url + "/b", "job:2") == 200  # the new lease holder
    assert _post(url + "/c", "job:1") == 409  # the old worker, continued
    assert made == ["/a", "/b"]


def test_effect_service_fences_and_honours_idempotency_keys() -> None:
    with EffectService() as svc:
        def pay(key: str, token: str, amount: int = 5) -> tuple[int, dict]:
            req = urllib.request.Request(
                svc.url + "/payments", data=json.dumps({"amount": amount}).encode(),
                method="POST", headers={"Idempotency-Key": key, HEADER: token,
                                        "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert pay("k1", "t:0")[0] == 201
        status, again = pay("k1", "t:0")
        assert status == 200 and again["replayed"]  # the same key: no second payment
        assert pay("k1", "t:0", amount=6)[0] == 422  # the same key, another body
        assert pay("k2", "t:1")[0] == 201
        assert pay("k3", "t:0")[0] == 409  # stale epoch
        st = svc.stats()
        assert st["payments"] == 2 and st["rejected_stale"] == 1
        assert st["by_key"] == {"k1": 2, "k2": 1}


def test_a_heartbeat_that_finds_its_lease_taken_says_by_whom(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A worker's heartbeat finds its trajectory taken over (another worker's epoch): it
    hands the new holder's lease to ``lost`` once and stops renewing. (Its thread once
    died of a TypeError there instead, seen only when a loaded machine made a worker's
    renewal meet the takeover.)"""
    import dataclasses
    import time

    from stenograph.recorder.leases import Heartbeat, LocalLeases

    leases = LocalLeases(tmp_path)
    mine = leases.acquire("t", 1, ttl=0.3)
    told: list = []
    beat = Heartbeat(leases, mine, 0.3, told.append)
    theirs = dataclasses.replace(mine, epoch=2, pid=mine.pid + 1, token="other")
    with leases._locked():
        leases._write(theirs)
    deadline = time.monotonic() + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.02)
    beat.close()
    assert beat.is_lost and told == [theirs]
    assert leases.current("t") == theirs  # not released by the worker that lost it
