"""An MCP server whose tools act on a payments service (``LEDGER_URL``: the loopback
``stenograph.testing.effect_service``, or anything with its endpoints), the way a
payments or ops server wraps its company's API:

* ``balance`` reads what happened (``GET /stats``): annotated ``readOnlyHint``, no effect;
* ``pay`` makes a payment (``POST /payments``): acts; annotated ``idempotentHint``, as
  the service answers a repeated ``Idempotency-Key`` with its first answer;
* ``provision`` creates a server (``POST /servers``): acts and says nothing more, so by
  the spec's defaults it is destructive and not idempotent -- the service has no keys."""

import json
import os

import httpx

try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server
from mcp.types import ToolAnnotations

URL = os.environ.get("LEDGER_URL", "http://127.0.0.1:8321")
mcp = Server("ledger")


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
def balance() -> str:
    """How many payments and servers were made."""
    stats = httpx.get(f"{URL}/stats", timeout=30).json()
    return f"{stats['payments']} payments, {stats['servers']} servers"


@mcp.tool(annotations=ToolAnnotations(idempotentHint=True, destructiveHint=False))
def pay(to: str, amount: int) -> str:
    """Pay ``amount`` to ``to``."""
    r = httpx.post(f"{URL}/payments", json={"to": to, "amount": amount}, timeout=30)
    return f"{r.status_code} {json.dumps(r.json(), sort_keys=True)}"


@mcp.tool()
def provision(name: str) -> str:
    """Create a server called ``name``."""
    r = httpx.post(f"{URL}/servers", json={"name": name}, timeout=30)
    return f"{r.status_code} {json.dumps(r.json(), sort_keys=True)}"


if __name__ == "__main__":
    mcp.run()
