"""``stenograph view``: the HTML page of a recording, looked at in a real browser.

The page is drawn by its inline script, so a file that merely exists proves little:
each page here is opened in headless Chromium and the DOM *after the script ran* is
parsed (``--dump-dom``): the turn cards, the badges of the effect agent's calls, the
token chart's bars, the divergence row of two real runs that part at turn 3, the pages
of a 450-turn trajectory, and a planted ``<script>`` that must show as text and never
run. A screenshot checks that something visible was painted.

The recordings are real: the golden logs, and two runs of examples/agent.py recorded
here against the loopback model server with scripts that differ at turn 3.
"""

from __future__ import annotations

import json
import lzma
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from stenograph.harness.source import Recording, open_recording
from stenograph.harness.trajectory import Trajectory, build
from stenograph.harness.viewer import (
    MESSAGE_CAP,
    Run,
    message_view,
    render,
    run_data,
    script_json,
)
from stenograph.recorder.codec import Event
from stenograph.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden_logs"
CLI = [sys.executable, "-m", "stenograph"]
CHROMIUM = shutil.which("chromium")
needs_browser = pytest.mark.skipif(CHROMIUM is None,
                                   reason="chromium is not installed (`make test` installs it)")

PAYLOAD = ("<script>document.title='pwned'</script>"
           "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
           "</script><!--<script>")
"""Planted in a recorded task and reply: markup, a script end tag and an HTML comment
opener, each of which would break or hijack a page that embedded it raw."""
SCRIPT = json.loads((REPO / "examples" / "agent_script.json").read_text())
FORKED_SCRIPT = [SCRIPT[0], SCRIPT[1],
                 {"text": f"Let me try something else. {PAYLOAD}",
                  "tool_calls": [{"name": "run", "arguments": {"command": "echo bye"}}]},
                 SCRIPT[3]]
"""The same conversation up to turn 3, where the model chooses another command."""


# -- the DOM Chromium dumps, as a small tree -------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
        "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()

    def select(self, tag: str | None = None, cls: str | None = None) -> list[Node]:
        return [n for n in self.walk() if (tag is None or n.tag == tag)
                and (cls is None or cls in n.classes)]

    def by_id(self, ident: str) -> Node | None:
        return next((n for n in self.walk() if n.attrs.get("id") == ident), None)

    def text(self) -> str:
        return "".join(self.texts) + "".join(c.text() for c in self.children)


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#document", {})

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_endtag(self, tag: str) -> None:
        n: Node | None = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data: str) -> None:
        self.cur.texts.append(data)


def parse(dom: str) -> Node:
    p = _Tree()
    p.feed(dom)
    return p.root


def _chromium(*flags: str, url: str) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--disable-extensions", *flags, url],
                          capture_output=True, timeout=60)


def dump(url: str) -> tuple[str, Node]:
    """The DOM after the page's script ran, as text and as a tree."""
    p = _chromium("--dump-dom", url=url)
    assert p.returncode == 0 and p.stdout, p.stderr.decode(errors="replace")[-2000:]
    text = p.stdout.decode()
    return text, parse(text)


