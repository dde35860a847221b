"""Why two recordings of the same task went different ways.

``analyze`` walks both trajectories turn by turn and stops at **t_div**, the first turn
whose chosen action differs (the tool calls with their arguments, or the answer). Then
it asks the question an engineer asks: was the model given the same thing?

* **Same context** (same hash of system prompt, messages and tool schemas): the model
  chose differently on the same input: sampling, serving, or a new model behind the
  same name. The served model versions are compared first, then the sampling
  parameters of the request. The cause is ``model``.
* **Different context**: each difference is found (the message lists aligned, so a
  message dropped by a truncation rule is one difference, not a shifted list of them)
  and traced to where it came from. A tool result is judged by what it read, in this
  order: a file its work stat'ed (``reads``: inside the workspace or not) whose evidence
  differs between the runs (bytes, size, mtime, existence), a changed file of the start
  workspace the call names, or one whose differing lines (or name) the differing result
  shows, or a changed HTTP response: the **environment**; a file read in one run whose
  other run holds no evidence of it: **unknown**, named; a changed code file
  (``CODE_GLOBS``): the **harness**; any other changed workspace file, when the tape
  shows no file read at all: the environment, named as what the tool may have read. A
  value that differs only by a time or an id is the environment too. The system prompt,
  the tool schemas, the message list's shape, and a tool result that changed while every
  file it read is the same, are the **harness**. An earlier reply's text (the same
  action, other words) is the **model**. The cause is the class of the first difference
  in context order that is not a mere time or id; when there are only those, it is the
  environment.

Pure code over two ``Trajectory`` objects; the workspace snapshots and tape chunks are
read through them.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from stenograph.harness import reads
from stenograph.harness.formats import Context, canonical
from stenograph.harness.reads import FileEvidence, ReadIndex
from stenograph.harness.trajectory import Trajectory, Turn
from stenograph.recorder.blobs import BlobRef
from stenograph.recorder.snapshots import CODE_GLOBS, is_code

MODEL, HARNESS, ENVIRONMENT, UNKNOWN, NONE = "model", "harness", "environment", "unknown", "none"
SAMPLING = ("temperature", "top_p", "top_k", "seed", "max_tokens", "max_output_tokens",
            "max_completion_tokens", "frequency_penalty", "presence_penalty", "n",
            "reasoning_effort", "reasoning", "tool_choice", "stop", "response_format")
LIMIT = 50


@dataclass(frozen=True)
class Difference:
    path: str
    a: Any
    b: Any
    source: str
    """``<class>: <what>``, the class being model, harness, environment or unknown."""
    files: tuple[FileEvidence, ...] = ()
    """For a tool result: every file its work read, with both runs' evidence."""

    @property
    def cls(self) -> str:
        return self.source.partition(":")[0]

    @property
    def incidental(self) -> bool:
        return self.source.startswith(f"{ENVIRONMENT}: a time or id")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "a": self.a, "b": self.b, "source": self.source,
                "files": [f.to_json() for f in self.files]}


@dataclass
class Divergence:
    t_div: int | None
    cause: str
    context_identical: bool | None
    differences: list[Difference] = field(default_factory=list)
    turns: tuple[int, int] = (0, 0)
    summary: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"t_div": self.t_div, "cause": self.cause,
                "context_identical": self.context_identical,
                "differences": [d.to_json() for d in self.differences],
                "turns": {"a": self.turns[0], "b": self.turns[1]}, "summary": self.summary}


