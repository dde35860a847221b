"""Build replay: a recording of one build judged against another (``replay --build``).

What is strict: the requests the program makes to models, tools and effects (matched by
the Python hooks, with incidental values masked: ``interpose.incidental``), how many of
them each process makes, and the exit status of the process tree. What is drift: every
channel of the C tape (``shim_c/build.c``), counted per channel. This module holds the
report; which workspace files are the build's code, and where they come from, is
``buildcode``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

from stenograph.interpose.fingerprint import json_diff, request_json
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.exchanges import is_lost_body
from stenograph.recorder.reader import Event

SEMANTIC_CHANNELS = ("model", "http", "tool")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _turns(events: Sequence[Event]) -> dict[tuple[str, str, int], int]:
    """The turn each recorded call belongs to: a model request opens the next turn; the
    calls after its reply belong to it."""
    out: dict[tuple[str, str, int], int] = {}
    turn = 0
    for ev in events:
        if ev.kind != "Exchange":
            continue
        b = ev.body
        ch = str(b.get("channel"))
        if ch == "model":
            turn += 1
        if isinstance(b.get("pos"), int):
            out[(str(b.get("proc")), ch, b["pos"])] = turn
    return out


def _call(entry: Mapping[str, Any], channel: str) -> str:
    req = entry.get("request") or {}
    return f"{channel} #{entry.get('pos')} {req.get('method', '?')} {req.get('url', '?')}"


def drift_counts(tape: Path) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Per channel, how many tape records did not fit the build (``build.c``), and the
    first miss of each channel as the shim described it."""
    counts: dict[str, int] = {}
    first: list[dict[str, Any]] = []
    path = tape / "divergence"
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            kind, *fields = line.split("\t")
            kv = dict(f.split("=", 1) for f in fields if "=" in f)
            if kind == "drift-count":
                ch = kv.get("channel", "?")
                counts[ch] = counts.get(ch, 0) + int(kv.get("count", "0") or 0)
            elif kind == "drift":
                first.append({"proc": kv.get("proc"), "thread": kv.get("thread"),
                              "channel": kv.get("channel"), "position": kv.get("pos"),
                              "recorded": kv.get("recorded"), "asked": kv.get("asked")})
    masked = len(read_jsonl(tape / "build-masked.jsonl"))
    if masked:
        counts["request values"] = masked
    return counts, first


def report(file: str, tape: Path, events: Sequence[Event], ended: Mapping[str, Any],
           result: Any, argv: list[str], compare_output: bool) -> dict[str, Any]:
    """The build replay's verdict: semantic divergences, drift counts, exit status."""
    turns = _turns(events)
    divs: list[dict[str, Any]] = []
    for d in read_jsonl(tape / "build-divergence.jsonl"):
        divs.append({"turn": d.get("turn"), "channel": d.get("channel"), "call": d.get("call"),
                     "kind": d.get("kind"), "proc": d.get("proc"),
                     "nearest": d.get("nearest"), "diff": d.get("diff") or [],
                     **{k: d[k] for k in ("request", "nearest_is") if k in d}})
    served: dict[tuple[str, str], set[int]] = {}
    for s in read_jsonl(tape / "build-served.jsonl"):
        if isinstance(s.get("pos"), int):
            served.setdefault((str(s.get("proc")), str(s.get("channel"))), set()).add(s["pos"])
    if not divs:
        divs = _missing(tape, served, turns)
    status = {"recorded": ended.get("status"), "replayed": result.status}
    if not divs and status["recorded"] != status["replayed"]:
        divs.append({"turn": max(turns.values(), default=0), "channel": "exit",
                     "call": "the process tree's exit status", "kind": "changed",
                     "proc": "0", "diff": [{"path": "status", "recorded": status["recorded"],
                                            "asked": status["replayed"]}]})
    counts, first = drift_counts(tape)
    out: dict[str, Any] = {"file": file, "argv": argv, "mode": "build", "divergences": divs,
                           "drift": counts, "drift_first": first, "exit_status": status}
    if compare_output:
        same = {"stdout": result.stdout_sha256 == ended.get("stdout_sha256"),
                "stderr": result.stderr_sha256 == ended.get("stderr_sha256")}
        out["identical"] = same
        if not divs and not all(same.values()):
            different = [k for k, v in same.items() if not v]
            out["divergences"].append({
                "turn": max(turns.values(), default=0), "channel": "output",
                "call": ", ".join(different), "kind": "changed", "proc": "0",
                "diff": [{"path": k, "recorded": ended.get(f"{k}_sha256"),
                          "asked": getattr(result, f"{k}_sha256")} for k in different]})
    return out


