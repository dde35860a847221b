"""What a turn's tool work read, and what the recording proves about each file.

A turn's work runs from its model reply to the next model request. The tape chunks
appended between the reply's ``Exchange`` and the next turn's ``ContextBuilt`` marker
(before which the recorder drained every ring) hold each stat its processes made, and
every reader stats what it opens (Python's ``open``, ``cat``, ``grep``). A regular file
stat'ed there is one the tool read or looked at, inside the recorded workspace or not.
Its evidence is that first stat (size, mtime) and, for a workspace file, its bytes where
a snapshot of the run holds it with that mtime (so the same content).

``compare`` sets two runs' evidence side by side, file by file: it differs (bytes, size,
mtime, or it exists in one run only), it is the same, or it is unknown (one run holds
no evidence of it). Not inputs: pseudo files (``/proc``, ``/sys``, ``/dev``), directories,
a file whose mtime is from after the work began (the tool wrote it), a missing file
seen in one run only. Pure code over a ``Trajectory``; snapshots through its ``bodies``.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stenograph.harness.fork import cut_before
from stenograph.harness.trajectory import Trajectory
from stenograph.recorder.blobs import BlobRef
from stenograph.recorder.chunks import chunk_data
from stenograph.recorder.filestats import stats

SAME, DIFFERS, UNKNOWN = "same", "differs", "unknown"
PSEUDO = ("/proc/", "/sys/", "/dev/")
WRITTEN_SLACK_NS = 20_000_000
"""The kernel stamps mtimes from a clock a tick behind: a file stamped this close before
the work began may be one the work wrote."""


@dataclass(frozen=True)
class Seen:
    """One file as the tool's work first found it."""

    file: str
    """Its name for comparing runs: the path inside the workspace, else the absolute path."""
    path: str
    exists: bool
    size: int | None = None
    mtime_ns: int | None = None
    """``None`` where the stat did not ask (a ``statx`` mask without it)."""
    sha256: str = ""
    """Its bytes' digest, where a snapshot holds the file with this mtime and size."""

    def to_json(self) -> dict[str, Any]:
        if not self.exists:
            return {"path": self.path, "exists": False}
        return {"path": self.path, "exists": True, "size": self.size,
                "mtime_ns": self.mtime_ns, "sha256": self.sha256 or None}

    def brief(self) -> str:
        if not self.exists:
            return "missing"
        return ", ".join(x for x in (
            f"size {self.size}" if self.size is not None else "",
            f"mtime {_when(self.mtime_ns)}" if self.mtime_ns is not None else "",
            f"sha256 {self.sha256[:12]}" if self.sha256 else "") if x) or "present"


@dataclass
class Reads:
    """The files one turn's work stat'ed, by ``Seen.file``."""

    files: dict[str, Seen] = field(default_factory=dict)
    unnamed: set[tuple[int, int]] = field(default_factory=set)
    """(size, mtime) of each regular file stat'ed through an fd (or a relative path) the
    tape does not name."""

    @property
    def any(self) -> bool:
        return bool(self.files) or bool(self.unnamed)


@dataclass(frozen=True)
class FileEvidence:
    """One file in both runs, and what the evidence says of it."""

    file: str
    a: Seen | None
    b: Seen | None
    verdict: str
    what: tuple[str, ...] = ()
    """What differs: ``exists``, ``bytes``, ``size``, ``mtime``."""

    def describe(self) -> str:
        a, b = self.a, self.b
        if a is None or b is None:
            have, which, other = (a, "a", "b") if a is not None else (b, "b", "a")
            return (f"run {other} holds no evidence of it; run {which}'s tool read it "
                    f"({have.brief() if have else '?'})")
        if "exists" in self.what:
            return f"{a.brief()} in run a, {b.brief()} in run b"
        out = []
        if "bytes" in self.what:
            out.append(f"bytes {a.sha256[:12]} vs {b.sha256[:12]}")
        if "size" in self.what:
            out.append(f"size {a.size} vs {b.size}")
        if "mtime" in self.what:
            out.append(f"mtime {_when(a.mtime_ns or 0)} vs {_when(b.mtime_ns or 0)}")
        return ", ".join(out) or "the same"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "verdict": self.verdict, "what": list(self.what),
                "a": self.a.to_json() if self.a else None,
                "b": self.b.to_json() if self.b else None}