def analyze(a: Trajectory, b: Trajectory) -> Divergence:
    turns = (len(a.turns), len(b.turns))
    n = min(turns)
    t = next((i for i in range(n) if a.turns[i].reply.action != b.turns[i].reply.action),
             None)
    if t is None:
        return _same_actions(a, b, n, turns)
    ta, tb = a.turns[t], b.turns[t]
    if ta.context.hash == tb.context.hash:
        diffs = _model_side(ta, tb)
        return Divergence(t + 1, MODEL, True, diffs, turns, f"turn {t + 1}: the same "
                          "context, a different choice: model-side (" +
                          (diffs[0].source.partition(': ')[2] if diffs else "sampling") + ")")
    ev = _Evidence(a, b, t)
    calls = {c.id: (c, i) for i, turn in enumerate(a.turns[:t]) for c in turn.reply.tool_calls}
    diffs = _context_diffs(ta.context, tb.context, calls, ev)
    real = [d for d in diffs if not d.incidental]
    cause = real[0].cls if real else ENVIRONMENT
    first = (real or diffs)[0] if diffs else None
    summary = f"turn {t + 1}: the contexts differ" + (
        f"; first at {first.path} ({first.source})" if first else "")
    return Divergence(t + 1, cause, False, diffs[:LIMIT], turns, summary)


def _same_actions(a: Trajectory, b: Trajectory, n: int, turns: tuple[int, int]) -> Divergence:
    if turns[0] == turns[1]:
        diffs = []
        if a.record.exit_status != b.record.exit_status:
            diffs.append(Difference("exit_status", a.record.exit_status, b.record.exit_status,
                                    f"{HARNESS}: after the last turn"))
        return Divergence(None, NONE, None, diffs, turns,
                          f"no divergence: the {n} turn(s) chose the same actions")
    longer = "a" if turns[0] > turns[1] else "b"
    short = b if longer == "a" else a
    end = f"exit {short.record.exit_status}" if short.record.ended else "no end recorded"
    return Divergence(n + 1, HARNESS, None, [Difference(
        "turns", turns[0], turns[1],
        f"{HARNESS}: the same {n} action(s), then one run made no further model call "
        f"({end})")], turns,
        f"turn {n + 1}: only run {longer} has it; the {n} turn(s) before chose the same actions")


def _model_side(ta: Turn, tb: Turn) -> list[Difference]:
    out = []
    if ta.reply.served_model != tb.reply.served_model:
        out.append(Difference("served_model", ta.reply.served_model, tb.reply.served_model,
                              f"{MODEL}: a different model version served the request"))
    if ta.context.model != tb.context.model:
        out.append(Difference("model", ta.context.model, tb.context.model,
                              f"{MODEL}: a different model was asked for"))
    pa, pb = _params(ta), _params(tb)
    for k in sorted(set(pa) | set(pb)):
        if pa.get(k) != pb.get(k):
            out.append(Difference(f"request.{k}", pa.get(k), pb.get(k),
                                  f"{MODEL}: sampling parameters"))
    forked = [w for w, t in (("a", ta), ("b", tb)) if t.event.body.get("replaced_by_fork")]
    why = (f"{MODEL}: the reply of run {forked[0]} was replaced by its fork (--reply)"
           if forked else f"{MODEL}: sampling or serving (same context, same settings)"
           if not out else f"{MODEL}: the reply")
    out.append(Difference("reply", ta.reply.action, tb.reply.action, why))
    return out


def _params(t: Turn) -> dict[str, Any]:
    try:
        doc = json.loads(t.request_body())
    except (ValueError, UnicodeDecodeError):
        return {}
    return {k: doc[k] for k in SAMPLING if isinstance(doc, dict) and k in doc}


