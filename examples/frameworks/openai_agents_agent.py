#!/usr/bin/env python3
"""A weather-and-arithmetic agent on the OpenAI Agents SDK (``agents``), streamed.

Written the way the SDK's quick-start writes it (``Agent`` + ``@function_tool`` +
``Runner.run_streamed``), so a recording of it says how stenograph copes with the
SDK as people use it: the Responses API over ``AsyncOpenAI`` (the SDK's default
model), an asyncio event loop, and tools the SDK runs for a turn's parallel calls.

Nothing stenograph-specific: the model is reached through ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` (the loopback model server with ``script.json``), and tracing is
off because its exporter would post spans to the real OpenAI platform.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python openai_agents_agent.py
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from agents import Agent, ItemHelpers, Runner, function_tool, set_tracing_disabled

set_tracing_disabled(True)  # the trace exporter would send spans to api.openai.com


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    observed = datetime.now(UTC).strftime("%H:%M:%S")
    return f"{city}: 18 C, clear (observed {observed} UTC)"


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    started = time.perf_counter()
    agent = Agent(
        name="Assistant",
        instructions="Answer with the tools you have.",
        model="gpt-4.1-mini",
        tools=[get_weather, add],
    )
    result = Runner.run_streamed(agent, input="What is the weather in Paris, and what is 2 + 3?")
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            if event.data.type == "response.completed":
                print(f"response {event.data.response.id}")
        elif event.type == "agent_updated_stream_event":
            print(f"agent: {event.new_agent.name}")
        elif event.type == "run_item_stream_event":
            item = event.item
            if item.type == "tool_call_item":
                raw = item.raw_item
                print(f"tool call: {raw.name}({raw.arguments}) [{raw.call_id}]")
            elif item.type == "tool_call_output_item":
                print(f"tool output: {item.output}")
            elif item.type == "message_output_item":
                print(f"message: {ItemHelpers.text_message_output(item)}")
    print(f"final: {result.final_output}")
    print(f"usage: {result.context_wrapper.usage.total_tokens} tokens")
    print(f"elapsed: {time.perf_counter() - started:.3f}s")


if __name__ == "__main__":
    asyncio.run(main())
