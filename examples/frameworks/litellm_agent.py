#!/usr/bin/env python3
"""A weather-and-arithmetic agent on LiteLLM, the loop written by hand.

Written the way LiteLLM's function-calling guide writes it: ``litellm.completion``
with OpenAI-format ``tools``, run the ``tool_calls`` the reply asks for, append the
results as ``tool`` messages, call again until the model answers. The model is an
``openai/``-prefixed name with ``api_base``, LiteLLM's way to reach any
OpenAI-compatible server. A recording of it says how stenograph copes with LiteLLM's
own machinery around the call: its logging worker threads, callbacks and cost maps.

Nothing stenograph-specific: ``api_base`` is ``OPENAI_BASE_URL`` (the loopback model
server with ``script.json``). ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps LiteLLM from
fetching its model price list from GitHub at import (there is no network here, and
the fetch retries with sleeps); telemetry is off.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python litellm_agent.py
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

import litellm

litellm.telemetry = False

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def get_weather(city: str) -> str:
    observed = datetime.now(UTC).strftime("%H:%M:%S")
    return f"{city}: 18 C, clear (observed {observed} UTC)"


def add(a: int, b: int) -> int:
    return a + b


FUNCTIONS = {"get_weather": get_weather, "add": add}


def main() -> None:
    started = time.perf_counter()
    messages = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
    for _ in range(5):
        response = litellm.completion(
            model="openai/gpt-4.1-mini",
            api_base=os.environ["OPENAI_BASE_URL"],
            messages=messages,
            tools=TOOLS,
            tool_choice="auto",
        )
        print(f"response {response.id} ({response.usage.total_tokens} tokens)")
        message = response.choices[0].message
        if not message.tool_calls:
            print(f"final: {message.content}")
            break
        messages.append(message.model_dump())
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            result = FUNCTIONS[call.function.name](**args)
            print(f"tool call: {call.function.name}({args}) -> {result} [{call.id}]")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    print(f"elapsed: {time.perf_counter() - started:.3f}s")


if __name__ == "__main__":
    main()
