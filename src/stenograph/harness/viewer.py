"""``stenograph view``: one recorded run (or two, side by side) as a static HTML page.

The page is read by a person, often long after the run and on another machine, so it
is one self-contained file: inline CSS, a small inline script, no network (a
Content-Security-Policy forbids every fetch and lets only this module's own script
run). What it shows is read from the ``Trajectory``: a header (trajectory, file,
turns, tokens, exit status, the fork's parent), a token chart, and one card per model
turn (model, tokens, the chosen action, the calls and effects with their state, the
approvals and checkpoints, and its work in the world from ``work.py``: the commands it
ran with their exit status and time, the files it changed, how long its model call and
its work took), each expandable to the context the model was given, its reply, the tool
results and the diffs of the files it changed. A timeline puts every model call, every
turn's work and every command on one time axis.

Everything recorded is untrusted text (a web page a tool fetched, a model's answer),
so it reaches the page only as escaped HTML (``html.escape``) or as JSON data that the
script turns into text nodes (never markup); in the JSON every ``<`` is written
``\\u003c``, so no ``</script>`` or ``<!--`` in a message can end the data block.

Long logs stay small: a turn's context is mostly the previous turn's context again,
so a context is sent as "the first K messages of turn B's context, then these", every
message and string once; the overview truncates in the browser, and each message is
capped at ``MESSAGE_CAP`` characters (with a note saying how much is left out; ``show
--turn N --json`` has it whole). Turns are paginated (``page_size``) by the script.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stenograph.harness.formats import Answer, Context, answers_in, canonical, context_of
from stenograph.harness.trajectory import Call, Trajectory, Turn, action_line
from stenograph.harness.work import TurnWork, turn_work

MESSAGE_CAP = 20_000
"""Characters of one message (or result, or argument list) the page carries."""
DEFAULT_PAGE_SIZE = 200
STATES = ("not-sent", "settled", "in-doubt", "done", "failed")
"""The call / effect states a badge shows (class ``state state-<name>``)."""
RECENT = 4
"""How many earlier contexts a context is compared with to find its shared prefix
(more than one: two agents taking turns on one tape interleave their contexts)."""


@dataclass(frozen=True)
class Run:
    """One recording as the page shows it: its trajectory and where it came from."""

    trajectory: Trajectory
    file: str
    parent: dict[str, Any] | None = None


def page_count(turns: int, page_size: int) -> int:
    return max(1, -(-turns // max(1, page_size)))


def render(run: Run, *, other: Run | None = None, divergence: dict[str, Any] | None = None,
           page_size: int = DEFAULT_PAGE_SIZE) -> str:
    """The whole page. With ``other``, both runs side by side (turn N beside turn N)
    and ``divergence`` (``Divergence.to_json()``) as the banner and the marked row."""
    runs = [run] if other is None else [run, other]
    works = [turn_work(r.trajectory) for r in runs]
    t_div = divergence.get("t_div") if divergence else None
    data = {"page_size": max(1, page_size), "t_div": t_div if isinstance(t_div, int) else None,
            "runs": [run_data(r.trajectory, w) for r, w in zip(runs, works, strict=True)]}
    script = _JS
    parts = [
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_csp(script)}\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{_e(_title(runs))}</title><style>{_CSS}</style></head>",
        f"<body class=\"{'diff' if other else 'single'}\">",
        "<div class=\"heads\">", *(_header(r, "ab"[i] if other else "") for i, r in
                                  enumerate(runs)), "</div>",
        banner(divergence, runs) if other is not None else "",
        "<div class=\"charts\">", *(chart(r.trajectory, "tokens-chart" + ("-b" if i else ""))
                                    for i, r in enumerate(runs)), "</div>",
        "<div class=\"charts\">", *(timeline(w, "timeline" + ("-b" if i else ""))
                                    for i, w in enumerate(works)), "</div>",
        "<nav class=\"pager\" id=\"pager\"></nav>",
        "<main id=\"turns\"><noscript><p class=\"note\">The turn list is drawn by the page's "
        "inline script; `stenograph show FILE` prints it as text.</p></noscript></main>",
        "<nav class=\"pager\" id=\"pager-bottom\"></nav>",
        f"<script type=\"application/json\" id=\"steno-data\">{script_json(data)}</script>",
        f"<script>{script}</script></body></html>\n",
    ]
    return "".join(parts)


# -- data: what the script draws the turns from ----------------------------------------


def script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: every ``<`` as ``\\u003c`` (so neither
    ``</script>`` nor ``<!--`` can end or bend the element); U+2028/9 escaped too."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    return (text.replace("<", "\\u003c").replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029"))


@dataclass
class _Tables:
    """Each string, message and tool list of a run once; turns refer to them by index."""

    strings: list[str] = field(default_factory=list)
    cut: dict[int, int] = field(default_factory=dict)
    """String index -> the length of the text it was cut from."""
    msgs: list[tuple[str, list[int]]] = field(default_factory=list)
    toolsets: list[list[str]] = field(default_factory=list)
    _s: dict[str, int] = field(default_factory=dict)
    _m: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict)
    _t: dict[tuple[str, ...], int] = field(default_factory=dict)

    def string(self, text: str | None) -> int:
        if text is None:
            return -1
        i = self._s.get(text)
        if i is None:
            i = self._s[text] = len(self.strings)
            self.strings.append(text[:MESSAGE_CAP])
            if len(text) > MESSAGE_CAP:
                self.cut[i] = len(text)
        return i

    def message(self, m: Any) -> int:
        key = message_parts(m)
        i = self._m.get(key)
        if i is None:
            i = self._m[key] = len(self.msgs)
            self.msgs.append((key[0], [self.string(x) for x in key[1]]))
        return i

    def toolset(self, names: Sequence[str]) -> int:
        key = tuple(names)
        i = self._t.get(key)
        if i is None:
            i = self._t[key] = len(self.toolsets)
            self.toolsets.append(list(key))
        return i


@dataclass
class _Seen:
    """A recent context: its turn's position, its messages, and the sha256 state of
    the context hash after its messages (a context that extends it hashes only what it
    adds: a growing context would otherwise cost its whole length again each turn)."""

    pos: int
    messages: list[Any]
    state: Any


def run_data(tr: Trajectory, work: list[TurnWork] | None = None) -> dict[str, Any]:
    """A run's turns as compact JSON: overview fields, and each context as a delta
    (``work``: ``turn_work(tr)``, when the caller has it already)."""
    tables = _Tables()
    recent: list[_Seen] = []
    turns = []
    last = len(tr.turns) - 1
    nxt = _context(tr.turns[0]) if tr.turns else None
    work = turn_work(tr) if work is None else work
    for pos, t in enumerate(tr.turns):
        ctx, nxt = nxt or _context(t), _context(tr.turns[pos + 1]) if pos < last else None
        base, keep = shared_prefix(ctx.messages, [(s.pos, s.messages) for s in recent])
        digest, state = context_hash(ctx, next((s for s in recent if s.pos == base), None),
                                     keep)
        recent = [*recent[-(RECENT - 1):], _Seen(pos, ctx.messages, state)]
        turns.append(turn_data(t, ctx, tables, base, keep, results=answers_for(t, nxt),
                               digest=digest, open_end=pos == last and not tr.record.ended))
        turns[-1]["work"] = work_data(work[pos], tables)
    return {"traj": tr.traj, "turns": turns, "strings": tables.strings,
            "cut": {str(k): v for k, v in tables.cut.items()}, "msgs": tables.msgs,
            "toolsets": tables.toolsets}


def _context(t: Turn) -> Context:
    """The turn's context, parsed here and not kept on the turn (``Turn.context`` caches
    it: a thousand long contexts held at once would be the whole log in memory)."""
    return context_of(str(t.request.get("url", "")), t.request_body())


def answers_for(t: Turn, nxt: Context | None) -> list[Answer]:
    """``Turn.results``, read from the next turn's context, which is parsed here anyway
    (``Turn.results`` would parse every request a second time)."""
    if nxt is None or not t.reply.tool_calls:
        return []
    ids = {c.id for c in t.reply.tool_calls}
    # the answers are the last messages of the next request: look there first, and
    # through the whole request only when some are not there
    tail = replace(nxt, messages=nxt.messages[-(2 * len(ids) + 4):])
    for ctx in (tail, nxt):
        found = [a for a in answers_in(ctx) if a.call_id in ids]
        if {a.call_id for a in found} == ids:
            return found
    return found


def context_hash(ctx: Context, base: _Seen | None, keep: int) -> tuple[str, Any]:
    """``Context.hash`` (sha256 of the canonical JSON of messages, system and tools,
    keys sorted) fed message by message, from ``base``'s state when the context holds
    all of ``base``'s messages; and the state after this context's messages."""
    if base is not None and keep and keep == len(base.messages):
        h, start = base.state.copy(), keep
    else:
        h, start = hashlib.sha256(b'{"messages":['), 0
    for i in range(start, len(ctx.messages)):
        h.update(b"," + canonical(ctx.messages[i]) if i else canonical(ctx.messages[i]))
    state = h.copy()
    h.update(b'],"system":' + canonical(ctx.system) + b',"tools":' + canonical(ctx.tools)
             + b"}")
    return h.hexdigest(), state


def shared_prefix(msgs: list[Any], recent: Iterable[tuple[int, list[Any]]]) -> tuple[int, int]:
    """(turn position, length) of the longest prefix ``msgs`` shares with a recent
    context, or (-1, 0). The previous turn's context is tried first and is nearly
    always the answer: a context that grows by appending holds it whole."""
    best = (-1, 0)
    for pos, prev in reversed(list(recent)):
        if prev and msgs[:len(prev)] == prev:  # the whole of it (one C-level compare)
            k = len(prev)
        else:
            k = 0
            for x, y in zip(prev, msgs, strict=False):
                if x != y:
                    break
                k += 1
        if k > best[1]:
            best = (pos, k)
        if k == len(prev) and k:
            break
    return best


def turn_data(t: Turn, ctx: Context, tables: _Tables, base: int, keep: int, *,
              results: list[Answer], digest: str, open_end: bool = False) -> dict[str, Any]:
    """One turn for the script. ``open_end``: the run's last turn and the run did not
    end, so a tool call with no result was never made (``not-sent``)."""
    r = t.reply
    answered = {a.call_id for a in results}
    return {
        "n": t.index, "model": r.served_model, "asked": ctx.model, "api": ctx.api,
        "in": r.input_tokens, "out": r.output_tokens, "stop": r.stop_reason,
        "hash": digest[:16],
        "action": action_line(t, 160),
        "text": tables.string(r.text),
        "tcalls": [[c.name, tables.string(_compact(c.arguments)), c.id,
                    "not-sent" if open_end and c.id not in answered else ""]
                   for c in r.tool_calls],
        "results": [[a.call_id, tables.string(_text(a.content)), int(a.is_error)]
                    for a in results],
        "calls": [call_data(c) for c in t.calls],
        "approvals": [[str(a.get("call_id")), str(a.get("call") or a.get("decision") or "")]
                      for a in t.approvals],
        "cps": [[c.index, c.where] for c in t.checkpoints],
        "ctx": [base, keep, [tables.message(m) for m in ctx.messages[keep:]]],
        "sys": tables.string(None if ctx.system is None else _text(ctx.system)),
        "tools": tables.toolset([tool_name(x) for x in ctx.tools]),
    }


def work_data(w: TurnWork, tables: _Tables) -> dict[str, Any]:
    """A turn's work for the script: seconds of its model call and of its work, its
    commands ``[line, status, seconds, cwd]``, its files ``[path, change, diff id]``."""
    doc = w.to_json()
    s0, s1, s2 = w.span
    doc["model_s"] = None if s0 is None or s1 is None else round(s1 - s0, 6)
    doc["work_s"] = None if s1 is None or s2 is None else round(s2 - s1, 6)
    doc["files"] = [[p, ch, -1 if d is None else tables.string("\n".join(d))]
                    for p, ch, d in w.files]
    return doc


def call_data(c: Call) -> list[Any]:
    return [c.target, c.state, int(c.effect)]


def tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return str(tool)
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return str(name if name is not None else tool.get("type", "?"))


def _text(value: Any) -> str:
    """A value as the page prints it: text as itself, the rest as indented JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") in (
            "text", "input_text", "output_text") for b in value) and value:
        return "\n".join(str(b.get("text", "")) for b in value)
    return json.dumps(value, ensure_ascii=False, indent=1, default=repr)