class _Evidence:
    """What changed in each run's inputs before t_div: the files each turn's work read
    (from the tape), workspace files (by path inside their root, with their bytes in
    each run), HTTP responses, the command line."""

    def __init__(self, a: Trajectory, b: Trajectory, t: int) -> None:
        self.ma, self.mb = _manifest(a), _manifest(b)
        self.files = sorted(p for p in set(self.ma) | set(self.mb)
                            if self.ma.get(p, (None,))[0] != self.mb.get(p, (None,))[0])
        self.trs = (a, b)
        self.reads = (ReadIndex(a), ReadIndex(b))
        self.http = _changed_http(a, b, t)
        self.argv = (a.started.get("argv"), b.started.get("argv"))

    def for_call(self, name: str | None, args: Any, results: tuple[Any, Any],
                 turn: int | None) -> tuple[str | None, tuple[FileEvidence, ...]]:
        """Why a tool result differs, from what the call read (the turn's work, ``turn``):
        a file it read whose evidence differs; a changed workspace file its arguments
        name, or whose own differing text (or name) is in the results' differing lines;
        a changed HTTP response; a file it read that one run holds no evidence of
        (unknown); the harness's changed code; any other changed workspace file, when
        the tape shows no file read. ``None`` when every input is the same. With the
        files the work read, judged."""
        ra, rb = ((self.reads[0].turn(turn), self.reads[1].turn(turn)) if turn is not None
                  else (None, None))
        read = tuple(reads.compare(ra, rb)) if ra is not None and rb is not None else ()
        text = json.dumps(args, ensure_ascii=False) if not isinstance(args, str) else args
        only = (_lines(results[0]) - _lines(results[1]), _lines(results[1]) - _lines(results[0]))
        data = [e for e in read if e.verdict == reads.DIFFERS and not is_code(e.file, CODE_GLOBS)]
        if data:
            e = max(data, key=lambda e: _named(e.file, text) or _shown(e.file, only))
            more = f"; {len(data) - 1} more file(s) it read differ" if len(data) > 1 else ""
            return (f"{ENVIRONMENT}: tool result: the file {e.file} differs between the runs "
                    f"({e.describe()}){more}"), read
        same = {e.file for e in read if e.verdict == reads.SAME}
        for f in self.files:
            if f not in same and _named(f, text):
                return f"{ENVIRONMENT}: tool result: the file {f} differs between the runs", read
        for f in self.files:
            if is_code(f, CODE_GLOBS) or f in same:
                continue
            base = f.rsplit("/", 1)[-1]
            for side, (m, tr) in enumerate(((self.ma, self.trs[0]), (self.mb, self.trs[1]))):
                shown = _file_lines(tr, m.get(f))
                if any(ln in shown or (base and base in ln) for ln in only[side]):
                    return (f"{ENVIRONMENT}: tool result: the file {f} differs between the "
                            "runs, and the result shows it"), read
        if self.http:
            return f"{ENVIRONMENT}: tool result: the response of {self.http[0]} differs", read
        unknown = [e for e in read
                   if e.verdict == reads.UNKNOWN and not is_code(e.file, CODE_GLOBS)]
        if unknown:
            e = max(unknown, key=lambda e: _named(e.file, text) or _shown(e.file, only))
            more = f"; {len(unknown) - 1} more such file(s)" if len(unknown) > 1 else ""
            return (f"{UNKNOWN}: tool result of {name}: the file {e.file}: "
                    f"{e.describe()}{more}"), read
        unnamed = max(len(ra.unnamed) if ra else 0, len(rb.unnamed) if rb else 0)
        if unnamed:
            return (f"{UNKNOWN}: tool result of {name}: its work read {unnamed} "
                    "file(s) the tape does not name (recorded before stats named their "
                    "files), so whether they differ is not known"), read
        code = sorted({e.file for e in read if e.verdict == reads.DIFFERS} |
                      {f for f in self.files if is_code(f, CODE_GLOBS)})
        if code:
            return (f"{HARNESS}: tool result of {name}: its inputs are the same in both runs "
                    f"and the harness's code differs ({', '.join(code[:3])})"), read
        if self.files and not (ra is not None and rb is not None and (ra.any or rb.any)):
            return (f"{ENVIRONMENT}: tool result: the workspace differs between the runs "
                    f"({', '.join(self.files[:3])}), which the tool may have read"), read
        return None, read


def _named(f: str, text: str) -> bool:
    """Does a call's text name the file (its path, or its name as a word)?"""
    base = f.rsplit("/", 1)[-1]
    return f in text or bool(base and re.search(
        rf"(?<![\w.-]){re.escape(base)}(?![\w-])", text))


