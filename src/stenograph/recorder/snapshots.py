"""Workspace snapshots: what the files were, at the start of a run and at its turns.

The log holds what a program read through the tape; it does not hold the files the
program's tools read and wrote. A snapshot does: one *manifest* per snapshot lists every
path under each workspace root with its type, mode, mtime and (files) the sha256 of its
bytes, which sit in the store's content-addressed blob directory -- so a file that did
not change between two snapshots, or two runs, is stored once.

A manifest is itself a blob (msgpack), in one of two forms (docs/log-format.md):

* full: ``{"v": 1, "kind": "full", "roots": [...], "trees": {root: [entry...]}}``
* delta: ``{"v": 1, "kind": "delta", "base": <ref>, "depth": n, "roots": [...],
  "changed": {root: [entry...]}, "removed": {root: [path...]}}``

with an entry ``[path, kind, mode, mtime_ns, size, file blob ref | link target | nil]``
(``path`` relative to its root, ``""`` for the root itself; ``kind`` ``"f"``, ``"d"``
or ``"l"``), and since version 2 a seventh element for a file whose secrets were masked
before it was stored (``secretfiles.Secret``: why, how many, a salted digest of the real
bytes). Version 1 manifests are read as they are. A delta names only what changed since
its base, so a checkpoint writes about what the turn changed; a chain longer than
``MAX_DEPTH`` is cut by writing a full one.

``Snapshotter`` takes snapshots incrementally: a file whose size, mtime and inode are
what they were at the last snapshot is not read again. Its blobs are written without a
sync each and made durable together (one ``syncfs``) before the manifest is, so a
snapshot killed halfway leaves blobs nobody names, never a manifest naming a torn one.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from stenograph.recorder.blobs import BlobRef, BlobStore, blob_refs
from stenograph.recorder.errors import BadInput, CorruptLog
from stenograph.recorder.secretfiles import SCAN_MAX, Secret, SecretRules

MANIFEST_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})
MAX_DEPTH = 16
"""Deltas on deltas beyond this many: the next snapshot is written in full."""

DEFAULT_IGNORE = ("__pycache__/", ".venv/", "node_modules/", ".mypy_cache/",
                  ".pytest_cache/", ".ruff_cache/", "*.steno")
"""Caches and environments a tool rebuilds or a program only executes from: not the
workspace's content, and live at replay (they pass through the sealed view). And other
recordings: recorded again and again in one directory, each `.steno` would embed all the
earlier ones (twice the size each time)."""

IGNORE_FILE = ".stenoignore"

CODE_GLOBS = ("*.py", "*.pyc", "*.pyi", "*.pth", "*.so", "pyproject.toml", "setup.py", "setup.cfg",
              "requirements*.txt", "uv.lock", "poetry.lock")
"""What counts as a program's code in a workspace, not its data (a build replay shows
these as they are now: ``replay --build --code GLOB``; ``diff`` calls a change in one the
harness's)."""


def is_code(rel: str, globs: Sequence[str] = CODE_GLOBS) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, g) for g in globs)


def is_environment(path: str) -> bool:
    """A Python environment (a directory with a ``pyvenv.cfg``), whatever its name
    (``venv/``, ``env/``, ``.tox/py311/``): ignored like ``.venv/``, or a workspace that
    holds one would snapshot (and scan for keys) a whole interpreter's packages."""
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


class WorkspaceTooBig(BadInput):
    """A workspace over the limits: refused before the program starts."""