def _compact(value: Any) -> str:
    """Tool-call arguments on one line (the script indents them in the full view)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=repr)


def message_view(m: Any) -> tuple[str, str]:
    """(role, text) of a message of any of the APIs (``message_parts`` joined)."""
    role, parts = message_parts(m)
    return role, "\n".join(parts)


def message_parts(m: Any) -> tuple[str, tuple[str, ...]]:
    """(role, lines) of a message of any of the APIs: content blocks, tool calls and
    tool results written out, so a message reads the same whatever carried it. A tool
    call's arguments and a tool result's content are lines of their own: the same
    strings as the turn's tool calls and results, so the page holds them once."""
    if not isinstance(m, dict):
        return "item", (_text(m),)
    role = str(m.get("role") or m.get("type") or "item")
    lines: list[str] = []
    if m.get("type") == "function_call":  # responses
        lines += [f"→ {m.get('name')}  [{m.get('call_id')}]", _text(m.get("arguments"))]
    elif m.get("type") == "function_call_output":
        lines += [f"← [{m.get('call_id')}]", _text(m.get("output"))]
    if "tool_call_id" in m:
        lines.append(f"← [{m['tool_call_id']}]")
    content = m.get("content")
    if isinstance(content, list):
        for b in content:
            lines += _block(b)
    elif content is not None:
        lines.append(_text(content))
    for c in m.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            lines += [f"→ {fn.get('name')}  [{c.get('id')}]", _text(fn.get("arguments"))]
        else:
            lines.append(f"→ {_text(c)}")
    if not lines:
        rest = {k: v for k, v in m.items() if k != "role"}
        lines.append(_text(rest) if rest else "")
    return role, tuple(lines)


