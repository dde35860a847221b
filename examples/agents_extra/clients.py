#!/usr/bin/env python3
"""Every HTTP client stenograph hooks, against the loopback model server, one section each.

Used by ``tests/test_agent_replay.py``: each section prints one line ``name: ...``
(or ``name: ERROR ...``), so a recording and its replay can be compared line by line.

Usage::

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=... \\
    ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=... \\
        SESSION_COOKIE=... python clients.py BASE_URL CLOSED_PORT

``CLIENTS_SECTIONS=a,b`` runs only the sections named.

The server should be scripted with ``SCRIPT`` below (turn 0 calls the ``fetch`` tool).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = [
    {"text": "I will fetch it.", "tool_calls": [{"name": "fetch", "arguments": {"path": "/echo"}}]},
    {"text": "fetched it"},
]
TOOLS = [{"type": "function", "function": {
    "name": "fetch", "description": "GET a path of the server",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]
A_TOOLS = [{"name": "fetch", "description": "GET a path of the server",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                             "required": ["path"]}}]
HERE = Path(__file__).resolve().parent


def section(name: str, fn: Callable[[], Any]) -> None:
    try:
        out = fn()
    except Exception as e:  # printed, so a test names the section that broke
        out = f"ERROR {type(e).__module__}.{type(e).__name__}: {e}"
    print(f"{name}: {out}", flush=True)


def err_name(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__name__}"


def main() -> int:
    base, closed_port = sys.argv[1], int(sys.argv[2])
    cookie = os.environ.get("SESSION_COOKIE", "none")
    only = set(filter(None, os.environ.get("CLIENTS_SECTIONS", "").split(",")))
    import anthropic
    import openai

    oc = openai.OpenAI()
    msgs = [{"role": "user", "content": "hello"}]

    def openai_sync() -> str:
        r = oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        return f"{r.id} {r.choices[0].finish_reason} {m.content!r} {m.tool_calls[0].function.name}"

    def openai_async() -> str:
        async def go() -> str:
            async with openai.AsyncOpenAI() as c:
                r = await c.chat.completions.create(model="m-async", messages=msgs)
                return f"{r.id} {r.choices[0].message.content!r}"
        return asyncio.run(go())

    def openai_stream() -> str:
        parts = []
        for chunk in oc.chat.completions.create(model="m-stream", messages=msgs, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return f"{len(parts)} pieces {''.join(parts)!r}"

    def openai_retry() -> str:
        raw = oc.chat.completions.with_raw_response.create(
            model="m-retry", messages=msgs, extra_headers={"x-steno-test": "fail=1"})
        return f"retries_taken={raw.retries_taken} status={raw.status_code} " \
               f"{raw.parse().choices[0].message.content!r}"

    def openai_timeout() -> str:
        c = openai.OpenAI(timeout=0.4, max_retries=0)
        try:
            c.chat.completions.create(model="m-slow", messages=msgs,
                                      extra_headers={"x-steno-test": "delay_ms=2500"})
        except openai.APIError as e:
            return f"raised {err_name(e)} cause {err_name(e.__cause__ or e)}"
        return "no error"

    ac = anthropic.Anthropic()

    def anthropic_sync() -> str:
        r = ac.messages.create(model="claude-x", max_tokens=64, messages=msgs, tools=A_TOOLS)
        return f"{r.id} {r.stop_reason} {[b.type for b in r.content]}"

    def anthropic_async() -> str:
        async def go() -> str:
            async with anthropic.AsyncAnthropic() as c:
                r = await c.messages.create(model="claude-async", max_tokens=64, messages=msgs)
                return f"{r.id} {r.content[0].text!r}"
        return asyncio.run(go())

    def anthropic_stream() -> str:
        with ac.messages.stream(model="claude-stream", max_tokens=64, messages=msgs) as s:
            pieces = list(s.text_stream)
            final = s.get_final_message()
        return f"{len(pieces)} pieces {''.join(pieces)!r} {final.usage.output_tokens}"

    def plain_httpx() -> str:
        import httpx

        with httpx.Client() as c:
            with c.stream("GET", base + "/stream?n=4&ms=0") as r:
                chunks = list(r.iter_raw())
            try:
                c.get(base + "/slow?ms=2500", timeout=0.3)
                timeout = "no error"
            except httpx.TimeoutException as e:
                timeout = err_name(e)
        return f"{len(chunks)} chunks {b''.join(chunks)!r} timeout {timeout}"

    def plain_requests() -> str:
        import requests

        s = requests.Session()
        r = s.post(base + "/echo", json={"q": "requests"}, cookies={"session": cookie})
        echo = r.json()
        try:
            requests.get(f"http://127.0.0.1:{closed_port}/nothing", timeout=2)
            refused = "no error"
        except requests.RequestException as e:
            refused = err_name(e)
        return f"{r.status_code} {echo['method']} {echo['path']} cookie-sent=" \
               f"{'cookie' in echo['headers']} refused {refused}"

    def plain_aiohttp() -> str:
        import aiohttp

        async def go() -> str:
            async with aiohttp.ClientSession() as sess:
                async with sess.post(base + "/echo", json={"q": "aio"}) as r:
                    echo = await r.json()
                async with sess.get(base + "/stream?n=3&ms=0") as r:
                    body = await r.read()
            return f"{echo['method']} {echo['path']} {body!r}"
        return asyncio.run(go())

    def subprocess_tool() -> str:
        convo: list[dict[str, Any]] = [{"role": "user", "content": "fetch /echo with a tool"}]
        r = oc.chat.completions.create(model="m-agent", messages=convo, tools=TOOLS)
        m = r.choices[0].message
        convo.append(m.model_dump(exclude_none=True))
        call = m.tool_calls[0]
        path = json.loads(call.function.arguments)["path"]
        out = subprocess.run([sys.executable, str(HERE / "fetch_tool.py"), base, path],
                             capture_output=True, text=True, timeout=60)
        convo.append({"role": "tool", "tool_call_id": call.id, "content": out.stdout})
        r2 = oc.chat.completions.create(model="m-agent", messages=convo, tools=TOOLS)
        return f"tool said {out.stdout.strip()!r} rc={out.returncode} " \
               f"final {r2.choices[0].message.content!r}"

    for name, fn in [("openai_sync", openai_sync), ("openai_async", openai_async),
                     ("openai_stream", openai_stream), ("openai_retry", openai_retry),
                     ("openai_timeout", openai_timeout), ("anthropic_sync", anthropic_sync),
                     ("anthropic_async", anthropic_async), ("anthropic_stream", anthropic_stream),
                     ("httpx", plain_httpx), ("requests", plain_requests),
                     ("aiohttp", plain_aiohttp), ("subprocess_tool", subprocess_tool)]:
        if only and name not in only:
            continue
        section(name, fn)
    print("pid", os.getpid(), hashlib.sha256(os.urandom(8)).hexdigest()[:12])
    return 0


if __name__ == "__main__":
    sys.exit(main())