def _when(ns: int) -> str:
    t = datetime.fromtimestamp(ns // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{t}.{ns % 1_000_000_000:09d}Z"


def compare(ra: Reads, rb: Reads) -> list[FileEvidence]:
    """Each file either run's work read, judged by both runs' evidence, by name."""
    out = []
    for f in sorted(set(ra.files) | set(rb.files)):
        a, b = ra.files.get(f), rb.files.get(f)
        if a is None or b is None:
            one = a if a is not None else b
            if one is not None and one.exists:
                out.append(FileEvidence(f, a, b, UNKNOWN))
            continue
        if a.exists != b.exists:
            out.append(FileEvidence(f, a, b, DIFFERS, ("exists",)))
            continue
        if not a.exists:
            out.append(FileEvidence(f, a, b, SAME))
            continue
        what = []
        if not (a.sha256 and a.sha256 == b.sha256):  # the same bytes: whenever written
            if a.sha256 and b.sha256:
                what.append("bytes")
            if None not in (a.size, b.size) and a.size != b.size:
                what.append("size")
            if None not in (a.mtime_ns, b.mtime_ns) and a.mtime_ns != b.mtime_ns:
                what.append("mtime")
        out.append(FileEvidence(f, a, b, DIFFERS if what else SAME, tuple(what)))
    return out


class ReadIndex:
    """One trajectory's reads, turn by turn, worked out when a turn is asked for."""

    def __init__(self, tr: Trajectory) -> None:
        self.tr = tr
        self._turns: dict[int, Reads] = {}
        self._snaps: tuple[list[str], dict[tuple[str, int, int], str]] | None = None

    def turn(self, i: int) -> Reads:
        """What the work of turn ``i`` (0-based: after its reply) stat'ed."""
        if i not in self._turns:
            self._turns[i] = self._read(i)
        return self._turns[i]

    def _read(self, i: int) -> Reads:
        tr = self.tr
        if not 0 <= i < len(tr.turns):
            return Reads()
        t = tr.turns[i]
        begin = t.event.seq
        end = cut_before(tr.events, tr.turns[i + 1].event) if i + 1 < len(tr.turns) else None
        at = t.event.body.get("at")
        since = int(at * 1e9) - WRITTEN_SLACK_NS if isinstance(at, (int, float)) else None
        roots, digests = self._snapshots()
        out = Reads()
        for ev in tr.events:
            if end is not None and ev.seq >= end:
                break
            if ev.seq <= begin or ev.kind != "TapeChunk":
                continue
            try:
                data = chunk_data(ev.body)
            except ValueError:
                continue
            for st in stats(data):
                if st.path is None:
                    if st.regular:
                        out.unnamed.add((st.size, st.mtime_ns))
                    continue
                if st.path.startswith(PSEUDO) or (not st.errno and not st.regular):
                    continue
                if st.errno and st.errno != errno.ENOENT:
                    continue
                key = _name(roots, st.path)
                old = out.files.get(key)
                if old is not None and (old.mtime_ns is not None or st.mtime_ns is None):
                    continue  # the first stat that says when the file was written stands
                if st.regular and since is not None and (st.mtime_ns or 0) >= since:
                    continue  # written by the work itself: an output
                sha = digests.get((key, st.mtime_ns or 0, st.size or 0), "") \
                    if st.regular and st.mtime_ns is not None and st.size is not None else ""
                out.files[key] = Seen(key, st.path, st.regular, st.size, st.mtime_ns, sha)
        return out

    def _snapshots(self) -> tuple[list[str], dict[tuple[str, int, int], str]]:
        """The workspace roots, and the digest of every file any snapshot of the run holds
        by (name, mtime, size)."""
        if self._snaps is not None:
            return self._snaps
        from stenograph.recorder.snapshots import load_manifest

        tr = self.tr

        class _Blobs:
            def get(self, r: BlobRef) -> bytes:
                return tr.bodies({"$blob": r.sha256, "size": r.size})

        roots: list[str] = []
        digests: dict[tuple[str, int, int], str] = {}
        for ev in tr.events:
            b = ev.body if ev.kind == "Checkpoint" and isinstance(ev.body, dict) else None
            if b is None or "snapshot" not in b:
                continue
            try:
                m = load_manifest(_Blobs(), BlobRef.from_body(b["snapshot"]))  # type: ignore[arg-type]
            except Exception:  # an export without its snapshots: no bytes from them
                continue
            roots = roots or list(m.roots)
            for root, tree in m.trees.items():
                prefix = f"{os.path.basename(root)}/" if len(m.roots) > 1 else ""
                for e in tree.values():
                    if e.kind == "f" and e.path:
                        digests[(prefix + e.path, e.mtime_ns, e.size)] = e.sha256
        self._snaps = (roots, digests)
        return self._snaps


def _name(roots: list[str], path: str) -> str:
    """A file's name for comparing runs made in other directories: inside a workspace
    root, its path there (the root's name first when there are several)."""
    for r in roots:
        base = r.rstrip("/")
        if path.startswith(base + "/"):
            rel = path[len(base) + 1:]
            return (f"{os.path.basename(base)}/" if len(roots) > 1 else "") + rel
    return path