def dump_all(urls: list[str]) -> list[tuple[str, Node]]:
    """Several pages, two browsers at a time (the machine has two cores)."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(dump, urls))


def url(path: Path, frag: str = "") -> str:
    return path.resolve().as_uri() + (f"#{frag}" if frag else "")


# -- recordings ------------------------------------------------------------------------


def _clean_env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    env.update(extra)
    return env


def _xz(name: str, into: Path) -> Path:
    out = into / f"{name}.steno"
    out.write_bytes(lzma.decompress((GOLDEN / f"{name}.steno.xz").read_bytes()))
    return out


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("golden")
    return {n: _xz(n, d) for n in ("openai_agent", "effect_agent", "pipeline")}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """examples/agent.py recorded twice in one workspace, the task carrying PAYLOAD; the
    second model script chooses another command at turn 3 (and writes PAYLOAD there)."""
    root = tmp_path_factory.mktemp("runs")
    ws = root / "ws"
    ws.mkdir()
    shutil.copy(REPO / "examples" / "agent_script.json", ws)
    outs = [root / "a.steno", root / "b.steno"]
    for out, script in zip(outs, (SCRIPT, FORKED_SCRIPT), strict=True):
        # one after the other: two `record`s at once can race in their sweep of stale
        # /tmp/steno-rec-* directories (one removes what the other is listing)
        with ModelServer(script=script) as srv:
            p = subprocess.run(
                [*CLI, "record", "-o", str(out), "--", sys.executable,
                 str(REPO / "examples" / "agent.py"), "--workdir", ".", "Look", "around:",
                 PAYLOAD], cwd=ws, capture_output=True, timeout=180,
                env=_clean_env(OPENAI_BASE_URL=srv.openai_base_url, OPENAI_API_KEY="sk-view"))
        assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return outs[0], outs[1]


def view(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "view", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


# -- a long trajectory, from a real recording's exchanges ------------------------------


def long_trajectory(rec: Recording, turns: int, long_text: str) -> Trajectory:
    """``turns`` model turns: the recording's exchanges played again and again with new
    positions, each request's user message replaced by ``long_text``."""
    events = rec.events
    exchanges = [e for e in events if e.kind == "Exchange" and e.body.get("channel") == "model"]
    head = [e for e in events if e.kind == "RunStarted"]
    out: list[Event] = list(head)
    lsn = max(e.lsn for e in events) + 1
    for i in range(turns):
        src = exchanges[i % (len(exchanges) - 1)]
        req = dict(src.body["request"])
        doc = json.loads(rec.body(req["body"]))
        doc["messages"][1]["content"] = long_text
        req["body"] = json.dumps(doc).encode()
        resp = dict(src.body["response"], body=rec.body(src.body["response"]["body"]))
        body = dict(src.body, pos=i, request=req, response=resp)
        out.append(replace(src, lsn=lsn + i, seq=lsn + i, body=body))
    end = next(e for e in events if e.kind == "RunEnded")
    out.append(replace(end, lsn=lsn + turns, seq=lsn + turns))
    return build(rec.traj, rec.header, out)


def unfinished_trajectory(rec: Recording) -> Trajectory:
    """Two real turns, then the run stops: an effect whose result never came (in
    doubt), an approval asked and given, a call that failed, and a last turn whose tool
    call was never made (the run has no end: not sent)."""
    ev = rec.events
    ex = [e for e in ev if e.kind == "Exchange" and e.body.get("channel") == "model"]
    lsn = max(e.lsn for e in ev) + 1

    def event(kind: str, body: dict[str, Any], i: int) -> Event:
        return Event(lsn + i, rec.traj, lsn + i, None, kind, body)

    def inline(e: Event, i: int) -> Event:
        req = dict(e.body["request"], body=rec.body(e.body["request"]["body"]))
        resp = dict(e.body["response"], body=rec.body(e.body["response"]["body"]))
        return replace(e, lsn=lsn + i, seq=lsn + i, body=dict(e.body, request=req,
                                                              response=resp))

    out = [next(e for e in ev if e.kind == "RunStarted"), inline(ex[0], 0),
           event("ToolIntent", {"call_id": "0/http/7", "target": "POST https://pay.example/"
                                "charge", "idempotency_key": "k1"}, 1),
           event("ApprovalRequested", {"call_id": "0/approval/1", "call": "pay 20 <EUR>"}, 2),
           event("ApprovalResolved", {"call_id": "0/approval/1", "decision": "approved"}, 3),
           event("Exchange", {"proc": "0", "channel": "http", "pos": 8, "request": {
               "method": "GET", "url": "https://down.example/"}, "response": {"status": 503}},
                 4),
           inline(ex[1], 5)]
    return build(rec.traj, rec.header, out)


# -- tests -----------------------------------------------------------------------------


