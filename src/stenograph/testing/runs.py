"""Agent-shaped trajectories written straight into a store, many at once: for the cold
tier's soak test and benchmark (10,000 runs recorded for real would take hours).

Each run has what an archive is asked about: a ``RunStarted`` with labels, model turns
as the OpenAI chat API has them on the wire (the request's messages, a reply with tool
calls and usage), a tool's HTTP exchange after each (one in eight fails with a 500), an
effect's intent before a payment, and ``RunEnded``. The tape (``TapeChunk``) is left
out: its bytes are the recorder's, not the agent's, and a benchmark of them is
``bench/wal.py``'s.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store

TOOLS = ("list_dir", "read_file", "run", "deploy", "pay")
TENANTS = ("acme", "globex", "initech", "umbrella")
MODELS = ("gpt-4o", "gpt-4o-mini", "claude-sonnet")


def write_runs(store: Path, n: int, *, seed: int = 0, start: float = 1.7e9,
               turns: tuple[int, int] = (2, 6)) -> int:
    """``n`` ended runs into ``store``; returns the events written."""
    rng = random.Random(seed)
    events = 0
    with Store(store) as s:
        for i in range(n):
            traj = f"run-{i:06d}"
            model = MODELS[i % len(MODELS)]
            t = start + i * 37.0
            def app(kind: str, body: dict[str, object], traj: str = traj) -> None:
                s.append(traj, kind, body, durable=False)

            app("RunStarted", {"argv": ["python", "agent.py"], "cwd": "/srv/agent",
                               "started": t, "labels": {"tenant": TENANTS[i % 4],
                                                        "team": f"team{i % 7}"}})
            events += 1
            messages: list[dict[str, object]] = [{"role": "user", "content": "ship it"}]
            for turn in range(rng.randint(*turns)):
                t += rng.uniform(0.5, 4.0)
                tool = rng.choice(TOOLS)
                call = {"id": f"call_{turn}", "type": "function", "function": {
                    "name": tool, "arguments": json.dumps({"target": f"web{turn}"})}}
                reply = {"id": f"chatcmpl-{i}-{turn}", "object": "chat.completion",
                         "model": model, "choices": [{"index": 0, "finish_reason":
                                                      "tool_calls", "message": {
                             "role": "assistant", "content": None, "tool_calls": [call]}}],
                         "usage": {"prompt_tokens": 40 * (turn + 1) + rng.randint(0, 30),
                                   "completion_tokens": rng.randint(8, 40)}}
                app("Exchange", {"proc": "0", "channel": "model", "pos": 2 * turn, "at": t,
                                 "request": {"method": "POST",
                                             "url": "http://127.0.0.1/v1/chat/completions",
                                             "body": json.dumps({"model": model,
                                                                 "messages": messages}).encode()},
                                 "response": {"status": 200, "headers": [
                                     ["content-type", "application/json"]],
                                     "body": json.dumps(reply).encode()}})
                events += 1
                if tool == "pay":
                    app("ToolIntent", {"call_id": f"0/http/{2 * turn + 1}", "channel": "http",
                                       "proc": "0", "pos": 2 * turn + 1, "epoch": 0,
                                       "target": "POST http://pay/charge",
                                       "idempotency_key": f"{traj}-{turn}"})
                    events += 1
                status = 500 if rng.random() < 0.125 else 200
                out = ("error: upstream timed out" if status == 500 else
                       "ok " + "x" * rng.randint(20, 400)).encode()
                app("Exchange", {"proc": "0", "channel": "http", "pos": 2 * turn + 1,
                                 "at": t + 0.2, "request": {
                                     "method": "POST", "url": f"http://tools/{tool}"},
                                 "response": {"status": status, "headers": [], "body": out}})
                events += 1
                messages = [*messages, {"role": "assistant", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call["id"],
                             "content": out.decode()}][-8:]
            app("RunEnded", {"status": 0, "at": t + 1.0})
            events += 1
        s.flush()
    return events


DEPLOY_AND_FAILED = ("SELECT traj FROM events GROUP BY traj HAVING "
                     "bool_or(list_contains(tool_names, 'deploy')) AND bool_or(ok = false) "
                     "ORDER BY traj")
"""The question the archive is asked in the soak test and the benchmark."""


def deploy_and_failed(store: Path) -> list[str]:
    """The answer to ``DEPLOY_AND_FAILED`` read from a store: every event, each run's
    turns derived as ``show`` derives them."""
    from stenograph.harness.trajectory import Deriver, ModelReplied, ToolResult

    by: dict[str, list[object]] = {}
    for ev in StoreReader(store).events():
        by.setdefault(ev.traj, []).append(ev)
    out = []
    for traj, evs in by.items():
        d = Deriver()
        deploy = failed = False
        for ev in evs:
            for x in d.feed(ev):  # type: ignore[arg-type]
                if isinstance(x, ModelReplied):
                    deploy |= any(c.name == "deploy" for c in x.reply.tool_calls)
                elif isinstance(x, ToolResult):
                    failed |= not x.ok
        if deploy and failed:
            out.append(traj)
    return sorted(out)
