"""An agent's MCP client on the official SDK: starts ``stamp_server.py`` over stdio,
lists its tools and calls ``stamp`` N times (``argv[1]``, default 3)."""

import asyncio
import os
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SERVER = str(Path(__file__).with_name("stamp_server.py"))


async def main(n: int) -> None:
    # the server gets this environment (the SDK's default passes only a safe few
    # variables: a PYTHONPATH that selects the SDK would not reach it)
    params = StdioServerParameters(command=sys.executable, args=[SERVER], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        print("tools", [t.name for t in tools.tools], flush=True)
        for _ in range(n):
            r = await session.call_tool("stamp", {"path": "."})
            print("stamp", r.content[0].text, flush=True)


asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
