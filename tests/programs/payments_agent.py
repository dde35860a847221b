"""A payments agent the way people write one, for the crash, approval and fencing tests.

The official ``openai`` SDK talks to the model (``OPENAI_BASE_URL``); the model's tool
calls are run in order. ``pay`` is a plain ``requests.post`` (an HTTP effect stenograph
finds by itself), held for a person above ``APPROVE_ABOVE`` (``stenograph.approval``)
and sent with the program's own ``Idempotency-Key`` for one payee. ``provision`` is a
declared effect tool whose body is itself an HTTP call, with a read probe. With
``LEDGER`` set, each payment is also appended to that file (a file the run writes);
``APPROVE_WITHIN`` gives approvals that many seconds before they expire. With
``ASYNC=1`` the model is called through ``AsyncOpenAI`` in ``asyncio.run`` and the tools
stay synchronous (a common shape: a sync tool called from an async loop).

``PAY_VIA`` makes ``pay`` shell out or use another client, as agents do: ``curl``,
``urllib`` (the standard library, on the agent's own socket), ``node`` (a ``fetch``
child), ``go`` (``PAY_GO``: the static Go tool ``tests/programs/paygo``) or ``psql``
(``PAY_PG=HOST:PORT``: an INSERT into a PostgreSQL table ``payments``). The default is
``requests`` (hooked).

    python payments_agent.py EFFECT_URL
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import requests
from openai import AsyncOpenAI, OpenAI

import stenograph

BASE = sys.argv[1]
APPROVE_ABOVE = 550
OWN_KEY_PAYEE = "acct-K"
paid = 0


def _fn(fname: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": fname, "description": fname,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in props.items()}}}}


TOOLS = [_fn("pay", amount="amount", to="payee"), _fn("provision", name="server name")]


def pay(amount: str, to: str) -> str:
    global paid
    paid += 1
    n = int(amount)
    if n > APPROVE_ABOVE:
        try:
            stenograph.approval(f"pay {n} to {to}", f"pay {n} EUR to {to}",
                                expires=float(os.environ.get("APPROVE_WITHIN") or 0) or None)
        except stenograph.ApprovalDenied as exc:
            return json.dumps({"denied": str(exc)})
    headers = {"Idempotency-Key": f"own-{to}-{paid}"} if to == OWN_KEY_PAYEE else {}
    via = os.environ.get("PAY_VIA", "requests")
    if via != "requests":
        return PAY[via](n, to, headers)
    r = requests.post(f"{BASE}/payments", json={"amount": n, "to": to}, headers=headers)
    try:
        doc = r.json()
    except ValueError:  # (a tool error goes back to the model, as agents do)
        return f"failed: {r.status_code} {r.text[:100]!r}"
    if os.environ.get("LEDGER"):  # a file the run writes, in its workspace
        with open(os.environ["LEDGER"], "a") as f:
            f.write(f"{doc.get('id')} {n} {to}\n")
    return json.dumps(doc)


def _tool(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True)
    return out.stdout.strip() or f"failed ({out.returncode}): {out.stderr.strip()[-200:]}"


def _curl(n: int, to: str, headers: dict[str, str]) -> str:
    return _tool(["curl", "-s", "-X", "POST", "-H", "Content-Type: application/json",
                  *[a for k, v in headers.items() for a in ("-H", f"{k}: {v}")],
                  "-d", json.dumps({"amount": n, "to": to}), f"{BASE}/payments"])


def _urllib(n: int, to: str, headers: dict[str, str]) -> str:
    req = urllib.request.Request(f"{BASE}/payments", method="POST",
                                 data=json.dumps({"amount": n, "to": to}).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    try:
        return urllib.request.urlopen(req, timeout=30).read().decode()
    except (OSError, urllib.error.URLError) as exc:
        return f"failed: {exc}"


NODE_PAY = ("const [url, n, to, key] = process.argv.slice(1);"
            "fetch(url + '/payments', {method: 'POST', headers: Object.assign("
            "{'Content-Type': 'application/json'}, key ? {'Idempotency-Key': key} : {}),"
            "body: JSON.stringify({amount: Number(n), to})})"
            ".then(r => r.text()).then(t => console.log(t), e => console.log('failed: ' + e))")


def _node(n: int, to: str, headers: dict[str, str]) -> str:
    return _tool(["node", "-e", NODE_PAY, BASE, str(n), to,
                  *headers.values()])


def _go(n: int, to: str, headers: dict[str, str]) -> str:
    return _tool([os.environ["PAY_GO"], BASE, str(n), to, *headers.values()])


def _psql(n: int, to: str, headers: dict[str, str]) -> str:
    host, _, port = os.environ["PAY_PG"].rpartition(":")
    return _tool(["psql", "-X", "-At", "-h", host, "-p", port, "-U", "postgres", "-c",
                  f"INSERT INTO payments(amount, dest) VALUES ({n}, '{to}') RETURNING id"])


PAY = {"curl": _curl, "urllib": _urllib, "node": _node, "go": _go, "psql": _psql}


def _probe(name: str) -> Any:
    found = requests.get(f"{BASE}/servers", params={"name": name}).json()["servers"]
    return found[0] if found else None


@stenograph.tool(effect=True, probe=_probe)
def provision(name: str) -> Any:
    return requests.post(f"{BASE}/servers", json={"name": name}).json()


def _run_tools(msg: Any, messages: list[dict[str, Any]]) -> None:
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        args = json.loads(call.function.arguments)
        out = pay(**args) if call.function.name == "pay" else json.dumps(provision(**args))
        print(call.function.name, json.dumps(args, sort_keys=True), "->", out, flush=True)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": out})


def main() -> int:
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="test-key")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "settle the invoices"}]
    for _ in range(40):
        msg = client.chat.completions.create(model="steno-pay", messages=messages,
                                             tools=TOOLS).choices[0].message
        if not msg.tool_calls:
            print("done:", msg.content, flush=True)
            return 0
        _run_tools(msg, messages)
    return 1


async def amain() -> int:
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="test-key")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "settle the invoices"}]
    for _ in range(40):
        msg = (await client.chat.completions.create(model="steno-pay", messages=messages,
                                                    tools=TOOLS)).choices[0].message
        if not msg.tool_calls:
            print("done:", msg.content, flush=True)
            return 0
        _run_tools(msg, messages)
    return 1


if __name__ == "__main__":
    if os.environ.get("ASYNC") == "1":
        import asyncio

        sys.exit(asyncio.run(amain()))
    sys.exit(main())
