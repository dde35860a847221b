#!/usr/bin/env python3
"""A weather-and-arithmetic agent on Pydantic AI.

Written the way Pydantic AI's quick-start writes it: ``Agent('openai:...')`` with
``@agent.tool_plain`` tools and ``agent.run_sync``. In Pydantic AI 2 the ``openai:``
prefix means the Responses API, over ``AsyncOpenAI`` inside an event loop that
``run_sync`` owns, and a turn's tool calls run concurrently (sync tools on worker
threads). A recording of it says how stenograph copes with that.

Nothing stenograph-specific: the ``openai`` client reads ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` (the loopback model server with ``script.json``). Pydantic AI only
instruments with Logfire when asked (``instrument=``), and this agent never asks.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python pydantic_ai_agent.py
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic_ai import Agent
from pydantic_ai.messages import ToolCallPart, ToolReturnPart

agent = Agent("openai:gpt-4.1-mini", instructions="Answer with the tools you have.")


@agent.tool_plain
def get_weather(city: str) -> str:
    """Current weather for a city."""
    observed = datetime.now(UTC).strftime("%H:%M:%S")
    return f"{city}: 18 C, clear (observed {observed} UTC)"


@agent.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def main() -> None:
    started = time.perf_counter()
    result = agent.run_sync("What is the weather in Paris, and what is 2 + 3?")
    for message in result.all_messages():
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                print(f"tool call: {part.tool_name}({part.args}) [{part.tool_call_id}]")
            elif isinstance(part, ToolReturnPart):
                print(f"tool return: {part.content} at {part.timestamp.isoformat()}")
        if message.kind == "response":
            print(f"response {message.provider_response_id} at {message.timestamp.isoformat()}")
    print(f"final: {result.output}")
    print(f"usage: {result.usage}")
    print(f"elapsed: {time.perf_counter() - started:.3f}s")


if __name__ == "__main__":
    main()
