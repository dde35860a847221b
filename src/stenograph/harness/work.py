"""What each turn did in the world, for a person reading the run: the commands it ran
(command line, exit status, how long), the files it changed (a diff for a text file
when the recording holds both versions), and how long its model call and its work took.

Read from the log alone: ``ProcessStarted`` / ``ProcessEnded`` (the recorder notes every
exec and exit), the ``at`` stamps the recorder puts on ``ContextBuilt`` (a model call's
start) and ``Exchange`` (a call's answer), and the ``Checkpoint`` chain -- snapshots
(content) and ``times`` records (which entries changed at each turn without one). A
turn's work runs from its model call's answer to the next model call's start (or the
end of the run); the files it changed are the entries whose mtime differs between the
two turn boundaries. A file's diff needs its bytes on both sides: those of the last
snapshot before the turn in which it had the same mtime, and of the first after it in
which it still has the turn's mtime -- else the file is listed without one.

Pure code over a ``Trajectory``; bodies and snapshots through its ``bodies``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from stenograph.harness.trajectory import Trajectory
from stenograph.recorder.blobs import BlobRef

DIFF_MAX = 200
"""Lines of one file's diff the view carries."""
TEXT_MAX = 256 * 1024
"""A file larger than this is not diffed."""


@dataclass
class Command:
    command: str
    cwd: str
    started: float
    ended: float | None = None
    status: str | None = None

    def to_json(self) -> list[Any]:
        took = None if self.ended is None else round(self.ended - self.started, 6)
        return [self.command, self.status, took, self.cwd]


@dataclass
class TurnWork:
    """One turn's work: ``span`` (model call start, its answer, the next call's start)."""

    span: list[float | None] = field(default_factory=lambda: [None, None, None])
    commands: list[Command] = field(default_factory=list)
    calls: list[tuple[str, float]] = field(default_factory=list)
    """HTTP and tool calls: (what, when answered)."""
    files: list[list[Any]] = field(default_factory=list)
    """``[path, change ("added" | "modified" | "deleted"), diff lines or None]``."""

    def to_json(self) -> dict[str, Any]:
        return {"span": self.span, "commands": [c.to_json() for c in self.commands],
                "calls": [[w, round(t, 6)] for w, t in self.calls], "files": self.files}


_Entry = tuple[int, str]
"""(mtime_ns, digest or kind) of one path."""


def turn_work(tr: Trajectory) -> list[TurnWork]:
    """Each turn's work (index = turn - 1)."""
    n = len(tr.turns)
    out = [TurnWork() for _ in range(n)]
    if not n:
        return out
    begins = {t.event.seq: i for i, t in enumerate(tr.turns)}
    turn = -1
    running: dict[str, Command] = {}
    model_start: float | None = None
    for ev in tr.events:
        b = ev.body if isinstance(ev.body, dict) else {}
        at = b.get("at") if isinstance(b.get("at"), (int, float)) else None
        if ev.kind == "ContextBuilt" and b.get("channel") == "model":
            model_start = at
            if turn >= 0 and at is not None and out[turn].span[2] is None:
                out[turn].span[2] = at
        elif ev.seq in begins:
            turn = begins[ev.seq]
            out[turn].span[0], out[turn].span[1] = model_start, at
            model_start = None
        elif ev.kind == "Exchange" and turn >= 0 and at is not None:
            req = b.get("request") or {}
            out[turn].calls.append((f"{b.get('channel')}: {req.get('method', '')} "
                                    f"{req.get('url', '')}".strip(), at))
        elif ev.kind == "ProcessStarted" and at is not None:
            c = Command(str(b.get("command", "")), str(b.get("cwd", "")), at)
            running[str(b.get("proc"))] = c
            if turn >= 0:
                out[turn].commands.append(c)
        elif ev.kind == "ProcessEnded":
            c = running.pop(str(b.get("proc")), None)
            if c is not None:
                c.ended, c.status = at, str(b.get("status"))
        elif ev.kind == "RunEnded" and turn >= 0 and out[turn].span[2] is None:
            out[turn].span[2] = out[turn].span[1]
    _files(tr, out)
    return out


