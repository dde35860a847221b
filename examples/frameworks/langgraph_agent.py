#!/usr/bin/env python3
"""A weather-and-arithmetic agent on LangGraph with ``langchain-openai``.

Written the way LangGraph's quick-start writes a tool-calling agent: a ``StateGraph``
over ``MessagesState`` with a model node (``ChatOpenAI.bind_tools``) and the prebuilt
``ToolNode``, a conditional edge on ``tools_condition``, and ``graph.stream`` to watch
it run. A recording of it says how stenograph copes with LangGraph's executor: the
ToolNode runs a turn's parallel tool calls on a thread pool, and every step makes
run ids (uuid) and callback bookkeeping.

Nothing stenograph-specific: ``ChatOpenAI`` reaches the model through
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the loopback model server with
``script.json``); LangSmith tracing stays off (it is off unless
``LANGSMITH_TRACING`` is set, and this agent clears it so no run goes out).

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x python langgraph_agent.py
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

for _var in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2"):
    os.environ.pop(_var, None)  # a stray tracing flag would post runs to LangSmith

from langchain_core.messages import HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    observed = datetime.now(UTC).strftime("%H:%M:%S")
    return f"{city}: 18 C, clear (observed {observed} UTC)"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [get_weather, add]
llm = ChatOpenAI(model="gpt-4.1-mini", temperature=0).bind_tools(TOOLS)


def call_model(state: MessagesState) -> dict[str, list]:
    return {"messages": [llm.invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", call_model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile()


def main() -> None:
    started = time.perf_counter()
    question = HumanMessage("What is the weather in Paris, and what is 2 + 3?")
    final = None
    for update in graph.stream({"messages": [question]}, stream_mode="updates"):
        for node, value in update.items():
            for msg in value["messages"]:
                print(f"[{node}] {msg.type} id={msg.id}")
                for call in getattr(msg, "tool_calls", []):
                    print(f"  tool call: {call['name']}({call['args']}) [{call['id']}]")
                if msg.type == "tool":
                    print(f"  tool result: {msg.content}")
                elif msg.content:
                    print(f"  {msg.content}")
                final = msg
    assert final is not None
    print(f"final: {final.content}")
    usage = getattr(final, "usage_metadata", None) or {}
    print(f"usage: {usage.get('total_tokens')} tokens")
    print(f"elapsed: {time.perf_counter() - started:.3f}s")


if __name__ == "__main__":
    main()