def _block(b: Any) -> list[str]:
    if not isinstance(b, dict):
        return [_text(b)]
    kind = b.get("type")
    if kind in ("text", "input_text", "output_text"):
        return [str(b.get("text", ""))]
    if kind == "tool_use":
        return [f"→ {b.get('name')}  [{b.get('id')}]", _compact(b.get("input"))]
    if kind == "tool_result":
        err = " (error)" if b.get("is_error") else ""
        return [f"← [{b.get('tool_use_id')}]{err}", _text(b.get("content"))]
    if kind in ("image", "image_url", "input_image"):
        return [f"[{kind}]"]
    return [_text(b)]


# -- the parts drawn here: header, banner, chart ---------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _title(runs: list[Run]) -> str:
    names = " vs ".join(r.trajectory.traj for r in runs)
    return f"stenograph: {names}"


def _header(run: Run, label: str) -> str:
    tr, rec = run.trajectory, run.trajectory.record
    exit_text = (f"exit {rec.exit_status}" if rec.exit_status is not None else "ended")\
        if rec.ended else "not ended (running, or stopped before its end)"
    rows = [("file", run.file), ("turns", str(len(tr.turns))),
            ("tokens", f"{rec.input_tokens + rec.output_tokens:,} ({rec.input_tokens:,} in"
                       f" + {rec.output_tokens:,} out)"),
            ("exit", exit_text),
            ("calls", f"{rec.calls_made} made, {rec.settled} effect(s) settled, "
                      f"{len(rec.open_intents)} in doubt, {rec.checkpoints} checkpoint(s)")]
    p = run.parent
    if p is not None:
        rows.append(("forked from", f"{p.get('file') or p.get('traj')} (trajectory "
                                    f"{p.get('traj')}) at turn {p.get('turn')}: "
                                    f"{p.get('change', '?')}"))
    dl = "".join(f"<dt>{_e(k)}</dt><dd class=\"h-{_e(k.split()[0])}\">{_e(v)}</dd>"
                 for k, v in rows)
    tag = f"<span class=\"label\">{_e(label.upper())}</span> " if label else ""
    before = ""
    if tr.before:
        items = "".join(_call_li(c) for c in tr.before)
        before = (f"<div class=\"before\">before the first turn:<ul class=\"calls\">{items}"
                  "</ul></div>")
    return (f"<header class=\"run\" id=\"run-{_e(label or 'a')}\"><h1>{tag}"
            f"<span class=\"traj\">{_e(tr.traj)}</span></h1><dl>{dl}</dl>{before}</header>")


