#!/usr/bin/env python3
"""An agent on the OpenAI Agents SDK whose tool comes from an MCP server over stdio.

Written the way the SDK's MCP guide writes it (``MCPServerStdio`` handed to ``Agent``
as ``mcp_servers``): the SDK starts ``stamp_server.py`` as a child, lists its tools for
the model and calls ``stamp`` when the model asks. Nothing stenograph-specific: the model
is reached through ``OPENAI_BASE_URL`` (the loopback model server with ``script.json``),
and tracing is off because its exporter would post spans to the real OpenAI platform.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python agents_sdk_agent.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agents import Agent, Runner, set_tracing_disabled
from agents.mcp import MCPServerStdio

set_tracing_disabled(True)  # the trace exporter would send spans to api.openai.com
SERVER = str(Path(__file__).with_name("stamp_server.py"))


async def main() -> None:
    async with MCPServerStdio(name="stamp", params={"command": sys.executable,
                                                    "args": [SERVER]}) as server:
        agent = Agent(name="Stamper", instructions="Use the stamp tool.",
                      model="gpt-4.1-mini", mcp_servers=[server])
        result = await Runner.run(agent, input="Stamp this directory.")
        for item in result.new_items:
            if item.type == "tool_call_output_item":
                print(f"tool output: {item.output}")
        print(f"final: {result.final_output}")


if __name__ == "__main__":
    asyncio.run(main())
