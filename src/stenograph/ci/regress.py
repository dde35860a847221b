"""A directory of recordings as a regression suite: one build replay per ``.steno``.

Shared by ``stenograph regress`` and the pytest plugin: find the logs, build-replay one
(a ``stenograph replay --build --json`` subprocess, so a replay that crashes or hangs
costs one result, not the suite), group failures by where and how they first diverged,
write JUnit XML. Replays run in parallel (``-j``); each is sealed in its own mount
namespace, so they cannot see each other's writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMEOUT = 600.0
"""Seconds one build replay may take before it counts as an error."""


@dataclass
class Outcome:
    """One log's build replay."""

    rel: str
    path: Path
    status: str  # "pass" | "fail" | "error"
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    code: int = 0

    @property
    def first(self) -> dict[str, Any] | None:
        divs = self.report.get("divergences") or []
        return divs[0] if divs else None

    def site(self) -> str:
        """Where and how the replay first diverged: what groups failures."""
        d = self.first
        if d is None:
            return self.error.splitlines()[0] if self.error else "?"
        path = (d.get("diff") or [{}])[0].get("path", "")
        return f"{d.get('kind')} {d.get('channel')} call at turn {d.get('turn')}" + (
            f", {path}" if path else "")

    def to_json(self) -> dict[str, Any]:
        return {"file": self.rel, "status": self.status, "seconds": round(self.seconds, 3),
                "divergences": self.report.get("divergences") or [],
                "drift": self.report.get("drift") or {}, "error": self.error or None}


def find_logs(root: Path) -> list[tuple[str, Path]]:
    """Every ``.steno`` under ``root`` (or ``root`` itself), by relative path."""
    if root.is_file():
        return [(root.name, root)]
    return [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*.steno"))
            if p.is_file()]


def replay_argv(path: Path, cmd: Sequence[str] = (), options: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "stenograph", "replay", "--build", "--json", *options,
            str(path)]
    return [*argv, "--", *cmd] if cmd else argv


def run_one(rel: str, path: Path, cmd: Sequence[str] = (),
            options: Sequence[str] = ()) -> Outcome:
    """Build-replay one log; never raises for what the replay reports."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(replay_argv(path, cmd, options), capture_output=True,
                           timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Outcome(rel, path, "error", time.monotonic() - t0,
                       error=f"build replay ran past {TIMEOUT:.0f} s", code=1)
    took = time.monotonic() - t0
    line = p.stdout.decode(errors="replace").strip().splitlines()[-1:] or [""]
    try:
        rep = json.loads(line[0])
    except ValueError:
        rep = None
    if isinstance(rep, dict) and p.returncode in (0, 1):
        status = "fail" if rep.get("divergences") else "pass"
        return Outcome(rel, path, status, took, rep, code=p.returncode)
    err = p.stderr.decode(errors="replace").strip().splitlines()
    msg = next((ln for ln in reversed(err) if ln.startswith("stenograph: error:")),
               err[-1] if err else f"exit status {p.returncode}")
    return Outcome(rel, path, "error", took, error=msg, code=p.returncode)


def groups(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Failures and errors grouped by first-divergence site and kind, largest first."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.status != "pass":
            by.setdefault(o.site(), []).append(o)
    return [{"site": site, "count": len(os), "files": [o.rel for o in os]}
            for site, os in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def describe(o: Outcome) -> list[str]:
    """A failure as text lines (JUnit failure bodies, pytest reports)."""
    if o.status == "error":
        return [o.error]
    lines = []
    for d in o.report.get("divergences") or []:
        lines.append(f"turn {d.get('turn')}, {d.get('channel')}: {d.get('call')} "
                     f"({d.get('kind')})")
        for c in d.get("diff") or []:
            lines.append(f"  {c.get('path')}:")
            lines.append(f"    recorded {json.dumps(c.get('recorded'), default=str)[:300]}")
            lines.append(f"    asked    {json.dumps(c.get('asked'), default=str)[:300]}")
    return lines


def junit(outcomes: Sequence[Outcome], seconds: float) -> bytes:
    """JUnit XML: one testcase per log, a failure per divergence report, an error per
    log that could not be replayed."""
    suite = ET.Element("testsuite", name="stenograph.regress", tests=str(len(outcomes)),
                       failures=str(sum(o.status == "fail" for o in outcomes)),
                       errors=str(sum(o.status == "error" for o in outcomes)),
                       time=f"{seconds:.3f}")
    for o in outcomes:
        case = ET.SubElement(suite, "testcase", classname="stenograph.regress", name=o.rel,
                             file=str(o.path), time=f"{o.seconds:.3f}")
        if o.status == "fail":
            el = ET.SubElement(case, "failure", message=o.site(), type="divergence")
            el.text = "\n".join(describe(o))
        elif o.status == "error":
            el = ET.SubElement(case, "error", message=o.error, type="replay")
            el.text = o.error
        drift = o.report.get("drift") or {}
        if drift:
            ET.SubElement(case, "system-out").text = "drift: " + ", ".join(
                f"{k} {v}" for k, v in sorted(drift.items()))
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)