@dataclass(frozen=True, slots=True)
class Entry:
    path: str
    kind: str  # "f" file, "d" directory, "l" symlink
    mode: int
    mtime_ns: int
    size: int = 0
    sha256: str = ""
    target: str = ""
    secret: Secret | None = None
    """Set when the stored bytes are the file's with its secrets masked."""

    def to_wire(self) -> list[Any]:
        extra: Any = None
        if self.kind == "f":
            extra = BlobRef(self.sha256, self.size).to_body()
        elif self.kind == "l":
            extra = self.target
        w = [self.path, self.kind, self.mode, self.mtime_ns, self.size, extra]
        return [*w, self.secret.to_wire()] if self.secret is not None else w

    @classmethod
    def from_wire(cls, w: Any) -> Entry:
        if not (isinstance(w, list) and len(w) in (6, 7) and isinstance(w[0], str)
                and w[1] in ("f", "d", "l") and isinstance(w[2], int)
                and isinstance(w[3], int) and isinstance(w[4], int)):
            raise CorruptLog(f"bad manifest entry {str(w)[:80]}", "manifest", 0)
        path, kind, mode, mtime, _size, extra = w[:6]
        _check_rel(path)
        if kind == "f":
            ref = BlobRef.from_body(extra) if isinstance(extra, dict) else None
            if ref is None:
                raise CorruptLog(f"file entry {path!r} without a blob", "manifest", 0)
            secret = Secret.from_wire(w[6]) if len(w) == 7 else None
            return cls(path, kind, mode, mtime, ref.size, ref.sha256, "", secret)
        if kind == "l":
            if not isinstance(extra, str):
                raise CorruptLog(f"link entry {path!r} without a target", "manifest", 0)
            return cls(path, kind, mode, mtime, 0, "", extra)
        return cls(path, kind, mode, mtime)


