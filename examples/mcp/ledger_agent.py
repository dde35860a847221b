"""An agent's MCP client on the ledger server (``ledger_server.py``): ``argv[1]`` says
which calls, by initial (default ``bpvpb``: balance, pay, provision, pay, balance)."""

import asyncio
import os
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SERVER = str(Path(__file__).with_name("ledger_server.py"))


async def main(plan: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=[SERVER], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        payments = iter([("acct-A", 5), ("acct-B", 7), ("acct-C", 9)])
        servers = iter(["web1", "web2"])
        for c in plan:
            if c == "p":
                to, amount = next(payments)
                name, args = "pay", {"to": to, "amount": amount}
            elif c == "v":
                name, args = "provision", {"name": next(servers)}
            else:
                name, args = "balance", {}
            r = await session.call_tool(name, args)
            print(name, "->", r.content[0].text, flush=True)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "bpvpb"))
