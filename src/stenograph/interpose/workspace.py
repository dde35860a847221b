"""The workspace of a run: which directories are snapshotted at record, and what a
sealed replay mounts over them.

Record: ``plan`` turns the command line (``--workspace``, ``--workspace-ignore``,
``--workspace-max``) into roots and rules, checked before anything is created (a
workspace over the limits is refused before the program starts). The rules are recorded
in ``RunStarted`` as they were applied, ``.stenoignore`` lines included.

Replay: ``prepare`` restores the start snapshot of each root into the tape directory
and returns the mounts ``launch.Seal`` makes in the replay's private mount namespace:
an overlay on each root whose lower layers are the restored tree and, beneath it, the
live directory -- so what the rules left out (a virtualenv, caches, stenograph's own
files) is the live one -- with a whiteout in the restored layer for every live entry
the snapshot did not have. The program sees the recorded files at the recorded paths,
whatever the real directory holds now; what it writes lands in the overlay's upper
layer (scratch, or ``--keep-writes DIR``), never in the real files. A root that no
longer exists is mounted through its nearest existing ancestor.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stenograph.recorder.blobs import BlobRef
from stenograph.recorder.errors import BadInput
from stenograph.recorder.snapshots import (
    DEFAULT_IGNORE,
    IgnoreRules,
    Limits,
    Manifest,
    Tree,
    apply_meta,
    ensure_roots,
    restore_tree,
    scan,
)

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
"""stenograph itself: never in a snapshot, always live (a replay runs today's hooks)."""


@dataclass(frozen=True)
class WorkspacePlan:
    roots: list[str]
    rules: dict[str, IgnoreRules]
    limits: Limits

    def to_body(self) -> dict[str, Any]:
        return {"roots": [{"path": r, "ignore": list(self.rules[r].patterns),
                           "exclude": list(self.rules[r].exclude)} for r in self.roots]}


def plan(workspaces: Sequence[str], ignores: Sequence[str], limit: str | None,
         cwd: str, exclude: Sequence[str]) -> WorkspacePlan | None:
    """The roots and rules a record will snapshot (None: ``--workspace none``); scans
    each root once to refuse a workspace over the limits before anything is made."""
    if any(w == "none" for w in workspaces):
        if len(workspaces) > 1:
            raise BadInput("--workspace none cannot be combined with other directories")
        return None
    roots = ensure_roots(list(workspaces) or [cwd])
    limits = Limits.parse(limit) if limit else Limits()
    excl = tuple(os.path.realpath(x) for x in (*exclude, PACKAGE_DIR))
    rules = {}
    for r in roots:
        rules[r] = IgnoreRules(DEFAULT_IGNORE + tuple(ignores), excl).with_file(r)
        scan(r, rules[r], limits)
    return WorkspacePlan(roots, rules, limits)


# ----------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class WorkspaceMount:
    """One overlay of a sealed replay: mounted on ``target``, lower layers ``lowers``
    (first on top); ``name`` keeps its upper layer apart under ``--keep-writes``."""

    target: str
    lowers: tuple[str, ...]
    name: str
    binds: tuple[str, ...] = ()
    """Live directories the rules leave out (a virtualenv, caches), bound back over the
    overlay: reached at full speed, not through overlayfs' lookups."""
    create: bool = False
    """``target`` does not exist here and lies in a temporary directory the seal makes
    scratch: it is made there (never on the real disk) before the overlay goes on it."""


TEMP_ROOTS = ("/tmp", "/var/tmp")
"""Directories every sealed replay overlays with scratch (``launch.seal_roots`` adds
``$TMPDIR``)."""


def start_snapshot(events: Sequence[Any]) -> BlobRef | None:
    for ev in events:
        if ev.kind == "Checkpoint" and isinstance(ev.body, dict) \
                and ev.body.get("at") == "start":
            return BlobRef.from_body(ev.body["snapshot"])
    return None


def recorded_rules(started: Mapping[str, Any]) -> dict[str, IgnoreRules]:
    ws = started.get("workspace") or {}
    out = {}
    for r in ws.get("roots") or []:
        if isinstance(r, dict) and isinstance(r.get("path"), str):
            out[r["path"]] = IgnoreRules(tuple(str(p) for p in r.get("ignore") or ()),
                                         tuple(str(p) for p in r.get("exclude") or ()))
    return out


def prepare(manifest: Manifest, blobs: Any, rules: Mapping[str, IgnoreRules],
            stage: Path, live: Sequence[str] = ()) -> list[WorkspaceMount]:
    """Restore each root of ``manifest`` under ``stage`` and say how to mount it.
    ``live``: paths the replay sees as they are now (the code of an edited command)."""
    mounts: list[WorkspaceMount] = []
    live_real = [os.path.realpath(p) for p in live]
    for i, root in enumerate(manifest.roots):
        tree = manifest.trees.get(root, {})
        rule = rules.get(root, IgnoreRules())
        keep_live = tuple(p for p in live_real if p.startswith(root.rstrip("/") + "/"))
        if keep_live:
            rels = [os.path.relpath(p, root) for p in keep_live]
            tree = {k: e for k, e in tree.items()
                    if not any(k == r or k.startswith(r + "/") for r in rels)}
        rule = IgnoreRules(rule.patterns, (*rule.exclude, PACKAGE_DIR, *keep_live))
        name = f"{i}-{os.path.basename(root) or 'root'}"
        if os.path.isdir(root) and not os.path.islink(root):
            lower = stage / f"ws{i}"
            restore_tree(blobs, tree, lower)
            binds = _whiteouts(tree, root, lower, rule)
            apply_meta(tree, lower)  # the whiteouts touched the directories
            mounts.append(WorkspaceMount(root, (str(lower), root), name, tuple(binds)))
        else:
            anc = root
            while not os.path.isdir(anc):
                anc = os.path.dirname(anc)
            temps = {*TEMP_ROOTS, os.path.realpath(tempfile.gettempdir())}
            if any(anc == t or anc.startswith(t + "/") for t in temps):
                # an overlay on /tmp itself would have the tape (in /tmp) inside its own
                # lower layer, which overlayfs refuses: make the root in the scratch /tmp
                lower = stage / f"ws{i}"
                restore_tree(blobs, tree, lower)
                mounts.append(WorkspaceMount(root, (str(lower),), name, create=True))
                continue
            rel = os.path.relpath(root, anc)
            wrap = stage / f"ws{i}-wrap"
            restore_tree(blobs, tree, wrap / rel)
            _fix_parents(wrap, rel)
            mounts.append(WorkspaceMount(anc, (str(wrap), anc), name))
    return mounts


def _fix_parents(wrap: Path, rel: str) -> None:
    """The directories made on the way to a restored root: readable, like the live ones."""
    p = wrap
    for part in Path(rel).parts[:-1]:
        p = p / part
        os.chmod(p, 0o755)


def _whiteouts(tree: Tree, root: str, lower: Path, rules: IgnoreRules) -> list[str]:
    """Hide every live entry under ``root`` that the snapshot lacks and the rules keep;
    return the live directories the rules leave out (to bind back)."""
    excluded = set(rules.exclude)
    binds: list[str] = []
    for d in sorted(p for p, e in tree.items() if e.kind == "d"):
        live = os.path.join(root, d) if d else root
        try:
            st = os.lstat(live)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        try:
            names = os.listdir(live)
        except OSError:
            continue
        for name in names:
            rel = f"{d}/{name}" if d else name
            if rel in tree:
                continue
            full = os.path.join(live, name)
            is_dir = os.path.isdir(full) and not os.path.islink(full)
            if rules.ignored(rel, is_dir) or os.path.realpath(full) in excluded:
                if is_dir:
                    binds.append(full)
                continue
            try:
                os.mknod(lower / rel, stat.S_IFCHR | 0o600, 0)  # an overlayfs whiteout
            except PermissionError:
                raise BadInput("the sealed workspace needs root (overlayfs whiteouts); "
                               "rerun as root, or with --unsealed", root) from None
    return binds
