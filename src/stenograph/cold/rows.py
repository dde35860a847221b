"""A trajectory as archive rows: one per event, one for the run.

Each event keeps its body exactly as the log packed it (``body``, msgpack), so the
archive gives the trajectory back event for event (``cold/restore.py``); beside it go
the fields a question about runs asks for, derived once here with the same deriver
``show`` uses (``harness/trajectory.Deriver``, on the events as their resumes left
them): the turn, the model and its tokens, the tools it called, a call's target and
whether it succeeded, an effect's state. ``docs/archive.md`` documents every column.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stenograph.harness.trajectory import (
    ContextBuilt,
    Deriver,
    ModelReplied,
    ToolIntent,
    ToolResult,
)
from stenograph.recorder.codec import Event, pack_body, unpack
from stenograph.recorder.effects import fold
from stenograph.recorder.resumes import view

EVENT_COLUMNS = ("traj", "seq", "lsn", "kind", "time", "turn", "served_model",
                 "input_tokens", "output_tokens", "tool_names", "target", "ok", "effect",
                 "body")
RUN_COLUMNS = ("traj", "tenant", "labels", "started", "ended", "date", "model",
               "exit_status", "turns", "events", "input_tokens", "output_tokens", "tools",
               "tool_failures", "effects", "digest", "file", "batch", "source",
               "archived_at")

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def partition_value(value: str | None) -> str:
    """A label as a path component: what the partition directory is named (the exact
    value is in ``labels``)."""
    v = _SAFE.sub("_", value or "")[:64]
    return v if v and v not in (".", "..") else "none"


def digest(events: list[Event]) -> str:
    """What a trajectory's archived copy is checked against: its events' seq, kind and
    packed body, in order."""
    h = hashlib.sha256()
    for ev in events:
        body = pack_body(ev.body)
        h.update(f"{ev.seq}:{ev.kind}:{len(body)}:".encode())
        h.update(body)
    return h.hexdigest()


def _ts(t: Any) -> dt.datetime | None:
    if isinstance(t, (int, float)) and t > 0:
        return dt.datetime.fromtimestamp(float(t), dt.UTC)
    return None


@dataclass
class Finished:
    """Whether a trajectory is done with (archivable), and when it ended."""

    done: bool
    why: str
    ended: float | None
    labels: dict[str, str] = field(default_factory=dict)


def finished(traj: str, events: list[Event]) -> Finished:
    """Ended, with no effect in doubt and no approval waiting: nothing left for a person
    or a resume to do."""
    st = fold(traj, view(events))
    ended = None
    for ev in reversed(events):
        at = ev.body.get("at") if ev.kind == "RunEnded" else None
        if isinstance(at, (int, float)):
            ended = float(at)
            break
    if ended is None:  # a run ended before RunEnded carried its time: its last stamp
        stamps = [ev.body.get("at") or ev.body.get("started") for ev in events]
        nums = [float(s) for s in stamps if isinstance(s, (int, float))]
        ended = max(nums) if nums else None
    if st.state != "ended":
        return Finished(False, st.state, ended, st.labels)
    if any(e.state == "in-doubt" for e in st.effects):
        return Finished(False, "an effect is in doubt", ended, st.labels)
    if any(a.state == "pending" for a in st.approvals):
        return Finished(False, "an approval is waiting", ended, st.labels)
    return Finished(True, "ended", ended, st.labels)


@dataclass
class Rows:
    """One trajectory's rows and where they go."""

    traj: str
    tenant: str
    date: str
    model: str
    events: dict[str, list[Any]]
    run: dict[str, Any]

    @property
    def partition(self) -> str:
        return (f"tenant={partition_value(self.tenant)}/date={self.date}/"
                f"model={partition_value(self.model)}")