def _check_rel(path: str) -> None:
    if path and (path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/"))):
        raise CorruptLog(f"manifest path {path!r} leaves its root", "manifest", 0)


Tree = dict[str, Entry]


@dataclass
class Manifest:
    """The whole state a snapshot describes: for each root, its entries by path."""

    roots: list[str]
    trees: dict[str, Tree]

    def files(self) -> int:
        return sum(1 for t in self.trees.values() for e in t.values() if e.kind == "f")

    def bytes(self) -> int:
        return sum(e.size for t in self.trees.values() for e in t.values() if e.kind == "f")


# ----------------------------------------------------------------------------- ignore rules


@dataclass(frozen=True)
class IgnoreRules:
    """gitignore-like globs: a pattern with a ``/`` inside is matched against the path
    from the root, one without against every name on the way; a trailing ``/`` matches
    directories only. ``exclude`` are absolute paths never taken (the store, the output)."""

    patterns: tuple[str, ...] = DEFAULT_IGNORE
    exclude: tuple[str, ...] = ()

    def with_file(self, root: str) -> IgnoreRules:
        """These rules plus the root's ``.stenoignore`` (blank lines and ``#`` skipped)."""
        try:
            text = Path(root, IGNORE_FILE).read_text(errors="replace")
        except OSError:
            return self
        extra = tuple(ln.strip() for ln in text.splitlines()
                      if ln.strip() and not ln.lstrip().startswith(("#", "secret:",
                                                                   "!secret:")))
        return IgnoreRules(self.patterns + extra, self.exclude)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return _ignore_matcher(self.patterns).ignored(rel, name, is_dir)


class _IgnoreMatcher:
    """``IgnoreRules.patterns`` compiled, once per set of patterns: a stat walk asks for
    every path, and each pattern matched alone was most of a walk's cost (one every
    model turn, for the files' times)."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        def one(globs: list[str]) -> re.Pattern[str] | None:
            return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs)
                              ) if globs else None

        groups: dict[tuple[bool, bool], list[str]] = {}
        for pat in patterns:
            p = pat.rstrip("/")
            slash = "/" in p
            groups.setdefault((pat.endswith("/"), slash), []).append(
                p.lstrip("/") if slash else p)
        self._name = one(groups.get((False, False), []))
        self._path = one(groups.get((False, True), []))
        self._dir_name = one(groups.get((True, False), []))
        self._dir_path = one(groups.get((True, True), []))

    def ignored(self, rel: str, name: str, is_dir: bool) -> bool:
        if self._name is not None and self._name.match(name):
            return True
        if self._path is not None and self._path.match(rel):
            return True
        if not is_dir:
            return False
        return bool((self._dir_name is not None and self._dir_name.match(name)) or
                    (self._dir_path is not None and self._dir_path.match(rel)))


@functools.lru_cache(maxsize=32)
def _ignore_matcher(patterns: tuple[str, ...]) -> _IgnoreMatcher:
    return _IgnoreMatcher(patterns)


@dataclass(frozen=True)
class Limits:
    files: int = 100_000
    bytes: int = 2 << 30

    @classmethod
    def parse(cls, text: str) -> Limits:
        """``FILES``, ``SIZE`` (a number with K, M or G), or ``FILES:SIZE``."""
        def size(p: str) -> int:
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(p[-1:].upper(), 1)
            return int(float(p[:-1] if mult > 1 else p) * mult)

        try:
            if ":" in text:
                f, b = text.split(":", 1)
                limits = cls(int(f), size(b))
            elif text[-1:].upper() in ("K", "M", "G"):
                limits = cls(cls.files, size(text))
            else:
                limits = cls(int(text), cls.bytes)
        except ValueError:
            raise BadInput(f"--workspace-max: {text!r} is not FILES, SIZE (e.g. 500M) or "
                           "FILES:SIZE") from None
        if limits.files <= 0 or limits.bytes <= 0:
            raise BadInput(f"--workspace-max: {text!r} must be positive")
        return limits


# ----------------------------------------------------------------------------- scanning


@dataclass
class _Seen:
    entry: Entry
    ino: int


def _shape(st: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.S_IFMT(st.st_mode), st.st_mtime_ns, st.st_size, st.st_ino)


def scan(root: str, rules: IgnoreRules, limits: Limits
         ) -> tuple[dict[str, os.stat_result], int]:
    """Stat every path under ``root`` the rules keep: ``{rel: stat}``, and how many
    special files (sockets, fifos, devices) were left out. Over ``limits``:
    ``WorkspaceTooBig``."""
    out: dict[str, os.stat_result] = {}
    skipped = 0
    total = 0
    excluded = set()  # by identity: a realpath per entry would cost an lstat per component
    for x in rules.exclude:
        with contextlib.suppress(OSError):
            st_x = os.stat(x)
            excluded.add((st_x.st_dev, st_x.st_ino))
    try:
        out[""] = os.lstat(root)
    except OSError as exc:
        raise BadInput(f"workspace: {exc.strerror}", root) from None
    stack = [""]
    while stack:
        rel = stack.pop()
        d = os.path.join(root, rel) if rel else root
        try:
            it = list(os.scandir(d))
        except OSError:
            continue
        for de in sorted(it, key=lambda x: x.name):
            r = f"{rel}/{de.name}" if rel else de.name
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if rules.ignored(r, is_dir) or (st.st_dev, st.st_ino) in excluded or (
                    is_dir and is_environment(de.path)):
                continue
            if not (is_dir or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                skipped += 1
                continue
            out[r] = st
            if is_dir:
                stack.append(r)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
            if len(out) > limits.files or total > limits.bytes:
                what = (f"more than {limits.files} files" if len(out) > limits.files
                        else f"more than {limits.bytes >> 20} MiB")
                raise WorkspaceTooBig(
                    f"workspace {root} has {what}: raise --workspace-max, leave parts out "
                    f"with --workspace-ignore GLOB or a {IGNORE_FILE}, name a smaller "
                    "--workspace DIR, or turn snapshots off with --workspace none")
    return out, skipped


# ----------------------------------------------------------------------------- taking


@dataclass
class Taken:
    """One snapshot taken: its manifest's reference and what it cost."""

    ref: BlobRef
    manifest: Manifest
    full: bool
    files: int
    bytes_added: int
    """Bytes of file content this snapshot stored that no earlier one had."""
    manifest_bytes: int
    seconds: float
    skipped: int = 0


@dataclass
class Snapshotter:
    """Snapshots of a fixed set of roots, each after the first incremental."""

    blobs: BlobStore
    roots: list[str]
    rules: IgnoreRules | Mapping[str, IgnoreRules] = field(default_factory=IgnoreRules)
    """One set for every root (each root's ``.stenoignore`` added), or one per root."""
    limits: Limits = field(default_factory=Limits)
    read_from: Callable[[str], str] | None = None
    """Where each root's files are read (a sealed run's view of it, through its
    namespace's ``/proc/<pid>/root``); the manifest still names the root itself."""
    secrets: SecretRules | None = None
    """Secret files and key shapes masked before anything is stored (``secretfiles``);
    None: files are stored as they are."""
    _seen: dict[str, dict[str, _Seen]] = field(default_factory=dict)
    _last: BlobRef | None = None
    _depth: int = 0

    def take(self) -> Taken:
        t0 = time.perf_counter()
        trees: dict[str, Tree] = {}
        added = 0
        skipped = 0
        wrote = False
        for root in self.roots:
            src = self.read_from(root) if self.read_from is not None else root
            rules = (self.rules.with_file(src) if isinstance(self.rules, IgnoreRules)
                     else self.rules.get(root, IgnoreRules()))
            self._root_secrets = (self.secrets.with_file(src) if self.secrets is not None
                                  else None)
            known = self._seen.get(root, {})
            stats, sk = scan(src, rules, self.limits)
            skipped += sk
            tree: Tree = {}
            seen: dict[str, _Seen] = {}
            for rel, st in stats.items():
                prev = known.get(rel)
                made = self._entry(src, rel, st, prev)
                if made is None:
                    continue
                entry, new = made
                if new:
                    added += entry.size
                    wrote = True
                tree[rel] = entry
                seen[rel] = _Seen(entry, st.st_ino)
            trees[root] = tree
            self._seen[root] = seen
            self._shapes[root] = {rel: _shape(st) for rel, st in stats.items() if rel in tree}
        if wrote:
            self.blobs.sync()
        manifest = Manifest(list(self.roots), trees)
        body, full = self._encode(manifest)
        ref = self.blobs.put(body)  # synced: a manifest with a name is complete
        self._prev_manifest = manifest
        self._last = ref
        self._depth = 0 if full else self._depth + 1
        return Taken(ref, manifest, full, manifest.files(), added, len(body),
                     time.perf_counter() - t0, skipped)

    def times(self) -> dict[str, dict[str, int | None]]:
        """What changed since the last snapshot or ``times``, by metadata only (a stat
        walk, nothing read or stored): ``{root: {rel: mtime_ns, or None if gone}}`` --
        the mtimes a turn without a checkpoint leaves, which a replay cannot give back
        (the kernel stamps what the replayed program writes with today's clock)."""
        out: dict[str, dict[str, int | None]] = {}
        for root in self.roots:
            src = self.read_from(root) if self.read_from is not None else root
            rules = (self.rules.with_file(src) if isinstance(self.rules, IgnoreRules)
                     else self.rules.get(root, IgnoreRules()))
            stats, _ = scan(src, rules, self.limits)
            now = {rel: _shape(st) for rel, st in stats.items()}
            last = self._shapes.get(root, {})
            delta: dict[str, int | None] = {rel: sh[1] for rel, sh in now.items()
                                            if last.get(rel) != sh}
            delta.update({rel: None for rel in last if rel not in now})
            self._shapes[root] = now
            out[root] = delta
        return out

    def __post_init__(self) -> None:
        self._shapes: dict[str, dict[str, tuple[int, int, int, int]]] = {}
        """Per root, each path's (type, mtime_ns, size, inode) at the last look."""
        self._prev_manifest: Manifest | None = None
        self._root_secrets: SecretRules | None = None
        self.redacted: list[tuple[str, Secret]] = []
        """Files stored masked so far (relative path, what was masked): the run's
        summary counts them."""
        self.secret_values: set[str] = set()
        """The values masked so far (``secretfiles.Masked.values``): the hooks learn
        them."""

    def _entry(self, root: str, rel: str, st: os.stat_result, prev: _Seen | None
               ) -> tuple[Entry, bool] | None:
        """The entry for one path, and whether its content was new to the blob store."""
        path = os.path.join(root, rel) if rel else root
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            return Entry(rel, "d", mode, st.st_mtime_ns), False
        if stat.S_ISLNK(st.st_mode):
            try:
                return Entry(rel, "l", mode, st.st_mtime_ns, 0, "", os.readlink(path)), False
            except OSError:
                return None
        if (prev is not None and prev.entry.kind == "f" and prev.ino == st.st_ino
                and prev.entry.size == st.st_size and prev.entry.mtime_ns == st.st_mtime_ns):
            return Entry(rel, "f", mode, st.st_mtime_ns, st.st_size, prev.entry.sha256, "",
                         prev.entry.secret), False
        secrets = self._root_secrets
        try:
            if secrets is not None and st.st_size <= SCAN_MAX:
                with open(path, "rb") as f:
                    data = f.read(SCAN_MAX + 1)
                red = secrets.redact(rel, data)
                body, secret = (red[0].data, red[1]) if red is not None else (data, None)
                ref, new = self.blobs.put_new(body)
                if red is not None:
                    self.redacted.append((rel, red[1]))
                    self.secret_values.update(red[0].values)
                return Entry(rel, "f", mode, st.st_mtime_ns, ref.size, ref.sha256, "",
                             secret), new
            ref, new = self.blobs.put_file(path, sync=False)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return None  # gone (or unreadable) while we looked
        return Entry(rel, "f", mode, st.st_mtime_ns, ref.size, ref.sha256), new

    def _encode(self, manifest: Manifest) -> tuple[bytes, bool]:
        prev = self._prev_manifest
        if prev is None or self._last is None or self._depth + 1 > MAX_DEPTH \
                or prev.roots != manifest.roots:
            return pack_full(manifest), True
        return pack_delta(prev, manifest, self._last, self._depth + 1), False


def pack_full(m: Manifest) -> bytes:
    return msgpack.packb({"v": MANIFEST_VERSION, "kind": "full", "roots": m.roots,
                          "trees": {r: [e.to_wire() for e in sorted(t.values(),
                                                                   key=lambda e: e.path)]
                                    for r, t in m.trees.items()}}, use_bin_type=True)


def pack_delta(base: Manifest, m: Manifest, base_ref: BlobRef, depth: int) -> bytes:
    changed: dict[str, list[Any]] = {}
    removed: dict[str, list[str]] = {}
    for r in m.roots:
        old, new = base.trees.get(r, {}), m.trees.get(r, {})
        ch = [e.to_wire() for p, e in sorted(new.items()) if old.get(p) != e]
        rm = sorted(p for p in old if p not in new)
        if ch:
            changed[r] = ch
        if rm:
            removed[r] = rm
    return msgpack.packb({"v": MANIFEST_VERSION, "kind": "delta", "base": base_ref.to_body(),
                          "depth": depth, "roots": m.roots, "changed": changed,
                          "removed": removed}, use_bin_type=True)


# ----------------------------------------------------------------------------- reading


def unpack_manifest(data: bytes) -> dict[str, Any]:
    """One manifest blob's map, checked for its version, kind and roots (``CorruptLog``
    otherwise): what a reader of a single manifest (``gc``) needs without the chain."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception as exc:
        raise CorruptLog(f"manifest does not decode: {type(exc).__name__}", "manifest", 0
                         ) from None
    if not isinstance(obj, dict) or obj.get("v") not in READABLE_VERSIONS \
            or obj.get("kind") not in ("full", "delta"):
        raise CorruptLog("not a snapshot manifest", "manifest", 0)
    roots = obj.get("roots")
    if not (isinstance(roots, list) and all(isinstance(r, str) and r.startswith("/")
                                            for r in roots)):
        raise CorruptLog("manifest without absolute roots", "manifest", 0)
    return obj


def _chain(blobs: BlobStore | MapBlobs, ref: BlobRef) -> list[dict[str, Any]]:
    """The manifests from ``ref`` back to its full base, newest first."""
    out: list[dict[str, Any]] = []
    cur: BlobRef | None = ref
    while cur is not None:
        if len(out) > 4 * MAX_DEPTH:
            raise CorruptLog("manifest delta chain too long", "manifest", 0)
        obj = unpack_manifest(blobs.get(cur))
        out.append(obj)
        if obj["kind"] == "full":
            return out
        base = obj.get("base")
        cur = BlobRef.from_body(base) if isinstance(base, dict) else None
        if cur is None:
            raise CorruptLog("delta manifest without a base", "manifest", 0)
    return out


def load_manifest(blobs: BlobStore | MapBlobs, ref: BlobRef) -> Manifest:
    """The whole state a manifest (full, or a delta chain) describes."""
    chain = _chain(blobs, ref)
    full = chain[-1]
    trees: dict[str, Tree] = {}
    for r, entries in (full.get("trees") or {}).items():
        trees[r] = {e.path: e for e in (Entry.from_wire(w) for w in entries)}
    for obj in reversed(chain[:-1]):
        for r, paths in (obj.get("removed") or {}).items():
            t = trees.setdefault(r, {})
            for p in paths:
                t.pop(p, None)
        for r, entries in (obj.get("changed") or {}).items():
            t = trees.setdefault(r, {})
            for e in (Entry.from_wire(w) for w in entries):
                t[e.path] = e
    roots = list(chain[0]["roots"])
    return Manifest(roots, {r: trees.get(r, {}) for r in roots})


def closure(blobs: BlobStore | MapBlobs, ref: BlobRef) -> list[BlobRef]:
    """Every blob a snapshot needs: its manifests and the files they name."""
    out: dict[str, BlobRef] = {}
    cur: BlobRef | None = ref
    while cur is not None:
        out[cur.sha256] = cur
        obj = unpack_manifest(blobs.get(cur))
        for r in blob_refs({k: v for k, v in obj.items() if k != "base"}):
            out.setdefault(r.sha256, r)
        base = obj.get("base") if obj["kind"] == "delta" else None
        cur = BlobRef.from_body(base) if isinstance(base, dict) else None
    return list(out.values())


class MapBlobs:
    """Blobs held in memory (a ``.steno`` file's), read like a ``BlobStore``."""

    def __init__(self, blobs: Mapping[str, bytes]) -> None:
        self._m = blobs

    def get(self, ref: BlobRef | str) -> bytes:
        sha = ref.sha256 if isinstance(ref, BlobRef) else ref
        try:
            return self._m[sha]
        except KeyError:
            raise CorruptLog(f"snapshot blob {sha[:16]}... is missing", "snapshot",
                             0) from None

    def has(self, sha: str) -> bool:
        return sha in self._m


# ----------------------------------------------------------------------------- restoring


def restore_tree(blobs: BlobStore | MapBlobs, tree: Tree, dest: str | Path) -> None:
    """Make ``dest`` hold ``tree`` exactly: types, bytes, modes, link targets, mtimes.
    ``dest`` must not exist or be an empty directory."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    entries = sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path))
    for e in entries:
        if not e.path:
            continue
        p = dest / e.path
        if e.kind == "d":
            p.mkdir(exist_ok=True)
        elif e.kind == "l":
            os.symlink(e.target, p)
        else:
            with open(p, "wb") as f:
                f.write(blobs.get(BlobRef(e.sha256, e.size)))
    apply_meta(tree, dest)


def apply_meta(tree: Tree, dest: str | Path) -> None:
    """Modes and mtimes of a restored ``tree`` (deepest first: making an entry changes
    its directory's mtime)."""
    dest = Path(dest)
    for e in sorted(tree.values(), key=lambda e: -e.path.count("/") - (e.path != "")):
        p = dest / e.path if e.path else dest
        if e.kind != "l":
            os.chmod(p, e.mode)
        os.utime(p, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)


def reset_tree(blobs: BlobStore | MapBlobs, tree: Tree, root: str | Path,
               rules: IgnoreRules) -> int:
    """Make the live directory ``root`` hold ``tree`` again, in place: what the rules
    keep and ``tree`` lacks is removed, what differs is rewritten (a file whose size and
    mtime agree is taken as unchanged, as an incremental snapshot does), modes and mtimes
    put back. What the rules leave out (a virtualenv, caches) is not touched. Returns the
    number of paths changed."""
    import shutil

    root = Path(root)
    changed = 0
    now, _ = scan(str(root), rules, Limits(files=1 << 40, bytes=1 << 62))
    for rel in sorted((r for r in now if r), key=lambda r: -r.count("/")):
        want, st = tree.get(rel), now[rel]
        kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
        if want is not None and want.kind == kind and (
                kind == "d" or (kind == "l" and os.readlink(root / rel) == want.target)
                or (kind == "f" and st.st_size == want.size and st.st_mtime_ns == want.mtime_ns)):
            continue
        p = root / rel
        if kind == "d" and (want is None or want.kind != "d"):
            shutil.rmtree(p, ignore_errors=True)
            changed += 1
        elif kind != "d":
            p.unlink(missing_ok=True)
            changed += 1
    for e in sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path)):
        if not e.path:
            continue
        p = root / e.path
        if e.kind == "d":
            if not p.is_dir():
                p.mkdir()
                changed += 1
        elif not os.path.lexists(p):
            if e.kind == "l":
                os.symlink(e.target, p)
            else:
                with open(p, "wb") as f:
                    f.write(blobs.get(BlobRef(e.sha256, e.size)))
            changed += 1
    apply_meta(tree, root)
    return changed


def restore(blobs: BlobStore | MapBlobs, manifest: Manifest,
            dests: Mapping[str, str | Path]) -> None:
    """Each root of ``manifest`` restored at ``dests[root]``."""
    for root in manifest.roots:
        restore_tree(blobs, manifest.trees.get(root, {}), dests[root])


# ----------------------------------------------------------------------------- cadence


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's refinement of Young's optimal checkpoint interval ``sqrt(2 * delta * M)``
    (seconds of work between checkpoints, for a checkpoint costing ``delta`` seconds and
    a mean time between failures ``M``)."""
    if delta <= 0:
        return 0.0
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


@dataclass
class Cadence:
    """When the next turn gets a checkpoint: every ``every`` turns if given, else every
    T* turns, T* = Daly's interval over the measured cost of a snapshot and the mean
    duration of a turn so far."""

    mtbf: float = 4 * 3600.0
    every: int | None = None
    cost: float = 0.0
    _since: int = 0
    _turns: int = 0
    _t0: float = field(default_factory=time.monotonic)

    def turns_between(self) -> int:
        if self.every is not None:
            return self.every
        if self._turns == 0:
            return 1 << 30
        per_turn = max((time.monotonic() - self._t0) / self._turns, 1e-6)
        return max(1, round(daly_interval(self.cost, self.mtbf) / per_turn))

    def turn(self) -> bool:
        """A turn ended: is a checkpoint due now?"""
        self._turns += 1
        self._since += 1
        if self._since >= self.turns_between():
            self._since = 0
            return True
        return False

    def took(self, seconds: float) -> None:
        self.cost = seconds


def ensure_roots(roots: Iterable[str]) -> list[str]:
    """Absolute, real, existing directories, each once, none inside another."""
    out: list[str] = []
    for r in roots:
        real = os.path.realpath(r)
        if not os.path.isdir(real):
            raise BadInput("--workspace: not a directory", r)
        if real == "/":
            raise BadInput("--workspace: the whole filesystem cannot be a workspace", r)
        if real not in out:
            out.append(real)
    for a in out:
        for b in out:
            if a != b and b.startswith(a.rstrip("/") + "/"):
                raise BadInput(f"--workspace: {b} is inside {a}", b)
    return out


def paths_within(roots: Sequence[str], path: str) -> str | None:
    """The root ``path`` is in, if any."""
    real = os.path.realpath(path)
    for r in roots:
        if real == r or real.startswith(r.rstrip("/") + "/"):
            return r
    return None


# ----------------------------------------------------------------------------- recordings


def start_snapshot(events: Sequence[Any]) -> BlobRef | None:
    """The snapshot a recording took before its program started (its ``start``
    checkpoint), if it took one."""
    for ev in events:
        if ev.kind == "Checkpoint" and isinstance(ev.body, dict) \
                and ev.body.get("at") == "start":
            return BlobRef.from_body(ev.body["snapshot"])
    return None


def recorded_rules(started: Mapping[str, Any]) -> dict[str, IgnoreRules]:
    """The ignore rules each workspace root was snapshotted with (``RunStarted``)."""
    ws = started.get("workspace") or {}
    out = {}
    for r in ws.get("roots") or []:
        if isinstance(r, dict) and isinstance(r.get("path"), str):
            out[r["path"]] = IgnoreRules(tuple(str(p) for p in r.get("ignore") or ()),
                                         tuple(str(p) for p in r.get("exclude") or ()))
    return out
