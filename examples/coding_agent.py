#!/usr/bin/env python3
"""A coding agent on the official ``openai`` package: it edits the files of its working
directory.

Tools write, edit and delete files from Python and run shell commands (which change
files too), and every tool result goes back into the next prompt, so what the model
sees depends on the files. This is the kind of run whose recording must carry its
workspace: replayed tomorrow against a changed directory it would read other bytes,
and replayed against the real directory it would write into it again.

``--copies DIR`` makes the agent copy its whole working directory to ``DIR/<n>`` before
its n-th model request (modes, mtimes, symlinks and empty directories kept): the files
as they were at each turn, for comparing with ``stenograph checkpoint restore --at n``.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=anything \\
        python examples/coding_agent.py [--copies DIR] [TASK...]

with ``examples/coding_script.json`` as the loopback model server's script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openai import OpenAI

DEFAULT_TASK = "Tidy up this project: notes, a small app, and no stale files."
MAX_STEPS = 12


def _fn(name: str, doc: str, **props: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "required": list(props),
                       "properties": {k: {"type": "string", "description": v}
                                      for k, v in props.items()}}}}


TOOLS = [
    _fn("read_file", "Read a text file.", path="file"),
    _fn("write_file", "Create or overwrite a file.", path="file", content="its text"),
    _fn("edit_file", "Replace the first occurrence of a text in a file.", path="file",
        old="text to find", new="replacement"),
    _fn("delete_file", "Delete a file.", path="file"),
    _fn("run", "Run a shell command; its output.", command="sh command"),
]


def read_file(path: str) -> str:
    return Path(path).read_text()


def write_file(path: str, content: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(content)
    return f"wrote {len(content)} characters to {path}"


def edit_file(path: str, old: str, new: str) -> str:
    text = Path(path).read_text()
    if old not in text:
        return f"error: {old!r} is not in {path}"
    Path(path).write_text(text.replace(old, new, 1))
    return f"edited {path}"


def delete_file(path: str) -> str:
    os.remove(path)
    return f"deleted {path}"


def run(command: str) -> str:
    p = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    return p.stdout + (f"[exit {p.returncode}] {p.stderr}" if p.returncode else "")


FUNCS: dict[str, Callable[..., str]] = {
    "read_file": read_file, "write_file": write_file, "edit_file": edit_file,
    "delete_file": delete_file, "run": run,
}


def call_tool(name: str, arguments: str) -> str:
    try:
        return FUNCS[name](**json.loads(arguments or "{}"))
    except Exception as e:  # the model sees what went wrong
        return f"error: {type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", default=None)
    p.add_argument("--model", default="steno-coder")
    p.add_argument("task", nargs="*")
    a = p.parse_args(argv)
    client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL"),
                    api_key=os.environ.get("OPENAI_API_KEY"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": " ".join(a.task) or DEFAULT_TASK},
    ]
    for step in range(1, MAX_STEPS + 1):
        if a.copies:
            shutil.copytree(".", os.path.join(a.copies, str(step)), symlinks=True)
        reply = client.chat.completions.create(model=a.model, messages=messages, tools=TOOLS)
        msg = reply.choices[0].message
        print(f"step {step}: model: {msg.content or ''}")
        if not msg.tool_calls:
            print("files now:", sorted(os.listdir(".")))
            return 0
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            result = call_tool(call.function.name, call.function.arguments)
            print(f"step {step}: {call.function.name} -> {result.strip()[:200]}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 1


if __name__ == "__main__":
    sys.exit(main())