def _shown(f: str, only: tuple[set[str], set[str]]) -> bool:
    """Is the file's name in the results' differing lines?"""
    base = f.rsplit("/", 1)[-1]
    return bool(base) and any(base in ln for side in only for ln in side)


def _lines(v: Any) -> set[str]:
    """The meaningful lines of every string in ``v`` (a message, its content)."""
    out: set[str] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.update(ln.strip() for ln in x.splitlines() if len(ln.strip()) >= 3)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return out


def _file_lines(tr: Trajectory, entry: tuple[str, str] | None) -> set[str]:
    """A snapshot file's lines (a small text file only), or nothing."""
    if entry is None or entry[1] != "f" or not entry[0]:
        return set()
    try:
        data = tr.bodies({"$blob": entry[0], "size": 0})
    except Exception:  # an export without the blob: no evidence from it
        return set()
    if len(data) > 1 << 20 or b"\0" in data[:4096]:
        return set()
    return _lines(data.decode("utf-8", "replace"))


def _manifest(tr: Trajectory) -> dict[str, tuple[str, str]]:
    """Each start-snapshot entry by its path inside its root: (digest or link target,
    kind) -- the two runs may have been made in other directories."""
    from stenograph.recorder.snapshots import load_manifest, start_snapshot

    ref = start_snapshot(tr.events)
    if ref is None:
        return {}

    class _Blobs:
        def get(self, r: BlobRef | str) -> bytes:
            sha = r.sha256 if isinstance(r, BlobRef) else r
            size = r.size if isinstance(r, BlobRef) else 0
            return tr.bodies({"$blob": sha, "size": size})

    try:
        m = load_manifest(_Blobs(), ref)  # type: ignore[arg-type]
    except Exception:  # a file exported without its snapshots: no evidence from it
        return {}
    many = len(m.roots) > 1
    return {(f"{os.path.basename(root)}/" if many else "") + e.path:
            (e.sha256 or e.target, e.kind)
            for root, tree in m.trees.items() for e in tree.values() if e.path}


def _changed_http(a: Trajectory, b: Trajectory, t: int) -> list[str]:
    """The calls made before turn t+1 whose responses differ (matched in order)."""
    out = []
    for i in range(t + 1):
        ca = a.before if i == 0 else a.turns[i - 1].calls
        cb = b.before if i == 0 else b.turns[i - 1].calls
        for x, y in zip(ca, cb, strict=False):
            if x.target == y.target and _response(a, x.at.seq) != _response(b, y.at.seq):
                out.append(x.target)
    return out


def _response(tr: Trajectory, seq: int) -> bytes:
    ev = next((e for e in tr.events if e.seq == seq), None)
    if ev is None or ev.kind != "Exchange":
        return b""
    resp = ev.body.get("response")
    if isinstance(resp, dict):
        try:
            return tr.bodies(resp.get("body"))
        except Exception:
            return b""
    return canonical(ev.body.get("result"))


def _context_diffs(ca: Context, cb: Context, calls: dict[str, tuple[Any, int]],
                   ev: _Evidence) -> list[Difference]:
    out: list[Difference] = []
    if canonical(ca.system) != canonical(cb.system):
        out += _leaves("system", ca.system, cb.system, f"{HARNESS}: the system prompt")
    out += _tool_diffs(ca.tools, cb.tools)
    sa = [canonical(m) for m in ca.messages]
    sb = [canonical(m) for m in cb.messages]
    sm = difflib.SequenceMatcher(a=sa, b=sb, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        if op == "replace" and i2 - i1 == j2 - j1:
            for k in range(i2 - i1):
                ma, mb = ca.messages[i1 + k], cb.messages[j1 + k]
                src, files = _message_source(ma, mb, calls, ev)
                out += _leaves(f"messages[{i1 + k}]", ma, mb, src, files)
            continue
        for k in range(i1, i2):
            out.append(Difference(f"messages[{k}]", ca.messages[k], None,
                                  f"{HARNESS}: the message list (only in a: history kept, "
                                  "truncation or ordering)"))
        for k in range(j1, j2):
            out.append(Difference(f"messages[{k}]", None, cb.messages[k],
                                  f"{HARNESS}: the message list (only in b: history kept, "
                                  "truncation or ordering)"))
    return out


def _tool_diffs(a: list[Any], b: list[Any]) -> list[Difference]:
    def by_name(tools: list[Any]) -> dict[str, Any]:
        out = {}
        for i, t in enumerate(tools):
            name = t.get("name") or (t.get("function") or {}).get("name") \
                if isinstance(t, dict) else None
            out[str(name or f"#{i}")] = t
        return out

    na, nb = by_name(a), by_name(b)
    return [Difference(f"tools.{n}", na.get(n), nb.get(n), f"{HARNESS}: the tool schemas")
            for n in sorted(set(na) | set(nb)) if canonical(na.get(n)) != canonical(nb.get(n))]


def _role(m: Any) -> str:
    if not isinstance(m, dict):
        return "?"
    if m.get("type") == "function_call_output" or m.get("role") == "tool":
        return "tool"
    content = m.get("content")
    if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") ==
                                         "tool_result" for c in content):
        return "tool"
    return str(m.get("role") or m.get("type") or "?")


