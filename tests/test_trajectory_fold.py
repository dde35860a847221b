"""Property tests of the derived trajectory: the fold of every prefix of a log equals the
record computed incrementally, event by event; each turn's record is the fold of the log
up to the next turn; a streamed reply reads the same as its non-streamed twin (the
loopback model server's own encoders make both)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stenograph.harness.formats import API_ANTHROPIC, API_CHAT, API_RESPONSES, reply_of
from stenograph.harness.trajectory import Deriver, Record, build, derive, fold, step
from stenograph.recorder.codec import Event
from stenograph.testing import model_server as ms

NAMES = st.sampled_from(["list_dir", "read_file", "run", "pay"])


def _reply(calls: list[str], tin: int, tout: int) -> bytes:
    msg: dict[str, Any] = {"role": "assistant", "content": None if calls else "done"}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                              "function": {"name": n, "arguments": "{}"}}
                             for i, n in enumerate(calls)]
    return json.dumps({"model": "m", "choices": [{"index": 0, "message": msg,
                                                  "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": tin, "completion_tokens": tout}}).encode()


@st.composite
def logs(draw: Any) -> list[Event]:
    """A plausible log: model turns, calls, effects with and without results,
    approvals, checkpoints, tape chunks, an end or not."""
    events: list[Event] = []
    pos = {"model": 0, "http": 0, "tool": 0}
    intents: list[str] = []

    def add(kind: str, body: dict[str, Any]) -> None:
        n = len(events)
        events.append(Event(n + 1, "t", n, n or None, kind, body))

    add("RunStarted", {"argv": ["agent"]})
    for _ in range(draw(st.integers(0, 25))):
        what = draw(st.sampled_from(["model", "call", "intent", "result", "approval",
                                     "decided", "checkpoint", "chunk"]))
        if what == "model":
            calls = draw(st.lists(NAMES, max_size=3))
            add("Exchange", {"proc": "0", "channel": "model", "pos": pos["model"],
                             "request": {"method": "POST", "url": "http://x/v1/chat/completions",
                                         "body": b"{}"},
                             "response": {"status": 200, "body": _reply(
                                 calls, draw(st.integers(0, 500)), draw(st.integers(0, 99)))}})
            pos["model"] += 1
        elif what == "call":
            ch = draw(st.sampled_from(["http", "tool"]))
            add("Exchange", {"proc": "0", "channel": ch, "pos": pos[ch],
                             "request": {"method": "GET", "url": "http://svc/x"},
                             "response": {"status": draw(st.sampled_from([200, 500]))}})
            pos[ch] += 1
        elif what == "intent":
            cid = f"0/http/{pos['http']}"
            intents.append(cid)
            add("ToolIntent", {"call_id": cid, "target": "POST http://svc/pay"})
        elif what == "result" and intents:
            cid = draw(st.sampled_from(intents))
            add("Exchange", {"proc": "0", "channel": "http", "pos": int(cid.split("/")[2]),
                             "request": {"method": "POST", "url": "http://svc/pay"},
                             "response": {"status": 200}})
        elif what == "approval":
            add("ApprovalRequested", {"call_id": f"0/approval/{draw(st.integers(0, 3))}",
                                      "call": "pay"})
        elif what == "decided":
            add("ApprovalResolved", {"call_id": f"0/approval/{draw(st.integers(0, 3))}",
                                     "decision": "approved"})
        elif what == "checkpoint":
            add("Checkpoint", {"at": "turn"})
        else:
            add("TapeChunk", {"proc": "0", "data": b"x"})
    if draw(st.booleans()):
        add("RunEnded", {"status": draw(st.integers(0, 3))})
    return events


@settings(max_examples=150, deadline=None)
@given(logs())
def test_fold_of_every_prefix_equals_the_incremental_record(events: list[Event]) -> None:
    d = Deriver()
    rec = Record()
    for k, ev in enumerate(events, 1):
        for x in d.feed(ev):
            rec = step(rec, x)
        assert fold(derive(events[:k])) == rec


@settings(max_examples=150, deadline=None)
@given(logs())
def test_record_matches_an_independent_count(events: list[Event]) -> None:
    rec = fold(derive(events))
    models = [e for e in events if e.kind == "Exchange" and e.body["channel"] == "model"]
    assert rec.turn == len(models)
    tokens = [json.loads(e.body["response"]["body"])["usage"] for e in models]
    assert rec.input_tokens == sum(u["prompt_tokens"] for u in tokens)
    assert rec.output_tokens == sum(u["completion_tokens"] for u in tokens)
    called: dict[str, int] = {}
    for e in models:
        for c in json.loads(e.body["response"]["body"])["choices"][0]["message"].get(
                "tool_calls") or []:
            called[c["function"]["name"]] = called.get(c["function"]["name"], 0) + 1
    assert dict(rec.tools_called) == called
    open_, seen = [], set()
    for e in events:  # an intent is open until an exchange at its position comes back;
        # a call id's later intents (a resume's) are the same effect
        if e.kind == "ToolIntent" and e.body["call_id"] not in seen:
            seen.add(e.body["call_id"])
            open_.append(e.body["call_id"])
        elif e.kind == "Exchange" and e.body["channel"] == "http":
            cid = f"0/http/{e.body['pos']}"
            if cid in open_:
                open_.remove(cid)
    assert list(rec.open_intents) == open_
    assert rec.ended == any(e.kind == "RunEnded" for e in events)


@settings(max_examples=100, deadline=None)
@given(logs())
def test_each_turn_record_is_the_fold_up_to_the_next_turn(events: list[Event]) -> None:
    tr = build("t", {}, events)
    starts = [i for i, e in enumerate(events)
              if e.kind == "Exchange" and e.body["channel"] == "model"]
    assert [t.index for t in tr.turns] == list(range(1, len(starts) + 1))
    ends = [*starts[1:], len(events)] if starts else []
    for t, (i, nxt) in zip(tr.turns, zip(starts, ends, strict=True), strict=True):
        assert t.event is events[i]
        assert t.record == fold(derive(events[:nxt]))
    assert tr.record == fold(derive(events))


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=60)
ARGS = st.dictionaries(st.sampled_from(["path", "n", "q"]),
                       st.one_of(st.integers(-5, 5), TEXT), max_size=3)


@st.composite
def turns(draw: Any) -> ms.Turn:
    calls = tuple(ms.ToolCall(name=draw(NAMES), arguments=json.dumps(draw(ARGS)))
                  for _ in range(draw(st.integers(0, 2))))
    text = draw(TEXT)
    if not calls and not text:
        text = "ok"
    return ms.Turn(text=text, tool_calls=calls)


@settings(max_examples=120, deadline=None)
@given(turns(), st.sampled_from([API_CHAT, API_ANTHROPIC, API_RESPONSES]))
def test_a_stream_reads_as_its_whole_reply(turn: ms.Turn, api: str) -> None:
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "input": "hi",
           "stream_options": {"include_usage": True},
           "max_tokens": 10}
    ident = ms._Ident("d" * 64, 1_700_000_000, False)
    body, stream = {
        API_CHAT: (ms.openai_body, ms.openai_stream),
        API_ANTHROPIC: (ms.anthropic_body, ms.anthropic_stream),
        API_RESPONSES: (ms.responses_body, ms.responses_stream),
    }[api]
    whole = reply_of(api, json.dumps(body(req, turn, ident)).encode())
    streamed = reply_of(api, b"".join(stream(req, turn, ident)))
    assert streamed.streamed and not whole.streamed
    assert (streamed.text or "") == (whole.text or "") == turn.text
    assert streamed.tool_calls == whole.tool_calls
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [
        (c.name, json.loads(c.arguments)) for c in turn.tool_calls]
    assert streamed.stop_reason == whole.stop_reason
    assert (streamed.input_tokens, streamed.output_tokens) == (
        whole.input_tokens, whole.output_tokens)


def test_a_failed_model_call_is_a_turn_the_model_never_answered() -> None:
    url = "http://x/v1/chat/completions"
    req = {"method": "POST", "url": url, "body": b'{"model": "m", "messages": []}'}
    events = [
        Event(1, "t", 0, None, "RunStarted", {"argv": ["a"]}),
        Event(2, "t", 1, 1, "Exchange", {"proc": "0", "channel": "model", "pos": 0,
                                         "request": req, "response": {
                                             "status": 500, "body": b'{"error": "boom"}'}}),
        Event(3, "t", 2, 2, "Exchange", {"proc": "0", "channel": "model", "pos": 1,
                                         "request": req, "response": None, "error": {
                                             "type": "ConnectError", "message": "refused"}}),
        Event(4, "t", 3, 3, "Exchange", {"proc": "0", "channel": "model", "pos": 2,
                                         "request": req, "response": {
                                             "status": 200, "body": _reply([], 5, 1)}}),
    ]
    tr = build("t", {}, events)
    assert [t.reply.error for t in tr.turns] == ["HTTP 500", "ConnectError: refused", None]
    assert [t.reply.action for t in tr.turns] == [
        {"failed": "HTTP 500"}, {"failed": "ConnectError: refused"}, {"answer": "done"}]
    from stenograph.harness.trajectory import action_line

    assert action_line(tr.turns[1]).startswith("failed: ConnectError")
    assert tr.record.input_tokens == 5
