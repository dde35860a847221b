"""The loopback model server against the clients stenograph must record.

The interposition layer is tested against this server, so it has to be right first:
the official SDKs (openai 3 and anthropic 2, sync, async and streaming, tool calls)
must parse what it sends, plain httpx2 / httpx / requests / aiohttp must get HTTP/1.1
with keep-alive and chunked bodies, the knobs must produce the failures they promise,
and the same request must get the same bytes. The demo agents run as real
subprocesses, as ``make demo`` runs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx
import httpx2
import openai
import pytest
import requests

from stenograph.errors import BadInput
from stenograph.testing import Knobs, ModelServer, load_script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

TOOLS_OPENAI: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
TOOLS_ANTHROPIC: list[Any] = [
    {
        "name": "list_dir",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
SCRIPT = [
    {
        "text": "Let me look around.",
        "tool_calls": [
            {"name": "list_dir", "arguments": {"path": "."}},
            {"name": "list_dir", "arguments": '{"path": "src/stenograph"}'},
        ],
    },
    {"text": "Two directories, both fine. Done."},
]
USER: list[Any] = [{"role": "user", "content": "what is here?"}]
AUTH = {"authorization": "Bearer test-key"}


@pytest.fixture
def srv() -> Iterator[ModelServer]:
    with ModelServer(script=SCRIPT) as s:
        yield s


def oai(srv: ModelServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_base_url, api_key="test-key", **kw)


def ant(srv: ModelServer, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="test-key", **kw)


# --------------------------------------------------------------------------- openai


def test_openai_sync_tool_calls_then_answer(srv: ModelServer) -> None:
    client = oai(srv)
    r = client.chat.completions.create(model="gpt-test", messages=USER, tools=TOOLS_OPENAI)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look around."
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["list_dir", "list_dir"]  # type: ignore[union-attr]
    assert [json.loads(c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
        {"path": "."},
        {"path": "src/stenograph"},
    ]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert r.id.startswith("chatcmpl-") and r.model == "gpt-test"
    assert r.usage is not None and r.usage.total_tokens == (
        r.usage.prompt_tokens + r.usage.completion_tokens
    )

    # The turn is the number of assistant messages already sent: turn 2 answers.
    history = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": "a\nb"} for c in calls),
    ]
    r2 = client.chat.completions.create(model="gpt-test", messages=history, tools=TOOLS_OPENAI)
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "Two directories, both fine. Done."
    assert r2.choices[0].message.tool_calls is None

    # Past the end of the script: a plain stop reply, never a loop of tool calls.
    history.append(r2.choices[0].message.model_dump(exclude_none=True))
    r3 = client.chat.completions.create(model="gpt-test", messages=history)
    assert "script exhausted" in (r3.choices[0].message.content or "")

    models = client.models.list()
    assert [m.id for m in models.data] == ["steno-scripted-1"]


def test_openai_stream_matches_non_stream(srv: ModelServer) -> None:
    client = oai(srv)
    whole = client.chat.completions.create(model="m", messages=USER, tools=TOOLS_OPENAI)
    stream = client.chat.completions.create(
        model="m",
        messages=USER,
        tools=TOOLS_OPENAI,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, calls, finish, usage, n = "", {}, None, None, 0
    for chunk in stream:
        n += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": None, "name": "", "args": ""})
                if d.id:
                    assert slot["id"] is None, "a tool call id is sent once, in its first delta"
                    slot["id"] = d.id
                if d.function and d.function.name:
                    slot["name"] += d.function.name
                if d.function and d.function.arguments:
                    slot["args"] += d.function.arguments
    assert n > 6, "content and arguments arrive in several deltas"
    assert text == whole.choices[0].message.content
    assert finish == "tool_calls"
    assert usage is not None and usage.total_tokens > 0
    want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]  # type: ignore[union-attr]
    assert [(calls[i]["name"], calls[i]["args"]) for i in sorted(calls)] == want
    assert all(str(c["id"]).startswith("call_") for c in calls.values())

    # The SDK's own accumulator agrees.
    with client.chat.completions.stream(model="m", messages=USER, tools=TOOLS_OPENAI) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "Let me look around."
    assert len(final.choices[0].message.tool_calls or []) == 2


def test_openai_async(srv: ModelServer) -> None:
    async def go() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=srv.openai_base_url, api_key="k")
        async with client:
            r = await client.chat.completions.create(model="m", messages=USER)
            parts = []
            stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
            async for chunk in stream:
                parts.extend(c.delta.content or "" for c in chunk.choices)
        return r.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole == streamed == "Let me look around."


# --------------------------------------------------------------------------- responses

TOOLS_RESPONSES: list[Any] = [
    {
        "type": "function",
        "name": "list_dir",
        "description": "List a directory.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]


def test_responses_sync_tool_calls_then_answer(srv: ModelServer) -> None:
    client = oai(srv)
    r = client.responses.create(model="gpt-test", input="what is here?", tools=TOOLS_RESPONSES)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == "gpt-test" and r.output_text == "Let me look around."
    assert [o.type for o in r.output] == ["message", "function_call", "function_call"]
    calls = [o for o in r.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"path": "."}, {"path": "src/stenograph"}]
    assert all(c.call_id.startswith("call_") and (c.id or "").startswith("fc_") for c in calls)
    assert calls[0].call_id != calls[1].call_id
    assert r.usage is not None and r.usage.total_tokens == (
        r.usage.input_tokens + r.usage.output_tokens
    )
    assert [t.name for t in r.tools if t.type == "function"] == ["list_dir"]

    # The whole turn (message + two calls) sent back is one assistant turn: turn 2.
    history: list[Any] = [
        {"role": "user", "content": "what is here?"},
        *(o.model_dump(exclude_none=True) for o in r.output),
        *({"type": "function_call_output", "call_id": c.call_id, "output": "a"} for c in calls),
    ]
    r2 = client.responses.create(model="gpt-test", input=history, tools=TOOLS_RESPONSES)
    assert r2.output_text == "Two directories, both fine. Done."
    assert [o.type for o in r2.output] == ["message"]

    # previous_response_id carries the earlier turns: the same answer without them.
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "a"} for c in calls]
    r3 = client.responses.create(model="gpt-test", input=outputs, previous_response_id=r.id)
    assert r3.output_text == r2.output_text and r3.previous_response_id == r.id
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")


def test_responses_stream_events_match_non_stream(srv: ModelServer) -> None:
    client = oai(srv)
    whole = client.responses.create(model="m", input=USER, tools=TOOLS_RESPONSES)
    events = list(
        client.responses.create(model="m", input=USER, tools=TOOLS_RESPONSES, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    )
    assert kinds.count("response.output_text.delta") > 1
    assert kinds.count("response.function_call_arguments.done") == 2
    i = kinds.index("response.output_text.done")
    assert kinds[i : i + 3] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    created, done = events[0], events[-1]
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert created.response.output == [] and created.response.usage is None
    assert done.type == "response.completed" and done.response.usage is not None
    # Ids hash the request, stream flag included (as for chat); the rest is equal.
    ids = {"id", "created_at", "output"}
    assert done.response.model_dump(exclude=ids) == whole.model_dump(exclude=ids)
    strip = {"id", "call_id"}
    assert [o.model_dump(exclude=strip) for o in done.response.output] == [
        o.model_dump(exclude=strip) for o in whole.output
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    want = [o for o in whole.output if o.type == "function_call"]
    assert args == "".join(c.arguments for c in want)
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [a.id for a in added] == [o.id for o in done.response.output]

    # The SDK's own accumulator (client.responses.stream) agrees.
    with client.responses.stream(model="m", input=USER, tools=TOOLS_RESPONSES) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == "Let me look around."
    fcalls = [o for o in final.output if o.type == "function_call"]
    assert [c.arguments for c in fcalls] == [c.arguments for c in want]


def test_responses_async_stream(srv: ModelServer) -> None:
    async def go() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=srv.openai_base_url, api_key="k")
        async with client:
            r = await client.responses.create(model="m", input="hi")
            stream = await client.responses.create(model="m", input="hi", stream=True)
            parts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        return r.output_text, "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole == streamed == "Let me look around."


def test_responses_seeded_tool_call_follows_the_schema() -> None:
    with ModelServer(seed=3) as s:
        client = oai(s)
        outs = [
            client.responses.create(model="m", input=f"q{i}", tools=TOOLS_RESPONSES).output
            for i in range(12)
        ]
    calls = [o for out in outs for o in out if o.type == "function_call"]
    assert calls and any(o.type == "message" for out in outs for o in out)
    assert all(isinstance(json.loads(c.arguments)["path"], str) for c in calls)


# --------------------------------------------------------------------------- anthropic


def test_anthropic_sync_tool_use(srv: ModelServer) -> None:
    client = ant(srv)
    m = client.messages.create(
        model="claude-test", max_tokens=64, messages=USER, tools=TOOLS_ANTHROPIC
    )
    assert m.stop_reason == "tool_use" and m.id.startswith("msg_") and m.model == "claude-test"
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"]
    uses = [b for b in m.content if b.type == "tool_use"]
    assert [u.input for u in uses] == [{"path": "."}, {"path": "src/stenograph"}]
    assert all(u.id.startswith("toolu_") for u in uses)
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0

    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "x"} for u in uses],
        },
    ]
    m2 = client.messages.create(model="claude-test", max_tokens=64, messages=history)
    assert m2.stop_reason == "end_turn"
    assert [b.text for b in m2.content if b.type == "text"] == ["Two directories, both fine. Done."]


def test_anthropic_stream_events(srv: ModelServer) -> None:
    client = ant(srv)
    whole = client.messages.create(model="c", max_tokens=64, messages=USER, tools=TOOLS_ANTHROPIC)
    events = list(
        client.messages.create(
            model="c", max_tokens=64, messages=USER, tools=TOOLS_ANTHROPIC, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "text_delta" in deltas and "input_json_delta" in deltas

    with client.messages.stream(
        model="c", max_tokens=64, messages=USER, tools=TOOLS_ANTHROPIC
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Let me look around."
    assert final.stop_reason == "tool_use"
    strip = [b.model_dump(exclude={"id"}) for b in final.content]
    assert strip == [b.model_dump(exclude={"id"}) for b in whole.content]


def test_anthropic_async(srv: ModelServer) -> None:
    async def go() -> tuple[str, str]:
        client = anthropic.AsyncAnthropic(base_url=srv.anthropic_base_url, api_key="k")
        async with client:
            m = await client.messages.create(model="c", max_tokens=64, messages=USER)
            async with client.messages.stream(model="c", max_tokens=64, messages=USER) as s:
                parts = [t async for t in s.text_stream]
                final = await s.get_final_message()
        first = m.content[0]
        assert first.type == "text" and final.stop_reason == "tool_use"
        return first.text, "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole == streamed == "Let me look around."


# --------------------------------------------------------------------------- plain HTTP


def _check_echo(obj: dict[str, Any], method: str = "POST") -> None:
    assert obj["method"] == method and obj["path"] == "/echo" and obj["query"] == "q=1"
    assert obj["headers"]["x-probe"] == "yes"
    if method == "POST":
        assert obj["body"] == '{"a": 1}'


@pytest.mark.parametrize("lib", ["httpx2", "httpx"])
def test_echo_httpx_family(srv: ModelServer, lib: str) -> None:
    mod: Any = httpx2 if lib == "httpx2" else httpx
    with mod.Client() as c:
        r1 = c.post(srv.url + "/echo?q=1", content=b'{"a": 1}', headers={"x-probe": "yes"})
        r2 = c.get(srv.url + "/echo?q=1", headers={"x-probe": "yes"})
        streamed = c.get(srv.url + "/stream?n=4").content
    _check_echo(r1.json())
    _check_echo(r2.json(), "GET")
    assert r1.http_version == "HTTP/1.1"
    assert streamed == b"chunk 0\nchunk 1\nchunk 2\nchunk 3\n"
    ports = [r.client_port for r in srv.requests]
    assert len(set(ports)) == 1, "one pooled keep-alive connection served all three"


def test_echo_requests(srv: ModelServer) -> None:
    with requests.Session() as s:
        r1 = s.post(srv.url + "/echo?q=1", data=b'{"a": 1}', headers={"x-probe": "yes"})
        chunks = list(s.get(srv.url + "/stream?n=3", stream=True).iter_content(None))
        r2 = s.get(srv.url + "/slow?ms=20")
    _check_echo(r1.json())
    assert b"".join(chunks) == b"chunk 0\nchunk 1\nchunk 2\n"
    assert r2.json() == {"slept_ms": 20}
    assert len({r.client_port for r in srv.requests}) == 1


def test_echo_aiohttp(srv: ModelServer) -> None:
    async def go() -> tuple[Any, bytes]:
        async with aiohttp.ClientSession() as s:
            async with s.post(
                srv.url + "/echo?q=1", data=b'{"a": 1}', headers={"x-probe": "yes"}
            ) as r:
                obj = await r.json()
            async with s.get(srv.url + "/stream?n=2") as r:
                body = b"".join([c async for c in r.content.iter_any()])
        return obj, body

    obj, body = asyncio.run(go())
    _check_echo(obj)
    assert body == b"chunk 0\nchunk 1\n"


def test_api_key_required(srv: ModelServer) -> None:
    body = {"model": "m", "messages": USER}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body)
    assert r.status_code == 401 and "credentials" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/messages", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(srv.url + "/v1/messages", json=body, headers={"x-api-key": "anything"})
    assert r.status_code == 200
    r = httpx.post(srv.url + "/v1/chat/completions", content=b"{nope", headers=AUTH)
    assert r.status_code == 400


# --------------------------------------------------------------------------- knobs


def test_retry_knob_openai_retries_a_500(srv: ModelServer) -> None:
    client = oai(srv, default_headers={"x-steno-test": "fail=1"})
    r = client.chat.completions.create(model="m", messages=USER)
    assert r.choices[0].message.content == "Let me look around."
    seen = srv.requests_to("/v1/chat/completions")
    assert [(q.attempt, q.status) for q in seen] == [(1, 500), (2, 200)]
    assert seen[0].body == seen[1].body
    assert seen[1].headers.get("x-stainless-retry-count") == "1"


def test_server_wide_knobs_and_anthropic_retry() -> None:
    with ModelServer(script=SCRIPT, knobs=Knobs(fail=2, fail_status=503)) as s:
        m = ant(s).messages.create(model="c", max_tokens=8, messages=USER)
        assert m.stop_reason == "tool_use"
        assert [q.status for q in s.requests] == [503, 503, 200]
        with pytest.raises(openai.InternalServerError):
            oai(s, max_retries=0).chat.completions.create(model="m", messages=USER)


def test_close_and_delay_knobs(srv: ModelServer) -> None:
    with pytest.raises(openai.APIConnectionError):
        oai(srv, max_retries=0, default_headers={"x-steno-test": "close"}).models.list()
    assert srv.requests[-1].closed and srv.requests[-1].status is None

    r = oai(srv, max_retries=1, default_headers={"x-steno-test": "close=1"}).models.list()
    assert r.data and [q.closed for q in srv.requests[-2:]] == [True, False]

    slow = oai(srv, max_retries=0, timeout=0.1, default_headers={"x-steno-test": "delay_ms=400"})
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        slow.chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - t0 < 0.4

    with pytest.raises(requests.ConnectionError):
        requests.get(srv.url + "/echo", headers={"x-steno-test": "close"})
    r2 = requests.get(srv.url + "/echo", headers={"x-steno-test": "no-such-knob=1"})
    assert r2.status_code == 400 and "no_such_knob" in r2.text


def test_cut_stream_knob(srv: ModelServer) -> None:
    client = oai(srv, max_retries=0, default_headers={"x-steno-test": "cut_after=3"})
    got: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in client.chat.completions.create(model="m", messages=USER, stream=True):
            got.extend(c.delta.content or "" for c in chunk.choices)
    assert "".join(got) == "Let me "  # role chunk + two words, then the RST


def test_responses_knobs_retry_and_cut(srv: ModelServer) -> None:
    """The knobs apply to /v1/responses as to chat: a 500 in the SDK's error shape is
    retried, and a stream cut after N events is a connection error mid-stream."""
    client = oai(srv, default_headers={"x-steno-test": "fail=1"})
    assert client.responses.create(model="m", input="hi").output_text == "Let me look around."
    seen = srv.requests_to("/v1/responses")
    assert [(q.attempt, q.status) for q in seen] == [(1, 500), (2, 200)]
    cut = oai(srv, max_retries=0, default_headers={"x-steno-test": "cut_after=5"})
    kinds: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for event in cut.responses.create(model="m", input="hi", stream=True):
            kinds.append(event.type)
    assert kinds[-1] == "response.output_text.delta" and len(kinds) == 5


# --------------------------------------------------------------------------- determinism


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(headers=AUTH) as c:
        yield c


def _raw(http: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    r = http.post(url, json=body)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_same_request_same_bytes(http: httpx.Client, path: str, stream: bool) -> None:
    body = {"model": "m", "max_tokens": 32, "messages": USER, "stream": stream}
    with ModelServer(script=SCRIPT) as a, ModelServer(script=SCRIPT) as b:
        first = _raw(http, a.url + path, body)
        assert "date" not in first.headers, "no wall clock in a deterministic response"
        assert _raw(http, a.url + path, body).content == first.content
        again = _raw(http, b.url + path, body)
        assert again.content == first.content, "another server, another port: same bytes"
        assert again.headers == first.headers
    with ModelServer(script=SCRIPT, live_ids=True) as live:
        assert _raw(http, live.url + path, body).content != first.content, "--live-ids"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_same_request_same_bytes(http: httpx.Client, stream: bool) -> None:
    body = {"model": "m", "input": USER, "tools": TOOLS_RESPONSES, "stream": stream}
    with ModelServer(script=SCRIPT) as a, ModelServer(script=SCRIPT) as b:
        first = _raw(http, a.url + "/v1/responses", body)
        assert _raw(http, b.url + "/v1/responses", body).content == first.content
    with ModelServer(script=SCRIPT, live_ids=True) as live:
        assert _raw(http, live.url + "/v1/responses", body).content != first.content


def test_seeded_replies_are_deterministic(http: httpx.Client) -> None:
    def ask(url: str, content: str) -> dict[str, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        return _raw(http, url + "/chat/completions", dict(body, tools=TOOLS_OPENAI)).json()

    servers = [ModelServer(seed=seed).start() for seed in range(6)]
    try:
        base = servers[0].openai_base_url
        assert ask(base, "hello") == ask(base, "hello")
        replies = {json.dumps(ask(s.openai_base_url, "hello")) for s in servers}
        assert len(replies) > 1, "the seed changes the reply"
        # Through the SDK: sometimes a call of an offered tool with schema-shaped
        # arguments, sometimes a sentence.
        client = oai(servers[0])
        msgs = [
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"q{i}"}], tools=TOOLS_OPENAI
            )
            .choices[0]
            .message
            for i in range(12)
        ]
    finally:
        for s in servers:
            s.stop()
    assert any(m.tool_calls for m in msgs) and any(m.content for m in msgs)
    for m in msgs:
        for c in m.tool_calls or []:
            assert c.function.name == "list_dir"  # type: ignore[union-attr]
            assert isinstance(json.loads(c.function.arguments)["path"], str)  # type: ignore[union-attr]


def test_bad_scripts_are_refused(tmp_path: Path) -> None:
    assert load_script({"turns": ["just text"]})[0].text == "just text"
    for bad in ([{"txt": "typo"}], [{}], [{"tool_calls": [{"arguments": {}}]}], "nope"):
        with pytest.raises(BadInput):
            load_script(bad if not isinstance(bad, str) else [1])
    f = tmp_path / "s.json"
    f.write_text("{not json")
    with pytest.raises(BadInput, match=r"s\.json"):
        load_script(f)


# --------------------------------------------------------------------------- processes


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(extra)
    return env


def test_cli_port_file_and_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    script = EXAMPLES / "agent_script.json"
    cmd = [sys.executable, "-m", "stenograph.testing.model_server", "--port", "0"]
    cmd += ["--script", str(script), "--port-file", str(port_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
        port = int(port_file.read_text())
        assert line == f"listening on http://127.0.0.1:{port}\n"
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=AUTH)
        assert r.json()["data"][0]["id"] == "steno-scripted-1"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert err == b""


def _final_answer() -> str:
    return load_script(EXAMPLES / "agent_script.json")[-1].text


def test_example_agents_run_against_the_server() -> None:
    """Both demo agents, as real subprocesses, concurrently (SDK imports are slow)."""
    script = EXAMPLES / "agent_script.json"
    with ModelServer(script=script) as s1, ModelServer(script=script) as s2:
        env1 = _env(OPENAI_BASE_URL=s1.openai_base_url, OPENAI_API_KEY="demo-key")
        env2 = _env(ANTHROPIC_BASE_URL=s2.anthropic_base_url, ANTHROPIC_API_KEY="demo-key")
        procs = [
            subprocess.Popen(
                [sys.executable, str(EXAMPLES / name)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, env in (("agent.py", env1), ("anthropic_agent.py", env2))
        ]
        (out1, err1), (out2, err2) = (p.communicate(timeout=60) for p in procs)
        openai_calls = s1.requests_to("/v1/chat/completions")
        anthropic_calls = s2.requests_to("/v1/messages")
    final = f"final answer: {_final_answer()}"

    assert procs[0].returncode == 0, err1
    lines = out1.splitlines()
    assert lines[0].startswith("run ") and " started " in lines[0]
    assert final in lines
    assert any("hello from a tool" in ln for ln in lines), "the run tool ran a real shell"
    assert len(openai_calls) == 4 and all(c.attempt == 1 for c in openai_calls)
    last = openai_calls[-1].json()["messages"]
    assert [m["role"] for m in last].count("tool") == 3

    assert procs[1].returncode == 0, err2
    assert final in out2.splitlines()
    assert len(anthropic_calls) == 4 and all(c.json()["stream"] for c in anthropic_calls)
