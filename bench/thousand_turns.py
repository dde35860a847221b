"""A real 1,000-turn recording, for the benchmarks of what reads long logs.

A small tool-calling agent on the official ``openai`` SDK (one tool, ``step``) is
recorded with ``stenograph record`` against the loopback model server: 999 turns that
each call the tool, then a final answer. Like a real long-running agent it keeps a
window of its history (the system prompt, the task and the last ``WINDOW`` turns): a
context that kept every turn would be 2,000 messages long by the end, beyond any
model's context, and the log quadratic in size. Tool outputs are a few lines; every
97th one carries a 30 KB log, so the page's per-message cap is exercised.

The model server picks the scripted turn by counting assistant messages, which a
window caps; here it reads the step number of the last tool result instead.

    python bench/thousand_turns.py [PATH]     # writes PATH (default: the cache)

``make(path)`` is for other benchmarks; the recording is cached in
``/tmp/steno-bench-1000.steno`` (with a key file: the agent's source and the script),
so only the first call pays for the recording (about a minute).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stenograph.testing.model_server import ModelServer, Turn

TURNS = 1000
WINDOW = 10
CACHE = Path("/tmp/steno-bench-1000.steno")
CLI = [sys.executable, "-m", "stenograph"]

AGENT = f'''\
"""A long-running agent: step through a job with one tool, a window of history."""
import json
import sys

from openai import OpenAI

TOOLS = [{{"type": "function", "function": {{
    "name": "step", "description": "Do one step of the job and report on it.",
    "parameters": {{"type": "object", "required": ["i"], "properties": {{
        "i": {{"type": "integer"}}, "what": {{"type": "string"}}}}}}}}}}]
HEAD = [{{"role": "system", "content": "You are a patient agent. Work through the job "
          "one step at a time, with the step tool, then report."}},
        {{"role": "user", "content": "Run the {TURNS - 1} steps of the nightly job."}}]


def step(i, what=""):
    lines = [f"step {{i}}: {{what}}"]
    lines += [f"  item {{i}}.{{k}}: ok in {{(i * 7 + k) % 97}} ms" for k in range(4)]
    if i % 97 == 0:
        lines.append("log: " + "".join(f"{{k:05d}} " for k in range(5000)))
    return "\\n".join(lines)


client = OpenAI()
history = []
for n in range(1, {TURNS + 1}):
    messages = HEAD + [m for turn in history[-{WINDOW}:] for m in turn]
    reply = client.chat.completions.create(model="steno-bench", messages=messages,
                                           tools=TOOLS)
    msg = reply.choices[0].message
    if not msg.tool_calls:
        print(msg.content)
        sys.exit(0)
    turn = [msg.model_dump(exclude_none=True)]
    for call in msg.tool_calls:
        out = step(**json.loads(call.function.arguments))
        turn.append({{"role": "tool", "tool_call_id": call.id, "content": out}})
    history.append(turn)
sys.exit(1)
'''


def script() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"text": f"Step {i}." if i % 10 else f"Step {i}; {i} of {TURNS - 1} done so far.",
         "tool_calls": [{"name": "step", "arguments": {"i": i, "what": f"batch {i % 13}"}}]}
        for i in range(1, TURNS)]
    out.append({"text": f"All {TURNS - 1} steps of the nightly job ran; none failed."})
    return out


class StepServer(ModelServer):
    """Serves script turn k when the last tool result in the request is step k."""

    def turn_for(self, req: Mapping[str, Any], turn_index: int) -> Turn:
        done = 0
        for m in reversed(req.get("messages") or []):
            if isinstance(m, Mapping) and m.get("role") == "tool":
                found = re.match(r"step (\d+):", str(m.get("content", "")))
                done = int(found.group(1)) if found else 0
                break
        return super().turn_for(req, done)


def _key() -> str:
    return hashlib.sha256((AGENT + json.dumps(script())).encode()).hexdigest()


def _record(out: Path) -> float:
    """Record the agent into ``out``; the wall time of the ``record`` command."""
    work = Path(tempfile.mkdtemp(prefix="steno-bench-1000-"))
    try:
        (work / "agent.py").write_text(AGENT)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
        with StepServer(script=script()) as srv:
            env.update(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-bench")
            t0 = time.perf_counter()
            p = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable,
                                "agent.py"], cwd=work, env=env, capture_output=True,
                               timeout=1800)
            took = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"recording the 1,000-turn agent failed (exit {p.returncode}):\n"
                             f"{p.stderr.decode(errors='replace')[-3000:]}")
        return took
    finally:
        shutil.rmtree(work, ignore_errors=True)


def make(path: Path) -> Path:
    """Write the 1,000-turn ``.steno`` to ``path`` (from the cache when it is current)
    and return it."""
    key_file = CACHE.with_name(CACHE.name + ".key")
    if not (CACHE.exists() and key_file.exists() and key_file.read_text() == _key()):
        tmp = CACHE.with_name(f".{CACHE.name}.{os.getpid()}.steno")
        took = _record(tmp)
        os.replace(tmp, CACHE)
        key_file.write_text(_key())
        print(f"1000-turn recording: recorded in {took:.1f} s -> {CACHE}", file=sys.stderr)
    if Path(path).resolve() != CACHE.resolve():
        shutil.copyfile(CACHE, path)
    return Path(path)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE
    print(make(target))
