"""The workspace of a run: which directories are snapshotted at record, and what a
sealed replay mounts over them.

Record: ``plan`` turns the command line (``--workspace``, ``--workspace-ignore``,
``--workspace-max``) into roots and rules, checked before anything is created (a
workspace over the limits is refused before the program starts). The rules are recorded
in ``RunStarted`` as they were applied, ``.stenoignore`` lines included.

Replay: ``prepare`` restores the start snapshot of each root into the tape directory
and returns the mounts ``seal.Seal`` makes in the replay's private mount namespace:
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.recorder.keyshapes import KeyShapes
from stenograph.recorder.secretfiles import (
    NOT_SECRET,
    SECRET_FILES,
    SecretRules,
    mask_file,
    mask_values,
)
from stenograph.recorder.snapshots import (
    DEFAULT_IGNORE,
    IgnoreRules,
    Limits,
    Manifest,
    Tree,
    apply_meta,
    ensure_roots,
    is_environment,
    restore_tree,
    scan,
)
from stenograph.runner.birth import birth_time

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
"""stenograph itself: never in a snapshot, always live (a replay runs today's hooks)."""


@dataclass(frozen=True)
class WorkspacePlan:
    roots: list[str]
    rules: dict[str, IgnoreRules]
    limits: Limits
    secrets: SecretRules = field(default_factory=SecretRules)

    def to_body(self) -> dict[str, Any]:
        return {"roots": [{"path": r, "ignore": list(self.rules[r].patterns),
                           "exclude": list(self.rules[r].exclude)} for r in self.roots],
                **self.secrets.to_body()}


def plan(workspaces: Sequence[str], ignores: Sequence[str], limit: str | None,
         cwd: str, exclude: Sequence[str], secret: Sequence[str] = (),
         not_secret: Sequence[str] = (), shapes: KeyShapes | None = None
         ) -> WorkspacePlan | None:
    """The roots and rules a record will snapshot (None: ``--workspace none``); scans
    each root once to refuse a workspace over the limits before anything is made.
    ``secret`` / ``not_secret``: globs added to / taken from the secret files."""
    if any(w == "none" for w in workspaces):
        if len(workspaces) > 1:
            raise BadInput("--workspace none cannot be combined with other directories")
        return None
    for g in (*secret, *not_secret):
        if not g.strip() or "\0" in g:
            raise BadInput("--workspace-secret / --workspace-not-secret want a glob", g)
    secrets = SecretRules(SECRET_FILES + tuple(secret), NOT_SECRET + tuple(not_secret),
                          shapes)
    roots = ensure_roots(list(workspaces) or [cwd])
    limits = Limits.parse(limit) if limit else Limits()
    excl = tuple(os.path.realpath(x) for x in (*exclude, PACKAGE_DIR))
    rules = {}
    for r in roots:
        rules[r] = IgnoreRules(DEFAULT_IGNORE + tuple(ignores), excl).with_file(r)
        scan(r, rules[r], limits)
    return WorkspacePlan(roots, rules, limits, secrets)


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
"""Directories every sealed replay overlays with scratch (``seal.seal_roots`` adds
``$TMPDIR``)."""


@dataclass(frozen=True)
class SecretServed:
    """A file the recording holds masked, and what the replay gives the program instead:
    the live file (``same``: whether it is the recorded one, by its digest) or, with no
    live file at that path, the masked bytes."""

    path: str
    served: str  # "live" or "masked"
    same: bool | None
    values: tuple[str, ...] = ()
    """The live file's secrets (served live): the hooks learn them, so the program's
    requests are redacted as the recording's were (never written anywhere else)."""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "served": self.served, "same": self.same}

    def line(self) -> str:
        if self.served == "masked":
            return (f"{self.path} was recorded with its secrets masked and is not in the "
                    "live workspace: the replay read the masked copy")
        return (f"{self.path} was recorded with its secrets masked; the replay read the live "
                "one, which is not the file recorded")


def prepare(manifest: Manifest, blobs: Any, rules: Mapping[str, IgnoreRules],
            stage: Path, live: Sequence[str] = (),
            secrets: list[SecretServed] | None = None,
            secret_rules: SecretRules | None = None,
            since: float | None = None) -> list[WorkspaceMount]:
    """Restore each root of ``manifest`` under ``stage`` and say how to mount it.
    ``live``: paths the replay sees as they are now (the code of an edited command).
    ``since``: the recording's start; a path the rules leave out made after it (a cache
    the recorded run built, ``.mypy_cache``, ``node_modules``) is hidden, not live; a
    virtualenv or the code under test stays live whenever it was made.
    A file recorded masked (``secretfiles``) is served live where the path holds a file
    now (it is not restored, so the live layer shows through), else masked; each is
    noted in ``secrets``."""
    mounts: list[WorkspaceMount] = []
    live_real = [os.path.realpath(p) for p in live]
    for i, root in enumerate(manifest.roots):
        tree = manifest.trees.get(root, {})
        served_live = _secrets_live(tree, root, secrets, secret_rules)
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
            shown = {k: e for k, e in tree.items() if k not in served_live}
            restore_tree(blobs, shown, lower)
            binds = _whiteouts(tree, root, lower, rule, since)
            apply_meta(shown, lower)  # the whiteouts touched the directories
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


def _secrets_live(tree: Tree, root: str, notes: list[SecretServed] | None,
                  rules: SecretRules | None) -> set[str]:
    """The masked files of ``tree`` the replay serves live (a regular file is at the path
    now: restore skips them and the live layer shows through); every masked file noted,
    with the live one's secrets (``rules``: the recording's)."""
    live_ones: set[str] = set()
    for rel, e in tree.items():
        if e.secret is None or e.kind != "f":
            continue
        path = os.path.join(root, rel)
        same = None
        values: tuple[str, ...] = ()
        live = os.path.isfile(path) and not os.path.islink(path)
        if live:
            try:
                with open(path, "rb") as f:
                    data = f.read()
                same = e.secret.matches(data)
            except OSError:
                live = False
            else:
                masked = (mask_file(data) if e.secret.why == "file" else
                          mask_values(data, rules.shapes if rules else None))
                values = masked.values
        if live:
            live_ones.add(rel)
        if notes is not None:
            notes.append(SecretServed(path, "live" if live else "masked", same, values))
    return live_ones


def _fix_parents(wrap: Path, rel: str) -> None:
    """The directories made on the way to a restored root: readable, like the live ones."""
    p = wrap
    for part in Path(rel).parts[:-1]:
        p = p / part
        os.chmod(p, 0o755)


def _made_since(path: str, since: float | None) -> bool:
    born = birth_time(path) if since is not None else None
    return born is not None and since is not None and born >= since


def _whiteouts(tree: Tree, root: str, lower: Path, rules: IgnoreRules,
               since: float | None = None) -> list[str]:
    """Hide every live entry under ``root`` that the snapshot lacks and the rules keep,
    and every one the rules leave out that was made since ``since``; return the other
    live directories the rules leave out (to bind back)."""
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
            env_or_code = os.path.realpath(full) in excluded or (
                is_dir and is_environment(full))
            if env_or_code or (rules.ignored(rel, is_dir) and not _made_since(full, since)):
                if is_dir:
                    binds.append(full)
                continue
            try:
                os.mknod(lower / rel, stat.S_IFCHR | 0o600, 0)  # an overlayfs whiteout
            except PermissionError:
                raise BadInput("the sealed workspace needs overlayfs whiteouts, which this "
                               "kernel lets only root make (Linux < 5.8); rerun as root, or "
                               "with --unsealed", root) from None
    return binds
