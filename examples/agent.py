#!/usr/bin/env python3
"""A small but real tool-calling agent on the official ``openai`` package.

It is the agent the demo records and replays, so it is written the way people write
agents, with nothing stenograph-specific in it: the model is reached through
``OpenAI(base_url=$OPENAI_BASE_URL, api_key=$OPENAI_API_KEY)``, tools are plain
Python (``list_dir``, ``read_file``, and ``run``, which starts a shell subprocess),
and the loop runs until the model stops calling tools.

It also prints things no two live runs agree on: the wall-clock start time, a
``uuid4`` run id, the process id and the elapsed time. A live rerun changes every
one of them; a stenograph replay reproduces them byte for byte. That difference is
the point of the demo.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=anything \\
        python examples/agent.py [--workdir DIR] [--model M] [TASK...]

``--workdir`` defaults to this file's directory, which is what
``examples/agent_script.json`` (the scripted conversation for the loopback model
server) expects.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from openai import OpenAI

DEFAULT_TASK = "Look around the working directory and tell me what it is for."
MAX_STEPS = 10
MAX_OUTPUT = 4000
"""Tool output is cut to this many characters before it goes back to the model."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List the entries of a directory (directories end with '/').",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "directory"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file to read"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command and return its standard output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "sh command"}},
                "required": ["command"],
            },
        },
    },
]


def list_dir(path: str) -> str:
    # Sorted: directory order differs between file systems, the answer should not.
    entries = sorted(os.scandir(path), key=lambda e: e.name)
    return "\n".join(e.name + ("/" if e.is_dir() else "") for e in entries)


def read_file(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def run(command: str) -> str:
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return f"{proc.stdout}[exit status {proc.returncode}]\n{proc.stderr}"
    return proc.stdout


TOOL_FUNCS: dict[str, Callable[..., str]] = {
    "list_dir": list_dir,
    "read_file": read_file,
    "run": run,
}


def call_tool(name: str, arguments: str) -> str:
    """Run one tool call; errors become the tool's answer, as a model expects."""
    fn = TOOL_FUNCS.get(name)
    if fn is None:
        return f"error: no tool named {name!r}"
    try:
        args = json.loads(arguments or "{}")
        out = fn(**args)
    except Exception as e:  # the model gets to see what went wrong
        return f"error: {type(e).__name__}: {e}"
    return out[:MAX_OUTPUT]


def preview(text: str, lines: int = 3) -> str:
    rows = text.splitlines()
    shown = " | ".join(rows[:lines])
    more = f" (+{len(rows) - lines} more lines)" if len(rows) > lines else ""
    return f"{shown}{more}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=str(Path(__file__).resolve().parent))
    p.add_argument("--model", default=os.environ.get("AGENT_MODEL", "steno-demo"))
    p.add_argument("task", nargs="*")
    a = p.parse_args(argv)
    task = " ".join(a.task) or DEFAULT_TASK

    started = datetime.now(UTC)
    t0 = time.monotonic()
    run_id = uuid.uuid4()
    print(f"run {run_id} started {started.isoformat(timespec='microseconds')} pid {os.getpid()}")
    print(f"task: {task}")
    os.chdir(a.workdir)

    client = OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY"),
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. Use the tools, then answer."},
        {"role": "user", "content": task},
    ]
    for step in range(1, MAX_STEPS + 1):
        reply = client.chat.completions.create(model=a.model, messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        if msg.content:
            print(f"step {step}: model: {msg.content}")
        if not msg.tool_calls:
            elapsed = time.monotonic() - t0
            print(f"final answer: {msg.content or ''}")
            print(f"run {run_id} finished after {step} model calls in {elapsed:.3f} s")
            return 0
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            fn = call.function
            result = call_tool(fn.name, fn.arguments)
            print(f"step {step}: {fn.name}({fn.arguments}) -> {preview(result)}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print(f"gave up after {MAX_STEPS} model calls", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
