"""An agent's MCP client over streamable HTTP, on the official SDK: connects to the stamp
server at ``argv[1]`` (``http://127.0.0.1:PORT/mcp``), lists its tools and calls
``stamp`` ``argv[2]`` times (default 3)."""

import asyncio
import sys

from mcp import ClientSession

try:
    from mcp.client.streamable_http import streamable_http_client as connect
except ImportError:  # mcp 1.x
    from mcp.client.streamable_http import streamablehttp_client as connect


async def main(url: str, n: int) -> None:
    async with connect(url) as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        tools = await session.list_tools()
        print("tools", [t.name for t in tools.tools], flush=True)
        for _ in range(n):
            r = await session.call_tool("stamp", {"path": "."})
            print("stamp", r.content[0].text, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3))
