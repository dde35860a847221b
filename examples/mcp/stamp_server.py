"""A one-tool MCP server on the official Python SDK, written the way its docs write one:
``stamp`` returns a time, a uuid4, a random number and a directory listing (all of it
different on every run natively). mcp 2.x names the class ``MCPServer``; 1.x ``FastMCP``;
``STAMP_SERVER=fastmcp`` serves it with the standalone ``fastmcp`` package instead.
``--http PORT`` serves it over streamable HTTP on 127.0.0.1:PORT instead of stdio."""

import os
import random
import sys
import time
import uuid

if os.environ.get("STAMP_SERVER") == "fastmcp":  # the standalone fastmcp package
    from fastmcp import FastMCP as Server
else:
    try:
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as Server

mcp = Server("stamp")


@mcp.tool()
def stamp(path: str = ".") -> str:
    """A time, a uuid4, a random number, a directory listing."""
    names = sorted(n for n in os.listdir(path) if not n.startswith("."))[:3]
    return f"{time.time():.6f} {uuid.uuid4()} {random.random():.6f} {names}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # streamable HTTP on 127.0.0.1:PORT
        port = int(sys.argv[2])
        try:
            mcp.run(transport="streamable-http", host="127.0.0.1", port=port)
        except TypeError:  # mcp 1.x: the port is a setting
            mcp.settings.host, mcp.settings.port = "127.0.0.1", port
            mcp.run(transport="streamable-http")
    else:
        mcp.run()
