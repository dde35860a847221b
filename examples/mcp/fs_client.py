"""An agent's MCP client of the reference Node filesystem server
(``@modelcontextprotocol/server-filesystem`` from the npm registry), started over stdio
with ``node`` and allowed the working directory: lists its tools, the directory, and
reads ``a.txt``. ``argv[1]``: the server's ``dist/index.js``."""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(server: str) -> None:
    here = os.getcwd()
    params = StdioServerParameters(command="node", args=[server, here], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        print("tools", sorted(t.name for t in tools.tools)[:3], flush=True)
        r = await session.call_tool("list_directory", {"path": here})
        print(r.content[0].text, flush=True)
        r = await session.call_tool("read_text_file", {"path": os.path.join(here, "a.txt")})
        print(r.content[0].text, flush=True)


asyncio.run(main(sys.argv[1]))
