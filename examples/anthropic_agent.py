#!/usr/bin/env python3
"""The demo agent of ``agent.py``, on the official ``anthropic`` package, streaming.

Same tools (``list_dir``, ``read_file``, ``run``), same loop, same things that only a
faithful replay reproduces (start time, ``uuid4`` run id, pid, elapsed time). It
streams every model turn (``client.messages.stream``), printing text as it arrives,
because streamed SSE is what a recorder has to keep chunk for chunk.

Usage::

    ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=anything \\
        python examples/anthropic_agent.py [--workdir DIR] [--model M] [TASK...]

It is self-contained on purpose (no import from ``agent.py``): each example should
read as a complete agent on its own SDK.
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

from anthropic import Anthropic

DEFAULT_TASK = "Look around the working directory and tell me what it is for."
MAX_STEPS = 10
MAX_OUTPUT = 4000

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_dir",
        "description": "List the entries of a directory (directories end with '/').",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a text file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "run",
        "description": "Run a shell command and return its standard output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
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


def call_tool(name: str, args: Any) -> tuple[str, bool]:
    """(output, is_error) of one tool call; errors go back to the model as results."""
    fn = TOOL_FUNCS.get(name)
    if fn is None:
        return f"no tool named {name!r}", True
    try:
        return fn(**args)[:MAX_OUTPUT], False
    except Exception as e:  # the model gets to see what went wrong
        return f"{type(e).__name__}: {e}", True


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

    client = Anthropic(
        base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        api_key=os.environ.get("ANTHROPIC_API_KEY"),
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for step in range(1, MAX_STEPS + 1):
        print(f"step {step}: model: ", end="", flush=True)
        with client.messages.stream(
            model=a.model,
            max_tokens=1024,
            system="You are a careful agent. Use the tools, then answer.",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
        ) as stream:
            for text in stream.text_stream:
                print(text, end="", flush=True)
            reply = stream.get_final_message()
        print()
        uses = [b for b in reply.content if b.type == "tool_use"]
        if reply.stop_reason != "tool_use" or not uses:
            answer = "".join(b.text for b in reply.content if b.type == "text")
            elapsed = time.monotonic() - t0
            print(f"final answer: {answer}")
            print(f"run {run_id} finished after {step} model calls in {elapsed:.3f} s")
            return 0
        content = [b.model_dump(exclude_none=True) for b in reply.content]
        messages.append({"role": "assistant", "content": content})
        results: list[dict[str, Any]] = []
        for use in uses:
            out, is_error = call_tool(use.name, use.input)
            print(f"step {step}: {use.name}({json.dumps(use.input)}) -> {preview(out)}")
            results.append(
                {"type": "tool_result", "tool_use_id": use.id, "content": out, "is_error": is_error}
            )
        messages.append({"role": "user", "content": results})
    print(f"gave up after {MAX_STEPS} model calls", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