def _call_li(c: Call) -> str:
    return (f"<li><span class=\"kind\">{'effect' if c.effect else 'call'}</span> "
            f"<span class=\"target\">{_e(c.target)}</span> "
            f"<span class=\"state state-{_e(c.state)}\">{_e(c.state)}</span>"
            + (f"<div class=\"did\">did: {_e(c.did)}</div>" if c.did else "") + "</li>")


def _short(value: Any, width: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                          default=repr)
    return text if len(text) <= width else text[:width - 1] + "…"


_GLOSS = {"model": " (the model chose differently)",
          "harness": " (the program built another request)",
          "environment": " (the world answered differently)",
          "unknown": " (the recording holds no evidence either way)",
          "none": " (the same actions throughout)"}


def banner(div: dict[str, Any] | None, runs: list[Run]) -> str:
    """Where and why the two runs part: the analysis's turn, cause, summary and the
    differences it found (each value cut to a few hundred characters)."""
    if div is None:
        return "<section class=\"banner\" id=\"banner\"><p>No analysis.</p></section>"
    t, cause = div.get("t_div"), str(div.get("cause", "?"))
    head = (f"The runs diverge at <a href=\"#t-div\">turn {_e(t)}</a>" if isinstance(t, int)
            else "The runs do not diverge")
    ctx = div.get("context_identical")
    ctx_text = "" if ctx is None else (
        " The context the model was given is identical in both." if ctx else
        " The contexts the model was given differ.")
    rows = "".join(
        f"<tr><td><code>{_e(d.get('path', ''))}</code></td><td>{_e(_short(d.get('a')))}</td>"
        f"<td>{_e(_short(d.get('b')))}</td><td>{_e(d.get('source', ''))}</td></tr>"
        for d in div.get("differences") or [] if isinstance(d, dict))
    table = ("<table class=\"diffs\"><thead><tr><th>path</th><th>A</th><th>B</th>"
             f"<th>source</th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""
    names = " vs ".join(f"{'AB'[i]}: {r.trajectory.traj}" for i, r in enumerate(runs))
    return (f"<section class=\"banner cause-{_e(cause)}\" id=\"banner\">"
            f"<p class=\"verdict\">{head}; cause: <strong class=\"cause\">{_e(cause)}"
            f"</strong>{_e(_GLOSS.get(cause, ''))}.{_e(ctx_text)}</p>"
            f"<p class=\"summary\">{_e(div.get('summary', ''))}</p>{table}"
            f"<p class=\"names\">{_e(names)}</p></section>")


def chart(tr: Trajectory, ident: str) -> str:
    """Input and output tokens per turn: two bar rows, each on its own scale (output
    is often a hundredth of input). One ``g.bar`` per turn; a click opens that turn."""
    n = len(tr.turns)
    if n == 0:
        return (f"<figure class=\"chart\"><p id=\"{ident}\" class=\"note\">no model turns"
                "</p></figure>")
    tin = [t.reply.input_tokens for t in tr.turns]
    tout = [t.reply.output_tokens for t in tr.turns]
    hi_in, hi_out = max(max(tin), 1), max(max(tout), 1)
    h = 50
    bars = []
    for t, a, b in zip(tr.turns, tin, tout, strict=True):
        x = t.index - 1
        ha, hb = a / hi_in * h, b / hi_out * h
        bars.append(f"<g class=\"bar\" data-turn=\"{t.index}\"><title>turn {t.index}: {a} in, "
                    f"{b} out</title><rect class=\"tin\" x=\"{x}\" y=\"{h - ha:.1f}\" "
                    f"width=\"0.8\" height=\"{ha:.1f}\"/><rect class=\"tout\" x=\"{x}\" "
                    f"y=\"{h + 4}\" width=\"0.8\" height=\"{hb:.1f}\"/></g>")
    return (f"<figure class=\"chart\"><figcaption>tokens per turn: input (max {hi_in:,}) "
            f"above, output (max {hi_out:,}) below</figcaption>"
            f"<svg id=\"{ident}\" class=\"tokens\" style=\"max-width:{n * 16}px\" "
            f"viewBox=\"0 0 {n} {2 * h + 4}\" "
            f"preserveAspectRatio=\"none\" role=\"img\"><rect class=\"window\" x=\"0\" "
            f"y=\"0\" width=\"0\" height=\"{2 * h + 4}\"/>{''.join(bars)}</svg></figure>")


def timeline(work: list[TurnWork], ident: str) -> str:
    """The run on one time axis: each model call (blue), each turn's work after it
    (grey) and each command it ran (orange, one row per command at once). One
    ``g.seg`` per piece; a click opens its turn (``work``: ``turn_work``'s)."""
    segs: list[tuple[int, str, float, float, str]] = []  # (turn, cls, start, end, title)
    for i, w in enumerate(work):
        s0, s1, s2 = w.span
        if s0 is not None and s1 is not None:
            segs.append((i + 1, "model", s0, s1, f"turn {i + 1}: model call {s1 - s0:.3f} s"))
        if s1 is not None and s2 is not None and s2 > s1:
            segs.append((i + 1, "work", s1, s2, f"turn {i + 1}: its work {s2 - s1:.3f} s"))
        for c in w.commands:
            end = c.ended if c.ended is not None else (s2 or c.started)
            segs.append((i + 1, "cmd", c.started, end,
                         f"turn {i + 1}: {c.command[:200]} (exit {c.status}, "
                         f"{end - c.started:.3f} s)"))
    if not segs:
        return ("<figure class=\"chart\"><p class=\"note\">no timings recorded (a recording "
                "made before they were noted)</p></figure>")
    t0 = min(x[2] for x in segs)
    span = max(max(x[3] for x in segs) - t0, 1e-6)
    rows = {"model": 0, "work": 0, "cmd": 1}
    lanes: list[float] = []
    out = []
    for turn, cls, a, b, title in segs:
        y = rows[cls] * 10
        if cls == "cmd":  # commands at once go on lanes of their own
            free = next((k for k, end in enumerate(lanes) if end <= a), None)
            if free is None:
                free = len(lanes)
                lanes.append(b)
            lanes[free] = b
            y = 10 + 6 * free
        x, wdt = (a - t0) / span * 1000, max((b - a) / span * 1000, 0.8)
        out.append(f"<g class=\"seg\" data-turn=\"{turn}\"><title>{_e(title)}</title>"
                   f"<rect class=\"{cls}\" x=\"{x:.2f}\" y=\"{y}\" width=\"{wdt:.2f}\" "
                   f"height=\"{8 if cls != 'cmd' else 5}\"/></g>")
    height = 12 + 6 * max(1, len(lanes))
    return (f"<figure class=\"chart\"><figcaption>timeline, {span:.2f} s: model calls (blue), "
            "each turn's work (grey), the commands it ran (orange)</figcaption>"
            f"<svg id=\"{ident}\" class=\"timeline\" viewBox=\"0 0 1000 {height}\" "
            f"preserveAspectRatio=\"none\" role=\"img\">{''.join(out)}</svg></figure>")


def _csp(script: str) -> str:
    """Only this script runs (its hash), nothing is fetched: an escaping mistake could
    at worst show markup, never run a recorded script or send data anywhere."""
    sha = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{sha}'; style-src 'unsafe-inline'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


_CSS = """
:root{--fg:#1d2430;--mute:#5b6573;--line:#d9dee5;--bg:#f6f7f9;--card:#fff;--accent:#2f5bd3}
*{box-sizing:border-box}
body{margin:0;padding:16px 20px 40px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,sans-serif;color:var(--fg);background:var(--bg)}
code,pre,.target,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;background:#f2f4f7;padding:6px 8px;
border-radius:4px;max-height:480px;overflow:auto}
.heads,.charts{display:flex;gap:16px}.heads>*,.charts>*{flex:1;min-width:0}
header.run{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px}
header.run h1{font-size:17px;margin:0 0 6px}
.label{background:var(--accent);color:#fff;border-radius:4px;padding:0 6px;font-size:13px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}
dt{color:var(--mute)}dd{margin:0;word-break:break-all}
.chart{margin:12px 0 0;background:var(--card);border:1px solid var(--line);border-radius:8px;
padding:8px 12px}
figcaption{color:var(--mute);font-size:12px}
svg.tokens{width:100%;height:110px;display:block;cursor:pointer}
rect.tin{fill:#5b7fe0}rect.tout{fill:#e08a3c}rect.window{fill:#2f5bd31a}
g.bar:hover rect{opacity:.6}
svg.timeline{width:100%;height:60px;display:block;cursor:pointer}
rect.model{fill:#5b7fe0}rect.work{fill:#c4cad3}rect.cmd{fill:#e08a3c}
g.seg:hover rect{opacity:.6}
.timing{color:var(--mute);font-size:12px}
ul.cmds,ul.files{list-style:none;margin:4px 0 0;padding:0;font-size:12.5px}
ul.cmds li,ul.files li{margin:1px 0}
.exit{display:inline-block;border-radius:10px;padding:0 6px;font-size:11px;margin-left:6px;
color:#fff;background:#2e8b57}.exit.bad{background:#c0392b}
.change{color:var(--mute);font-size:12px;margin-right:4px}
.banner{margin:12px 0 0;padding:10px 14px;border-radius:8px;border:1px solid #e3b341;
background:#fff8e1}
.banner.cause-none{border-color:#8fcf9b;background:#eefaf0}
.banner table{border-collapse:collapse;margin-top:6px;width:100%}
.banner td,.banner th{border-top:1px solid var(--line);padding:3px 6px;text-align:left;
vertical-align:top;word-break:break-word;font-size:12.5px}
.banner td:first-child{white-space:nowrap;word-break:normal}
.pager{margin:14px 0 8px;display:flex;gap:4px;flex-wrap:wrap;align-items:center}
.pager a{padding:2px 8px;border:1px solid var(--line);border-radius:4px;text-decoration:none;
color:var(--accent);background:var(--card)}
.pager a.current{background:var(--accent);color:#fff}
.pager .range{color:var(--mute);margin-right:8px}
.turn{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 12px;
margin:6px 0;min-width:0}
.turn.focus{outline:2px solid var(--accent)}
.row{display:grid;grid-template-columns:1fr 1fr;gap:12px;border-radius:8px}
.row.differs .turn{border-color:#e3b341}
.row.t-div{background:#ffe08a;padding:4px;margin:4px -4px}
.row.after .turn{opacity:.85}
.missing{color:var(--mute);padding:8px 12px;border:1px dashed var(--line);border-radius:8px;
margin:6px 0}
.thead{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.num{font-weight:700;color:var(--accent);text-decoration:none}
.model{color:var(--mute)}.tok{font-variant-numeric:tabular-nums}
.stop{color:var(--mute);font-size:12px}
.action{margin:4px 0}.tcall code{background:#eef2ff;padding:1px 4px;border-radius:3px}
.answer{color:#184d2b}
ul.calls,ul.marks{list-style:none;margin:4px 0 0;padding:0}
ul.calls li,ul.marks li{margin:2px 0}ul.marks li{font-size:12px;color:var(--mute)}
.kind{color:var(--mute);font-size:12px;margin-right:4px}
.state{display:inline-block;border-radius:10px;padding:0 8px;font-size:11.5px;font-weight:600;
color:#fff;margin-left:6px}
.state-settled{background:#2e8b57}.state-done{background:#3b73c4}
.state-in-doubt{background:#d68910}.state-failed{background:#c0392b}
.state-not-sent{background:#8a939e}
details{margin-top:6px}summary{cursor:pointer;color:var(--accent)}
.ctx h3{font-size:13px;margin:10px 0 2px}
ol.msgs{margin:0;padding-left:22px}
.role{font-weight:600;font-size:12px;text-transform:uppercase;color:var(--mute)}
.role-system{color:#7a4cc2}.role-user{color:#1f7a4a}.role-assistant{color:#2f5bd3}
.role-tool{color:#a05a00}
.note{color:var(--mute);font-size:12px;font-style:italic}
.err{color:#c0392b;font-weight:600}
"""

_JS = r"""
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("steno-data").textContent);
  var runs = D.runs, diff = runs.length > 1, size = D.page_size;
  var rows = 0;
  runs.forEach(function (r) { rows = Math.max(rows, r.turns.length); });
  var pages = Math.max(1, Math.ceil(rows / size));
  var memo = runs.map(function () { return {}; });

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) if (arguments[i]) parent.appendChild(arguments[i]);
    return parent;
  }
  function str(r, i) { return i < 0 ? null : r.strings[i]; }
  function preview(s, n) {
    s = String(s).replace(/\s+/g, " ").trim();
    return s.length > n ? s.slice(0, n - 1) + "\u2026" : s;
  }
  function full(r, ids, json) {  /* a <pre> of the strings (lines), a note for each cut */
    ids = [].concat(ids);
    var box = el("div"), text = ids.map(function (i) { return str(r, i); }).join("\n");
    if (json && ids.length === 1 && !r.cut[String(ids[0])]) {
      try { text = JSON.stringify(JSON.parse(text), null, 1); } catch (e) { /* as written */ }
    }
    add(box, el("pre", null, text));
    ids.forEach(function (i) {
      var cut = r.cut[String(i)];
      if (cut) add(box, el("p", "note", "cut: the first " + r.strings[i].length + " of " +
        cut + " characters (stenograph show FILE --turn N --json has them all)"));
    });
    return box;
  }
  function badge(state) { return el("span", "state state-" + state, state); }
  function secs(x) { return x < 1 ? Math.round(x * 1000) + " ms" : x.toFixed(2) + " s"; }

  function context(k, pos) {  /* a turn's message ids: its base's first keep, then its own */
    var chain = [], p = pos, r = runs[k];
    while (p >= 0 && !memo[k][p]) { chain.push(p); p = r.turns[p].ctx[0]; }
    var ids = p >= 0 ? memo[k][p] : [];
    for (var i = chain.length - 1; i >= 0; i--) {
      var c = r.turns[chain[i]].ctx;
      ids = (c[0] >= 0 ? memo[k][c[0]].slice(0, c[1]) : []).concat(c[2]);
      memo[k][chain[i]] = ids;
    }
    return ids;
  }

  function fill(box, k, pos) {
    var r = runs[k], t = r.turns[pos];
    var ids = context(k, pos), tools = r.toolsets[t.tools];
    add(box, el("h3", null, "Request"),
      el("div", "mono", t.api + " \u00b7 model " + (t.asked || "?") + " \u00b7 context " + t.hash),
      el("div", null, "tools offered (" + tools.length + "): " + (tools.join(", ") || "none")));
    if (t.sys >= 0) add(box, el("div", "role role-system", "system"), full(r, t.sys));
    var ol = el("ol", "msgs");
    ids.forEach(function (id) {
      var m = r.msgs[id], li = el("li", "msg");
      add(li, el("span", "role role-" + m[0], m[0]), full(r, m[1]));
      ol.appendChild(li);
    });
    add(box, el("h3", null, "Messages (" + ids.length + ")"), ol);
    add(box, el("h3", null, "Reply"), el("div", "mono", "stop " + (t.stop || "?") + " \u00b7 " +
      t["in"] + " in / " + t.out + " out \u00b7 served by " + (t.model || "?")));
    if (t.text >= 0) add(box, full(r, t.text));
    t.tcalls.forEach(function (c) {
      add(box, el("div", "mono", "\u2192 " + c[0] + "  [" + c[2] + "]"), full(r, c[1], true));
    });
    var fw = t.work;
    if (fw && fw.files.length) {
      add(box, el("h3", null, "Files this turn changed"));
      fw.files.forEach(function (f) {
        add(box, el("div", "mono", f[1] + " " + f[0]));
        if (f[2] >= 0) add(box, full(r, f[2]));
        else add(box, el("p", "note", "no diff: the recording holds this file's bytes " +
          "before or after the turn only in no snapshot (or it is binary or large)"));
      });
    }
    if (t.tcalls.length) {
      add(box, el("h3", null, "Tool results"));
      if (!t.results.length) {
        add(box, el("p", "note", "not in a later request (the run ended, or they were dropped)"));
      }
      t.results.forEach(function (a) {
        var head = "\u2190 [" + a[0] + "]" + (a[2] ? " error" : "");
        add(box, el("div", "mono" + (a[2] ? " err" : ""), head), full(r, a[1]));
      });
    }
  }

  function card(k, pos, prefix) {
    var r = runs[k], t = r.turns[pos];
    var a = el("article", "turn");
    a.id = prefix + "turn-" + t.n;
    var link = el("a", "num", "#" + t.n);
    link.href = "#" + a.id;
    add(a, add(el("div", "thead"), link, el("span", "model", t.model || "?"),
      el("span", "tok", "in " + t["in"] + " \u00b7 out " + t.out),
      t.stop ? el("span", "stop", t.stop) : null));
    var act = el("div", "action");
    if (t.tcalls.length) {
      t.tcalls.forEach(function (c) {
        var code = c[0] + "(" + preview(str(r, c[1]) || "", 200) + ")";
        var d = add(el("div", "tcall"), el("code", null, code));
        if (c[3]) d.appendChild(badge(c[3]));
        act.appendChild(d);
      });
      if (t.text >= 0) act.appendChild(el("div", "note", preview(str(r, t.text), 200)));
    } else {
      act.appendChild(el("div", "answer", "answer: " + preview(str(r, t.text) || "", 300)));
    }
    a.appendChild(act);
    if (t.calls.length) {
      var ul = el("ul", "calls");
      t.calls.forEach(function (c) {
        add(ul, add(el("li"), el("span", "kind", c[2] ? "effect" : "call"),
          el("span", "target", preview(c[0], 160)), badge(c[1])));
      });
      a.appendChild(ul);
    }
    var w = t.work;
    if (w) {
      var parts = [];
      if (w.model_s !== null) parts.push("model call " + secs(w.model_s));
      if (w.work_s !== null) parts.push("work " + secs(w.work_s));
      if (parts.length) a.appendChild(el("div", "timing", parts.join(" \u00b7 ")));
      if (w.commands.length) {
        var cl = el("ul", "cmds");
        w.commands.forEach(function (c) {
          var ex = el("span", "exit" + (c[1] === "0" ? "" : " bad"),
            c[1] === null ? "no exit" : "exit " + c[1]);
          add(cl, add(el("li", "cmd"), el("span", "kind", "ran"),
            el("code", null, preview(c[0], 200)), ex,
            c[2] === null ? null : el("span", "timing", " " + secs(c[2]))));
        });
        a.appendChild(cl);
      }
      if (w.files.length) {
        var fl = el("ul", "files");
        w.files.forEach(function (f) {
          add(fl, add(el("li", "file"), el("span", "change", f[1]), el("code", null, f[0])));
        });
        a.appendChild(fl);
      }
    }
    if (t.approvals.length || t.cps.length) {
      var marks = el("ul", "marks");
      t.approvals.forEach(function (x) {
        marks.appendChild(el("li", "approval", "approval " + x[0] + ": " + x[1]));
      });
      t.cps.forEach(function (x) {
        marks.appendChild(el("li", "checkpoint", "checkpoint #" + x[0] + " (" + x[1] + ")"));
      });
      a.appendChild(marks);
    }
    var det = el("details", "ctx");
    var n = t.ctx[1] + t.ctx[2].length;
    add(det, el("summary", null, "context: " + n + " message(s), " + r.toolsets[t.tools].length +
      " tool(s); reply" + (t.tcalls.length ? "; tool results" : "")));
    det.addEventListener("toggle", function () { if (det.open) open(det); });
    det.dataset.run = k; det.dataset.pos = pos;
    a.appendChild(det);
    return a;
  }

  function open(det) {
    if (!det.dataset.filled) {
      det.dataset.filled = "1";
      var box = el("div", "body");
      fill(box, +det.dataset.run, +det.dataset.pos);
      det.appendChild(box);
    }
    det.open = true;
  }

  function same(x, y) {
    if (!x || !y) return false;
    return x.hash === y.hash && x.action === y.action;
  }

  function draw(page) {
    var lo = (page - 1) * size, hi = Math.min(rows, page * size);
    var box = document.getElementById("turns");
    box.textContent = "";
    var frag = document.createDocumentFragment();
    for (var i = lo; i < hi; i++) {
      if (!diff) { frag.appendChild(card(0, i, "")); continue; }
      var row = el("div", "row"), n = i + 1;
      row.id = "row-" + n;
      var ta = runs[0].turns[i], tb = runs[1].turns[i];
      row.className += same(ta, tb) ? " same" : " differs";
      if (D.t_div !== null && n > D.t_div) row.className += " after";
      if (n === D.t_div) { row.className += " t-div"; row.id = "t-div"; }
      add(row, ta ? card(0, i, "") : el("div", "missing", "A has no turn " + n),
        tb ? card(1, i, "b-") : el("div", "missing", "B has no turn " + n));
      frag.appendChild(row);
    }
    if (!rows) frag.appendChild(el("p", "note", "This recording has no model turns."));
    box.appendChild(frag);
    pager("pager", page, lo, hi);
    pager("pager-bottom", page, lo, hi);
    document.querySelectorAll("svg.tokens rect.window").forEach(function (w) {
      w.setAttribute("x", lo); w.setAttribute("width", hi - lo);
    });
    document.body.setAttribute("data-page", page);
  }

  function pager(id, page, lo, hi) {
    var nav = document.getElementById(id);
    nav.textContent = "";
    if (pages < 2) return;
    add(nav, el("span", "range", "turns " + (lo + 1) + "\u2013" + hi + " of " + rows));
    function link(p, text, cls) {
      var a = el("a", cls, text);
      a.href = "#page=" + p;
      return a;
    }
    if (page > 1) nav.appendChild(link(page - 1, "\u2039 prev", "step"));
    for (var p = 1; p <= pages; p++) {
      var a = link(p, p, "page-link" + (p === page ? " current" : ""));
      if (p === page) a.setAttribute("aria-current", "page");
      nav.appendChild(a);
    }
    if (page < pages) nav.appendChild(link(page + 1, "next \u203a", "step"));
  }

  function pageOf(n) { return Math.min(pages, Math.max(1, Math.floor((n - 1) / size) + 1)); }

  function route() {
    var h = decodeURIComponent(location.hash.replace(/^#/, "")), m, page = 1, focus = null;
    if ((m = /^page=(\d+)$/.exec(h))) page = Math.min(pages, Math.max(1, +m[1]));
    else if ((m = /^(b-)?turn-(\d+)$/.exec(h))) { page = pageOf(+m[2]); focus = h; }
    else if (diff && D.t_div !== null && (h === "t-div" || !h)) {
      page = pageOf(D.t_div);
      focus = "t-div";
    }
    draw(page);
    var target = focus && document.getElementById(focus);
    if (!target) { if (h.indexOf("page=") === 0) window.scrollTo(0, 0); return; }
    target.classList.add("focus");
    if (focus !== "t-div") { var det = target.querySelector("details"); if (det) open(det); }
    if (h) target.scrollIntoView({block: "start"});
  }

  document.querySelectorAll("svg.tokens, svg.timeline").forEach(function (svg) {
    svg.addEventListener("click", function (ev) {
      var g = ev.target.closest && ev.target.closest("g.bar, g.seg");
      var side = /-b$/.test(svg.id) ? "b-" : "";
      if (g) location.hash = side + "turn-" + g.getAttribute("data-turn");
    });
  });
  window.addEventListener("hashchange", route);
  route();
})();
"""