def _missing(tape: Path, served: Mapping[tuple[str, str], set[int]],
             turns: Mapping[tuple[str, str, int], int]) -> list[dict[str, Any]]:
    """Each recorded call the build never made: its request, and a diff against the call
    of its channel the build did make just before it (after it, when none came before)."""
    divs: list[dict[str, Any]] = []
    blobs = BlobStore(tape / "blobs")

    def req(entry: Mapping[str, Any]) -> dict[str, Any]:
        r = entry.get("request") or {}
        body = r.get("body")
        if not isinstance(body, bytes):
            try:
                body = blobs.get(BlobRef.from_body(body)) if not is_lost_body(body) else b""
            except Exception:  # a body the tape does not hold: shown empty
                body = b""
        return {"method": str(r.get("method", "?")), "url": str(r.get("url", "?")),
                "body": body}

    for path in sorted((tape / "py").glob("*.msgpack")):
        proc = path.stem
        streams = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
        for ch in SEMANTIC_CHANNELS:
            entries = streams.get(ch) or []
            made = [e for e in entries if e.get("pos") in served.get((proc, ch), set())]
            for entry in entries:
                pos = entry.get("pos")
                if pos in served.get((proc, ch), set()):
                    continue
                before = [e for e in made if isinstance(pos, int) and e.get("pos", 0) < pos]
                near = before[-1] if before else (made[0] if made else None)
                rec = req(entry)
                doc: dict[str, Any] = {
                    "turn": turns.get((proc, ch, pos)), "channel": ch,
                    "call": _call(entry, ch), "kind": "missing", "proc": proc,
                    "request": request_json(rec)}
                if near is None:
                    doc["diff"] = [{"path": "call", "recorded": _call(entry, ch),
                                    "asked": None}]
                else:
                    doc["nearest"] = near.get("pos")
                    doc["nearest_is"] = "the nearest call of its channel the build made"
                    doc["diff"] = json_diff(rec, req(near))
                divs.append(doc)
    return divs


def print_report(rep: Mapping[str, Any], echo: Any) -> None:
    """The human form: one block per divergence, one drift line, a verdict."""
    for d in rep["divergences"]:
        turn = d.get("turn")
        where = f"turn {turn}" if turn else "before the first turn"
        what = {"changed": "changed", "unrecorded": "not in the recording",
                "missing": "recorded but not made"}.get(str(d.get("kind")), d.get("kind"))
        echo(f"stenograph: divergence: {where}, {d['channel']}: {d['call']} ({what})")
        req = d.get("request")
        if isinstance(req, dict) and d.get("kind") != "changed":
            what = "recorded" if d.get("kind") == "missing" else "asked"
            echo(f"  {what}: {req.get('method')} {req.get('url')} body {_short(req.get('body'))}")
        if d.get("nearest") is not None:
            against = d.get("nearest_is") or "the nearest recorded call"
            echo(f"  against {against}, #{d['nearest']}:")
        for c in d.get("diff") or []:
            echo(f"  {c['path']}:")
            echo(f"    recorded {_short(c.get('recorded'))}")
            echo(f"    asked    {_short(c.get('asked'))}")
    for note in rep.get("notes") or []:
        echo(f"stenograph: note: {note}")
    drift = rep.get("drift") or {}
    if drift:
        echo("stenograph: drift (not failures): " + ", ".join(
            f"{ch} {n}" for ch, n in sorted(drift.items())))
    if not rep["divergences"]:
        st = rep["exit_status"]
        echo(f"stenograph: build replay matches: every recorded call made, exit status "
             f"{st['replayed']}")


def _short(v: Any, width: int = 160) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= width else s[: width - 3] + "..."