@needs_browser
def test_states_approvals_and_an_unfinished_run(golden: dict[str, Path],
                                                tmp_path: Path) -> None:
    rec = open_recording(golden["openai_agent"])
    tr = unfinished_trajectory(rec)
    page = tmp_path / "unfinished.html"
    page.write_text(render(Run(tr, "cut.steno")), encoding="utf-8")
    _, tree = dump(url(page))
    t1, t2 = tree.by_id("turn-1"), tree.by_id("turn-2")
    assert t1 is not None and t2 is not None

    def states(node: Node) -> list[str]:
        return [c for b in node.select(cls="state") for c in sorted(b.classes)
                if c.startswith("state-")]

    assert states(t1) == ["state-in-doubt", "state-failed"]
    assert "effect" in t1.text() and "POST https://pay.example/charge" in t1.text()
    assert "approval 0/approval/1: pay 20 <EUR>" in t1.text()
    assert "approval 0/approval/1: approved" in t1.text()
    assert states(t2) == ["state-not-sent"] and "read_file" in t2.text()
    head = tree.select("header", "run")[0].text()
    assert "not ended" in head and "1 in doubt" in head




@needs_browser
def test_effect_agent_page_shows_turns_badges_chart(golden: dict[str, Path],
                                                    tmp_path: Path) -> None:
    page = tmp_path / "effect.html"
    p = view(golden["effect_agent"], "-o", page, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc == {"path": str(page), "turns": 4, "bytes": page.stat().st_size, "pages": 1}
    line = p.stderr.strip().splitlines()
    assert len(line) == 1 and str(page) in line[0] and "4 turn(s)" in line[0], p.stderr
    shot = tmp_path / "effect.png"
    with ThreadPoolExecutor(2) as pool:
        dom_f = pool.submit(dump, url(page))
        shot_f = pool.submit(_chromium, f"--screenshot={shot}", "--window-size=1280,900",
                             url=url(page))
        _, tree = dom_f.result()
        assert shot_f.result().returncode == 0
    turns = tree.select(cls="turn")
    assert [t.attrs["id"] for t in turns] == ["turn-1", "turn-2", "turn-3", "turn-4"]
    states = [sorted(c for c in b.classes if c.startswith("state-"))[0]
              for b in tree.select(cls="state")]
    assert sorted(states) == ["state-done", "state-settled", "state-settled"]
    assert "POST http://127.0.0.1" in turns[1].text() and "settled" in turns[1].text()
    assert "find_servers" in turns[0].text() and "checkpoint #1" in turns[1].text()
    assert "answer: web1 is up and its hosting is paid." in turns[3].text()
    chart = tree.by_id("tokens-chart")
    assert chart is not None and chart.tag == "svg"
    assert len(chart.select("g", "bar")) == 4
    assert len(chart.select("rect", "tin")) == 4 and len(chart.select("rect", "tout")) == 4
    head = tree.select("header", "run")[0].text()
    for want in ("effect_agent.steno", "675 (634 in + 41 out)", "exit 0",
                 "run-20261201T200248-20249"):
        assert want in head
    assert tree.by_id("pager") is not None and not tree.by_id("pager").select("a")
    _assert_painted(shot)


@pytest.fixture(scope="module")
def coding_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/coding_agent.py recorded in a workspace of its own: it runs shell
    commands, writes, edits and deletes files (checkpoints by the default cadence)."""
    root = tmp_path_factory.mktemp("coding")
    work = root / "work"
    (work / "build").mkdir(parents=True)
    (work / "old.txt").write_text("stale\n")
    (work / "build" / "x.o").write_bytes(b"\x7fELF")
    out = root / "coding.steno"
    with ModelServer(script=REPO / "examples" / "coding_script.json") as srv:
        p = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable,
                            str(REPO / "examples" / "coding_agent.py")], cwd=work,
                           capture_output=True, timeout=180,
                           env=_clean_env(OPENAI_BASE_URL=srv.openai_base_url,
                                          OPENAI_API_KEY="sk-view"))
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return out


@needs_browser
def test_each_turn_shows_its_commands_files_and_times(coding_run: Path,
                                                      tmp_path: Path) -> None:
    """The view shows what each turn did in the world: the commands it ran (with exit
    status and time), the files it changed (a diff where the recording holds both
    sides), the model call's and the work's time, and a timeline of them all. The
    screenshot (the page's top: header, charts, timeline, the first turns) is kept
    under tmp_path for a person to look at."""
    page = tmp_path / "coding.html"
    p = view(coding_run, "-o", page)
    assert p.returncode == 0, p.stderr
    shot = tmp_path / "coding.png"
    with ThreadPoolExecutor(2) as pool:
        dom_f = pool.submit(dump, url(page, "turn-3"))
        shot_f = pool.submit(_chromium, f"--screenshot={shot}", "--window-size=1280,1600",
                             url=url(page))
        _, tree = dom_f.result()
        assert shot_f.result().returncode == 0
    t1, t3, t6 = (tree.by_id(f"turn-{n}") for n in (1, 3, 6))
    assert t1 is not None and t3 is not None and t6 is not None
    cmds = [li.text() for li in t1.select("li", "cmd")]
    assert any(c.startswith("ranls -laexit 0") for c in cmds), cmds  # (texts joined)
    assert any(c.startswith("ransh -c ls -la") for c in cmds), cmds
    assert "model call" in t1.select(cls="timing")[0].text()
    files3 = [li.text() for li in t3.select("li", "file")]
    assert "addedsrc/app.py" in files3 and "addedmain.py" in files3, files3
    assert [li.text() for li in t6.select("li", "file")] == ["deletedold.txt"]
    # turn 3 is opened by its link: the diff of the file it made is there
    body = t3.text()
    assert "Files this turn changed" in body and "+print(42)" in body, body[-2000:]
    line = tree.by_id("timeline")
    assert line is not None and line.tag == "svg"
    assert len(line.select("rect", "model")) == 8
    assert len(line.select("rect", "cmd")) >= 10
    _assert_painted(shot, (1280, 1600))


def _assert_painted(png: Path, size: tuple[int, int] = (1280, 900)) -> None:
    """A real screenshot: a PNG of the window's size with many colours in it."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    width, height, pixels = _png_pixels(data)
    assert (width, height) == size
    assert len(set(pixels[::97])) > 8  # text, badges, bars: not one flat colour


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and pixels of an 8-bit RGB(A) PNG: Pillow when it is there, else a
    small decoder (zlib and the five row filters)."""
    try:
        import io

        from PIL import Image

        im = Image.open(io.BytesIO(data)).convert("RGB")
        raw = im.tobytes()
        return im.width, im.height, [raw[i:i + 3] for i in range(0, len(raw), 3)]
    except ImportError:
        pass
    pos, idat, ihdr = 8, b"", b""
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + n]
        ihdr = chunk if kind == b"IHDR" else ihdr
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, color = struct.unpack(">IIBB", ihdr[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    prev, pixels = bytearray(stride), []
    for y in range(h):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                row[i] = (row[i] + a) & 255
            elif f == 2:
                row[i] = (row[i] + b) & 255
            elif f == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [bytes(row[i:i + 3]) for i in range(0, stride, bpp)]
        prev = row
    return w, h, pixels


@needs_browser
def test_diff_page_marks_turn_3_and_planted_markup_stays_text(two_runs: tuple[Path, Path],
                                                              golden: dict[str, Path],
                                                              tmp_path: Path) -> None:
    a, b = two_runs
    diff_page, same_page, single, paged = (tmp_path / n for n in (
        "diff.html", "same.html", "b.html", "paged.html"))
    for args in ((a, "--diff", b, "-o", diff_page),
                 (golden["openai_agent"], "--diff", golden["openai_agent"], "-o", same_page),
                 (b, "-o", single), (a, "--diff", b, "-o", paged, "--page-size", "2")):
        p = view(*args)
        assert p.returncode == 0, p.stderr
    (_, d), (_, s), (b_text, bt), (_, pg) = dump_all(
        [url(diff_page), url(same_page), url(single, "turn-3"), url(paged)])

    row = d.by_id("t-div")
    assert row is not None and {"row", "t-div"} <= row.classes
    ids = [t.attrs["id"] for t in row.select(cls="turn")]
    assert ids == ["turn-3", "b-turn-3"]
    assert "echo bye" in row.text() and "echo hello from a tool" in row.text()
    assert len(d.select(cls="t-div")) == 1 and len(d.select(cls="turn")) == 8
    assert [r.attrs["id"] for r in d.select(cls="row")] == ["row-1", "row-2", "t-div", "row-4"]
    banner = d.by_id("banner")
    assert banner is not None and "cause-model" in banner.classes
    assert "turn 3" in banner.text() and "model" in banner.select("strong", "cause")[0].text()
    assert d.by_id("tokens-chart") is not None and d.by_id("tokens-chart-b") is not None

    # with two turns a page, the page opens where the runs part: turns 3 and 4
    assert pg.select("body")[0].attrs["data-page"] == "2"
    assert [r.attrs["id"] for r in pg.select(cls="row")] == ["t-div", "row-4"]
    assert "current" in pg.by_id("pager").select("a", "page-link")[1].classes

    assert s.by_id("t-div") is None and not s.select(cls="t-div")
    assert "cause-none" in s.by_id("banner").classes
    assert len(s.select(cls="turn")) == 8

    # the planted markup: text on the page, never elements, never run
    for tree in (d, bt):
        assert "pwned" not in "".join(t.text() for t in tree.select("title"))
        assert not any("data-pwned" in n.attrs for n in tree.walk())
        assert not any(n.tag == "img" for n in tree.walk())
        assert len(tree.select("script")) == 2  # the page's own data and code
    turn3 = bt.by_id("turn-3")
    assert turn3 is not None and "focus" in turn3.classes
    details = turn3.select("details")[0]
    assert "open" in details.attrs  # #turn-3 opened it
    shown = details.text()
    assert PAYLOAD in shown  # the task (user message) and the reply, as text
    assert "&lt;script&gt;document.title" in b_text
    assert shown.count("Look around:") >= 1 and "list_dir" in shown
    assert "Tool results" in shown and "tools offered (3): list_dir, read_file, run" in shown


@needs_browser
def test_450_turns_paginate(golden: dict[str, Path], tmp_path: Path) -> None:
    rec = open_recording(golden["openai_agent"])
    long_text = "L" * (MESSAGE_CAP + 5000) + "<!--</script>"
    tr = long_trajectory(rec, 450, long_text)
    assert len(tr.turns) == 450
    page = tmp_path / "long.html"
    html = render(Run(tr, "long.steno"), page_size=200)
    page.write_text(html, encoding="utf-8")
    assert len(html) < 1_000_000, len(html)  # contexts as deltas; the long text once
    assert html.count("L" * 1000) == MESSAGE_CAP // 1000
    (_, p1), (_, p3), (_, p2) = dump_all([url(page), url(page, "page=3"),
                                          url(page, "turn-250")])

    assert len(p1.select(cls="turn")) == 200
    assert p1.select(cls="turn")[0].attrs["id"] == "turn-1"
    links = p1.by_id("pager").select("a", "page-link")
    assert [a.text() for a in links] == ["1", "2", "3"]
    assert [a.attrs["href"] for a in links] == ["#page=1", "#page=2", "#page=3"]
    assert "current" in links[0].classes
    assert len(p1.by_id("tokens-chart").select("g", "bar")) == 450

    last = p3.select(cls="turn")
    assert len(last) == 50 and last[0].attrs["id"] == "turn-401"
    assert last[-1].attrs["id"] == "turn-450"
    assert "current" in p3.by_id("pager").select("a", "page-link")[2].classes

    t = p2.by_id("turn-250")
    assert t is not None and len(p2.select(cls="turn")) == 200
    assert p2.select(cls="turn")[0].attrs["id"] == "turn-201"
    text = t.select("details")[0].text()
    assert f"the first {MESSAGE_CAP} of {len(long_text)} characters" in text
    assert "<!--</script>" not in text  # cut off with the rest of the long text


def test_render_escapes_header_and_parent(golden: dict[str, Path]) -> None:
    rec = open_recording(golden["openai_agent"])
    parent = {"file": "<b>x</b>.steno", "traj": "t0", "turn": 2, "change": "a \"new\" prompt"}
    page = render(Run(rec.trajectory(), "dir/<i>.steno", parent))
    assert "&lt;b&gt;x&lt;/b&gt;.steno" in page and "<b>x</b>" not in page
    assert "dir/&lt;i&gt;.steno" in page
    assert "forked from" in page and "at turn 2: a &quot;new&quot; prompt" in page


def test_page_data_agrees_with_the_trajectory(golden: dict[str, Path],
                                              tmp_path: Path) -> None:
    """The incremental context hash is ``Context.hash``; the results read from the next
    request are ``Turn.results``; a context rebuilt from its delta is the context."""
    logs = [golden["openai_agent"], golden["effect_agent"], _xz("anthropic_agent", tmp_path)]
    for log in logs:
        tr = open_recording(log).trajectory()
        data = run_data(tr)
        contexts: list[list[int]] = []
        for t, d in zip(tr.turns, data["turns"], strict=True):
            assert d["hash"] == t.context.hash[:16]
            assert [[a.call_id, a.is_error] for a in t.results] == [
                [r[0], bool(r[2])] for r in d["results"]]
            base, keep, added = d["ctx"]
            ids = (contexts[base][:keep] if base >= 0 else []) + added
            contexts.append(ids)
            msgs = [data["msgs"][i] for i in ids]
            assert [m[0] for m in msgs] == [message_view(m)[0] for m in t.context.messages]
            assert ["\n".join(data["strings"][j] for j in m[1]) for m in msgs] == [
                message_view(m)[1] for m in t.context.messages]
        assert any(d["ctx"][0] >= 0 for d in data["turns"][1:])  # deltas, not copies


def test_script_json_cannot_end_its_element() -> None:
    text = script_json({"m": "</script><!-- <script> \u2028"})
    assert "<" not in text and "\u2028" not in text
    assert json.loads(text) == {"m": "</script><!-- <script> \u2028"}


def test_message_view_reads_each_api() -> None:
    assert message_view({"role": "user", "content": "hi"}) == ("user", "hi")
    role, text = message_view({"role": "assistant", "content": [
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "run", "input": {"c": 1}}]})
    assert (role, text) == ("assistant", "ok\n→ run  [t1]\n{\"c\": 1}")
    role, text = message_view({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "out", "is_error": True}]})
    assert text == "← [t1] (error)\nout"
    assert message_view({"type": "function_call_output", "call_id": "c9", "output": "x"}) \
        == ("function_call_output", "← [c9]\nx")
    role, text = message_view({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "function": {"name": "ls", "arguments": "{\"p\": 1}"}}]})
    assert text == "→ ls  [c1]\n{\"p\": 1}"


def test_pipeline_without_model_turns(golden: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "pipe.html"
    p = view(golden["pipeline"], "-o", page, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["turns"] == 0
    assert "no model turns" in page.read_text()


@pytest.mark.parametrize("case", ["missing", "no-dir", "is-input", "missing-other"])
def test_bad_input_is_one_line_and_writes_nothing(case: str, golden: dict[str, Path],
                                                  tmp_path: Path) -> None:
    out = tmp_path / "out.html"
    argv: dict[str, Callable[[], list[Any]]] = {
        "missing": lambda: [tmp_path / "nope.steno", "-o", out],
        "no-dir": lambda: [golden["openai_agent"], "-o", tmp_path / "no" / "out.html"],
        "is-input": lambda: [golden["openai_agent"], "-o", golden["openai_agent"]],
        "missing-other": lambda: [golden["openai_agent"], "--diff", tmp_path / "x.steno",
                                  "-o", out],
    }
    before = golden["openai_agent"].stat().st_size
    p = view(*argv[case]())
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "error" in p.stderr, p.stderr
    assert not out.exists() and not (tmp_path / "no").exists()
    assert golden["openai_agent"].stat().st_size == before
    assert not list(tmp_path.glob(".out.html.*"))


def test_help_teaches() -> None:
    p = view("--help")
    assert p.returncode == 0
    assert "Examples:" in p.stdout and "--diff rerun.steno -o diff.html" in p.stdout
    assert "--page-size" in p.stdout
