#!/usr/bin/env python3
"""A tool that runs as its own process and calls HTTP: ``fetch_tool.py BASE PATH``.

``examples/agents_extra/clients.py`` runs it as a subprocess, so a recording holds
exchanges from a second process path; it prints what the server echoed back.
"""

from __future__ import annotations

import os
import sys

import httpx2


def main() -> int:
    base, path = sys.argv[1], sys.argv[2]
    with httpx2.Client() as c:
        r = c.post(base + path, json={"from": "child"}, headers={"x-tool": "fetch"})
        echo = r.json()
    print(f"{r.status_code} {echo['method']} {echo['path']} {echo['headers'].get('x-tool')} "
          f"pid {os.getpid()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