def _files(tr: Trajectory, out: list[TurnWork]) -> None:
    """The entries each turn changed, from the mtimes at its two boundaries."""
    from stenograph.recorder.snapshots import load_manifest

    class _Blobs:
        def get(self, r: BlobRef) -> bytes:
            return tr.bodies({"$blob": r.sha256, "size": r.size})

    at_turn: dict[int, dict[str, _Entry]] = {}
    snaps: list[tuple[int, dict[str, _Entry]]] = []  # (boundary, entries with digests)
    now: dict[str, _Entry] | None = None
    for ev in tr.events:
        b = ev.body if ev.kind == "Checkpoint" and isinstance(ev.body, dict) else None
        if b is None:
            continue
        t = int(b.get("turn", 0) or 0)
        if "snapshot" in b:
            try:
                m = load_manifest(_Blobs(), BlobRef.from_body(b["snapshot"]))
            except Exception:  # an export without its snapshots: no files shown
                return
            many = len(m.roots) > 1
            now = {(f"{i}:" if many else "") + e.path: (e.mtime_ns, e.sha256 or e.kind)
                   for i, root in enumerate(m.roots) for e in m.trees[root].values()
                   if e.path}
            boundary = len(out) + 1 if b.get("at") == "end" else t
            snaps.append((boundary, dict(now)))
            if b.get("at") in ("start", "turn", "end"):
                at_turn.setdefault(boundary, dict(now))
        elif b.get("at") == "times" and now is not None:
            roots = list(b.get("times") or {})
            for i, root in enumerate(roots):
                for rel, mt in (b["times"][root] or {}).items():
                    if not rel:
                        continue
                    key = (f"{i}:" if len(roots) > 1 else "") + str(rel)
                    if isinstance(mt, int):
                        old = now.get(key)
                        keep = old is not None and (old[0] == mt or old[1] == "d")
                        now[key] = (mt, old[1] if old is not None and keep else "?")
                    else:
                        now.pop(key, None)
            at_turn[t] = dict(now)
    for i, w in enumerate(out):
        before, after = at_turn.get(i + 1), at_turn.get(i + 2)
        if after is None and i == len(out) - 1:
            after = at_turn.get(len(out) + 1)
        if before is None or after is None:
            continue
        for path in sorted(set(before) | set(after)):
            x, y = before.get(path), after.get(path)
            if x is not None and y is not None and x[0] == y[0]:
                continue
            if (x or y or (0, ""))[1] == "d" or (y or x or (0, ""))[1] == "d":
                continue  # a directory's own mtime: its entries say what changed
            change = "added" if x is None else "deleted" if y is None else "modified"
            w.files.append([path, change, _diff(tr, snaps, path, i + 1, x, y)])
        listed = {f[0] for f in w.files}  # a new directory is shown by what is in it
        w.files = [f for f in w.files if not any(p.startswith(f[0] + "/") for p in listed)]


def _diff(tr: Trajectory, snaps: list[tuple[int, dict[str, _Entry]]], path: str,
          boundary: int, x: _Entry | None, y: _Entry | None) -> list[str] | None:
    old = _bytes_at(tr, snaps, path, x, lambda s: s <= boundary, reverse=True)
    new = _bytes_at(tr, snaps, path, y, lambda s: s > boundary, reverse=False)
    if (x is not None and old is None) or (y is not None and new is None):
        return None
    a, b = old or b"", new or b""
    if len(a) > TEXT_MAX or len(b) > TEXT_MAX or b"\0" in a[:8192] + b[:8192]:
        return None
    lines = list(difflib.unified_diff(a.decode("utf-8", "replace").splitlines(),
                                      b.decode("utf-8", "replace").splitlines(),
                                      "before", "after", lineterm="", n=2))[2:]
    return lines[:DIFF_MAX] + ([f"... {len(lines) - DIFF_MAX} more lines"]
                               if len(lines) > DIFF_MAX else [])


def _bytes_at(tr: Trajectory, snaps: list[tuple[int, dict[str, _Entry]]], path: str,
              want: _Entry | None, ok: Any, reverse: bool) -> bytes | None:
    """The file's bytes from a snapshot on the right side of the turn in which it has
    the mtime ``want`` had (so the same content)."""
    if want is None:
        return None
    for boundary, entries in (reversed(snaps) if reverse else snaps):
        e = entries.get(path)
        if not ok(boundary) or e is None or e[0] != want[0] or len(e[1]) != 64:
            continue
        try:
            return tr.bodies({"$blob": e[1], "size": 0})
        except Exception:  # not in this file
            return None
    return None
