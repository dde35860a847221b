#!/usr/bin/env python3
"""An agent whose tools change the world: it provisions a server and pays for it.

Built on the official ``openai`` package, with tools that call a real HTTP service
(``EFFECT_URL``; ``python -m stenograph.testing.effect_service`` is one on 127.0.0.1):
``find_servers`` reads, ``provision`` and ``pay`` make effects. Nothing in it is
stenograph-specific: under ``stenograph record`` each effect's intent is durable before
its request leaves, and the request carries an idempotency key and a fencing token.

    EFFECT_URL=http://127.0.0.1:PORT OPENAI_BASE_URL=http://127.0.0.1:PORT2/v1 \\
        OPENAI_API_KEY=anything python examples/effect_agent.py

with ``examples/effect_script.json`` as the loopback model server's script.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import requests
from openai import OpenAI

BASE = os.environ.get("EFFECT_URL", "http://127.0.0.1:8321")


def _fn(fname: str, doc: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": fname, "description": doc,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in props.items()}}}}


TOOLS = [
    _fn("find_servers", "List the servers with a name.", name="server name"),
    _fn("provision", "Provision a new server.", name="server name"),
    _fn("pay", "Pay an amount to someone.", amount="amount in EUR", to="payee"),
]


def find_servers(name: str) -> str:
    return json.dumps(requests.get(f"{BASE}/servers", params={"name": name}).json())


def provision(name: str) -> str:
    return json.dumps(requests.post(f"{BASE}/servers", json={"name": name}).json())


def pay(amount: str, to: str) -> str:
    r = requests.post(f"{BASE}/payments", json={"amount": int(amount), "to": to})
    return json.dumps(r.json())


FUNCS = {"find_servers": find_servers, "provision": provision, "pay": pay}


def main() -> int:
    client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL"),
                    api_key=os.environ.get("OPENAI_API_KEY"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You run infrastructure. Use the tools."},
        {"role": "user", "content": "Make sure web1 exists and pay its hosting."},
    ]
    for step in range(1, 10):
        msg = client.chat.completions.create(model="steno-ops", messages=messages,
                                             tools=TOOLS).choices[0].message
        print(f"step {step}: model: {msg.content or ''}")
        if not msg.tool_calls:
            return 0
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            out = FUNCS[call.function.name](**json.loads(call.function.arguments))
            print(f"step {step}: {call.function.name} -> {out}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    return 1


if __name__ == "__main__":
    sys.exit(main())
