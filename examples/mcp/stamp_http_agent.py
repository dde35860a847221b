"""An agent that starts its own MCP server over streamable HTTP, as agents that ship a
tool server beside them do: it finds a free port, starts ``stamp_server.py --http PORT``
as its child, waits until the server listens, then talks to it in-process on the
official SDK (lists the tools, calls ``stamp`` ``argv[1]`` times, default 3) and stops
it. Under stenograph both ends are in the recorded tree: a replay runs the server too."""

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

from stamp_http_client import main as talk  # (this directory is on sys.path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"the stamp server did not listen on port {port}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("stamp_server.py")),
                               "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        asyncio.run(talk(f"http://127.0.0.1:{port}/mcp", n))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
