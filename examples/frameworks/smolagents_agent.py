#!/usr/bin/env python3
"""A weather-and-arithmetic agent on smolagents' ``ToolCallingAgent``.

Written the way smolagents' guided tour writes it: ``@tool`` functions, an
``OpenAIModel`` (smolagents' class for any OpenAI-compatible server) and
``agent.run(task)``, with smolagents' own step-by-step console output left on, as a
user sees it. A ToolCallingAgent ends only when the model calls ``final_answer``, so
it plays ``smolagents_script.json`` (the same conversation, closed by that call). A
recording of it says how stenograph copes with smolagents: parallel tool calls run
on a thread pool, and every step is timed and printed with its duration.

Nothing stenograph-specific: ``api_base`` is ``OPENAI_BASE_URL`` and the key is
``OPENAI_API_KEY``; smolagents sends telemetry only when instrumented
(OpenTelemetry), and this agent is not.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python smolagents_agent.py
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from smolagents import OpenAIModel, ToolCallingAgent, tool


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city's name.
    """
    observed = datetime.now(UTC).strftime("%H:%M:%S")
    return f"{city}: 18 C, clear (observed {observed} UTC)"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def main() -> None:
    started = time.perf_counter()
    model = OpenAIModel(
        model_id="gpt-4.1-mini",
        api_base=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )
    agent = ToolCallingAgent(tools=[get_weather, add], model=model, max_steps=4)
    answer = agent.run("What is the weather in Paris, and what is 2 + 3?")
    print(f"final: {answer}")
    for step in agent.memory.steps:
        for call in getattr(step, "tool_calls", None) or []:
            print(f"tool call: {call.name}({call.arguments}) [{call.id}]")
        if getattr(step, "observations", None):
            print(f"observations: {step.observations}")
    usage = agent.monitor.get_total_token_counts()
    print(f"usage: {usage.input_tokens} in, {usage.output_tokens} out")
    print(f"elapsed: {time.perf_counter() - started:.3f}s")


if __name__ == "__main__":
    main()
