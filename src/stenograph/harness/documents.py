"""A recording's turns as JSON documents: what ``show`` prints and ``show --json`` gives a
script, one turn exactly as the model saw it or the whole run in summary."""

from __future__ import annotations

from typing import Any

from stenograph.harness.formats import loads
from stenograph.harness.source import Recording
from stenograph.harness.trajectory import Trajectory, Turn
from stenograph.recorder.checkpoints import CheckpointInfo


def parent_line(rec: Recording) -> str | None:
    """The line that says a fork's parent and what changed, or None."""
    p = rec.parent
    if p is None:
        return None
    return (f"forked from {p.get('file') or p.get('traj')} (trajectory {p.get('traj')}) "
            f"at turn {p.get('turn')}: {p.get('change', '?')}")


def nearest_checkpoint(cps: list[CheckpointInfo], turn: int) -> CheckpointInfo | None:
    """The checkpoint whose turn is nearest ``turn`` (the earlier of two as near)."""
    if not cps:
        return None
    return min(cps, key=lambda c: (abs(c.turn - turn), c.turn > turn, c.index))


def request_doc(t: Turn) -> dict[str, Any]:
    """The request as sent (after redaction): method, URL, headers, body as JSON."""
    req = t.request
    return {"method": req.get("method"), "url": req.get("url"),
            "headers": [list(h) for h in req.get("headers") or []],
            "body": loads(t.request_body())}


def _from_tools(tr: Trajectory, t: Turn) -> dict[str, Any]:
    """Tool-call id -> (result, source) for the calls of ``t`` that the next request does
    not answer (the last turn, a harness that keeps no history), from the turn's own
    ``stenograph.tool`` calls, matched by name in order."""
    answered = {a.call_id for a in t.results}
    by_seq = {e.seq: e for e in tr.events}
    made = [by_seq.get(c.at.seq) for c in t.calls if c.target.startswith(("tool ", "mcp "))]
    out: dict[str, Any] = {}
    for call in t.reply.tool_calls:
        if call.id in answered:
            continue
        for i, ev in enumerate(made):
            url = str(ev.body.get("request", {}).get("url")) if ev is not None else ""
            if ev is not None and url == f"tool:{call.name}":
                out[call.id] = (ev.body.get("result"), f"tool call {ev.body.get('pos')}")
            elif ev is not None and url.startswith("mcp:") and url.endswith(f"/{call.name}"):
                out[call.id] = (mcp_text(ev.body.get("result")),
                                f"mcp call {ev.body.get('pos')}")
            else:
                continue
            made[i] = None
            break
    return out


def mcp_text(result: Any) -> Any:
    """An MCP call's recorded answer (a ``CallToolResult`` as JSON) as the model would read
    it: its text parts, joined; anything else as it is."""
    if not isinstance(result, bytes):
        return result
    doc = loads(result)
    if isinstance(doc, dict) and isinstance(doc.get("content"), list):
        return "\n".join(str(c.get("text")) for c in doc["content"]
                         if isinstance(c, dict) and "text" in c)
    return doc


def turn_doc(tr: Trajectory, t: Turn, cps: list[CheckpointInfo]) -> dict[str, Any]:
    """One turn in full: the request, the context, the reply, its tool calls and their
    results, the other calls, the nearest checkpoint and the tape position."""
    cp = nearest_checkpoint(cps, t.index)
    results = {a.call_id: a for a in t.results}
    own = _from_tools(tr, t)
    return {
        "turn": t.index,
        "turns": len(tr.turns),
        "request": request_doc(t),
        "context_hash": t.context.hash,
        "context": {"api": t.context.api, "system": t.context.system,
                    "messages": len(t.context.messages), "tools": len(t.context.tools)},
        "reply": t.reply.to_json(),
        "tool_calls": [c.to_json() for c in t.reply.tool_calls],
        "tool_results": [_result(c.id, c.name, results, own) for c in t.reply.tool_calls],
        "calls": [c.to_json() for c in t.calls],
        "approvals": t.approvals,
        "usage": {"input_tokens": t.reply.input_tokens,
                  "output_tokens": t.reply.output_tokens},
        "model": {"asked": t.context.model, "served": t.reply.served_model},
        "record": t.record.to_json(),
        "checkpoint": None if cp is None else {"index": cp.index, "at": cp.at,
                                               "turn": cp.turn, "lsn": cp.lsn},
        "tape": {**t.at.to_json(), "channel": "model"},
    }


def _result(cid: str, name: str, results: dict[str, Any], own: dict[str, Any]
            ) -> dict[str, Any]:
    if cid in results:
        a = results[cid]
        return {"call_id": cid, "name": name, "content": a.content, "is_error": a.is_error,
                "source": "next request"}
    if cid in own:
        value, src = own[cid]
        return {"call_id": cid, "name": name, "content": value, "is_error": None,
                "source": src}
    return {"call_id": cid, "name": name, "content": None, "is_error": None, "source": None}


def summary_doc(rec: Recording, tr: Trajectory) -> dict[str, Any]:
    """Every turn in a line's worth: model, tokens, tool calls or the answer."""
    return {"traj": tr.traj, "file": rec.path, "parent": rec.parent,
            "labels": tr.started.get("labels") or {},
            "turns": [{"turn": t.index, "model": t.reply.served_model,
                       "input_tokens": t.reply.input_tokens,
                       "output_tokens": t.reply.output_tokens,
                       "tool_calls": [c.to_json() for c in t.reply.tool_calls],
                       "answer": None if t.reply.tool_calls else t.reply.text,
                       "calls": [c.to_json() for c in t.calls]} for t in tr.turns],
            "record": tr.record.to_json()}