def rows_of(traj: str, events: list[Event], bodies: Callable[[Any], bytes],
            done: Finished) -> Rows:
    """The rows of one trajectory's events (in seq order)."""
    derived: dict[int, dict[str, Any]] = {}
    d = Deriver(bodies)
    tools: dict[str, None] = {}
    runs = {"turns": 0, "in": 0, "out": 0, "failures": 0, "effects": 0}
    first_model: str | None = None
    for ev in view(events):
        row: dict[str, Any] = {}
        for x in d.feed(ev):
            row["turn"] = x.turn
            if isinstance(x, ModelReplied):
                r = x.reply
                runs["turns"] += 1
                runs["in"] += r.input_tokens
                runs["out"] += r.output_tokens
                row.update(served_model=r.served_model, input_tokens=r.input_tokens,
                           output_tokens=r.output_tokens,
                           tool_names=[c.name for c in r.tool_calls])
                tools.update((c.name, None) for c in r.tool_calls)
                first_model = first_model or r.served_model
            elif isinstance(x, ContextBuilt):
                continue
            elif isinstance(x, ToolIntent):
                runs["effects"] += 1
                row.update(target=x.target, effect="intent")
            elif isinstance(x, ToolResult):
                runs["failures"] += not x.ok
                row.update(target=x.target, ok=x.ok)
                if ev.kind == "Settled":
                    row["effect"] = "settled"
        derived[ev.seq] = row
    started = next((ev.body.get("started") for ev in events if ev.kind == "RunStarted"), None)
    start_ts = _ts(started) or _ts(done.ended) or dt.datetime.now(dt.UTC)
    cols: dict[str, list[Any]] = {c: [] for c in EVENT_COLUMNS}
    when = start_ts
    exit_status = None
    for ev in events:
        row = derived.get(ev.seq, {})
        at = _ts(ev.body.get("at"))
        when = at or when
        if ev.kind == "RunEnded" and isinstance(ev.body.get("status"), int):
            exit_status = ev.body["status"]
        cols["traj"].append(traj)
        cols["seq"].append(ev.seq)
        cols["lsn"].append(ev.lsn)
        cols["kind"].append(ev.kind)
        cols["time"].append(when)
        cols["turn"].append(row.get("turn"))
        cols["served_model"].append(row.get("served_model"))
        cols["input_tokens"].append(row.get("input_tokens"))
        cols["output_tokens"].append(row.get("output_tokens"))
        cols["tool_names"].append(row.get("tool_names"))
        cols["target"].append(row.get("target"))
        cols["ok"].append(row.get("ok"))
        cols["effect"].append(row.get("effect"))
        cols["body"].append(pack_body(ev.body))
    tenant = done.labels.get("tenant", "")
    model = first_model or ""
    run = {"traj": traj, "tenant": tenant or None, "labels": dict(done.labels),
           "started": start_ts, "ended": _ts(done.ended),
           "date": start_ts.strftime("%Y-%m-%d"), "model": model or None,
           "exit_status": exit_status, "turns": runs["turns"], "events": len(events),
           "input_tokens": runs["in"], "output_tokens": runs["out"], "tools": list(tools),
           "tool_failures": runs["failures"], "effects": runs["effects"],
           "digest": digest(events)}
    return Rows(traj, tenant, run["date"], model, cols, run)


def events_of_table(table: Any) -> dict[str, list[Event]]:
    """The events a Parquet table holds, by trajectory, in seq order."""
    cols = table.select(["traj", "seq", "lsn", "kind", "body"]).to_pydict()
    by: dict[str, list[tuple[int, int, str, bytes]]] = {}
    for traj, seq, lsn, kind, body in zip(cols["traj"], cols["seq"], cols["lsn"],
                                          cols["kind"], cols["body"], strict=True):
        by.setdefault(traj, []).append((seq, lsn, kind, body))
    out: dict[str, list[Event]] = {}
    for traj, rows in by.items():
        rows.sort()
        evs: list[Event] = []
        for seq, lsn, kind, body in rows:
            evs.append(Event(lsn, traj, seq, evs[-1].lsn if evs else None, kind, unpack(body)))
        out[traj] = evs
    return out