def _tool_call_of(m: dict[str, Any]) -> str | None:
    if "tool_call_id" in m:
        return str(m["tool_call_id"])
    if "call_id" in m:
        return str(m["call_id"])
    for c in m.get("content") or []:
        if isinstance(c, dict) and c.get("type") == "tool_result":
            return str(c.get("tool_use_id"))
    return None


def _message_source(ma: Any, mb: Any, calls: dict[str, tuple[Any, int]],
                    ev: _Evidence) -> tuple[str, tuple[FileEvidence, ...]]:
    role = _role(ma)
    if _only_incidental(canonical(ma).decode(), canonical(mb).decode()):
        return f"{ENVIRONMENT}: a time or id value read by the run", ()
    if role in ("system", "developer"):
        return f"{HARNESS}: the system prompt", ()
    if role == "tool" and isinstance(ma, dict):
        cid = _tool_call_of(ma)
        call, turn = calls.get(cid or "") or (None, None)
        name = getattr(call, "name", None)
        env, files = ev.for_call(name, getattr(call, "arguments", "") if call else cid or "",
                                 (ma, mb), turn)
        if env is not None:
            return env, files
        n = len(files)
        return (f"{HARNESS}: tool result of {name or cid}: its inputs are the same in both "
                "runs" + (f" (the {n} file(s) its work read: the same evidence)" if n else "")
                + ", its result is not (the tool's code or its post-processing)"), files
    if role == "assistant":
        return f"{MODEL}: an earlier reply's text (the same action in other words)", ()
    if role == "user":
        if ev.argv[0] != ev.argv[1]:
            return f"{HARNESS}: the user message (the command lines differ)", ()
        return f"{HARNESS}: the user message (its template)", ()
    return f"{HARNESS}: a message", ()


_TOKEN = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\d{2}:\d{2}:\d{2}(?:\.\d+)?"
    r"|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|(?<![0-9a-fA-F])[0-9a-fA-F]{16,}(?![0-9a-fA-F])"
    r"|(?<!\d)1\d{9,12}(?:\.\d+)?(?!\d)")


def _only_incidental(a: str, b: str) -> bool:
    """Do two texts differ only in times, uuids, long hex ids or epoch numbers?"""
    if a == b:
        return False
    return _TOKEN.sub("\0", a) == _TOKEN.sub("\0", b)


def _leaves(path: str, a: Any, b: Any, source: str,
            files: tuple[FileEvidence, ...] = ()) -> list[Difference]:
    """The differing leaves under ``path`` (strings compared whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if canonical(a.get(k)) != canonical(b.get(k)):
                out += _leaves(f"{path}.{k}", a.get(k), b.get(k), source, files)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if canonical(x) != canonical(y):
                out += _leaves(f"{path}[{i}]", x, y, source, files)
        return out
    return [Difference(path, a, b, source, files)]
