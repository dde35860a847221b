"""What a run that starts from a recording is given: replay, build replay, resume and fork
all come through here.

The recording's shim protocol is checked once (``protocol``: an exact replay of another
protocol stops before anything is prepared); the tape directory is
filled from the events (the shim's streams, the hooks' ``py/`` tape, the key shapes the
recording redacted with); the recorded workspace is restored from its start snapshot for
the seal's overlays, secret files served as ``recorder/secretfiles.py`` says; the
environment is the recorded one, a redacted secret taking this environment's value; and
the seal (``runner/seal.py``) hides the names the recording made in /tmp.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder import keyshapes
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput, CorruptLog
from stenograph.recorder.exchanges import prepare_py_tape
from stenograph.recorder.secretfiles import recorded_secrets, write_values
from stenograph.recorder.snapshots import MapBlobs, load_manifest, recorded_rules, start_snapshot
from stenograph.recorder.tape import prepare_tape, recorded_listings
from stenograph.runner import buildcode
from stenograph.runner.buildcode import CodeMap
from stenograph.runner.env import replay_env
from stenograph.runner.lines import protocol_line
from stenograph.runner.seal import Seal, born_since, gone_from, seal_roots
from stenograph.runner.settings import STACK_LIKE
from stenograph.runner.shim import EXACT, PROTOCOL, readable
from stenograph.runner.workspace import SecretServed, WorkspaceMount
from stenograph.runner.workspace import prepare as prepare_workspace


def recorded_protocol(started: Mapping[str, Any]) -> str:
    """The protocol the recording's shim spoke, as its header says (``?``: none)."""
    return str(started.get("shim") or "?").partition("/")[0]


def protocol(started: Mapping[str, Any], where: str, *, build: bool = False,
             offer_build: bool = True) -> int | None:
    """The shim protocol the recording's C tape is read as. A run that replays it exactly
    (not ``build``: a replay, a resume's or a fork's prefix) needs one this shim replays
    bit for bit (``EXACT``); any other stops here, before anything is prepared or run,
    in one line that names both protocols and the ways on (``lines.protocol_line``; the
    build replay only where ``offer_build``). A build replay reads what it can
    (``READS``) and runs any other tape live: None."""
    found = readable(started.get("shim"))
    if build:
        return found
    if found not in EXACT:
        shim = started.get("shim")
        raise BadInput(protocol_line(
            recorded_protocol(started), PROTOCOL, where, offer_build=offer_build,
            release=str(started["stenograph"]) if started.get("stenograph") else None,
            shim=str(shim) if shim else None), where)
    return found


def environ(started: Mapping[str, Any], where: str,
            overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The program's environment: the recorded one, each redacted secret this
    environment's value if it has one, then ``overrides``."""
    rec_env = started.get("env") or {}
    if not isinstance(rec_env, dict):
        raise CorruptLog("RunStarted has no environment map", where, 0)
    env = replay_env({str(k): str(v) for k, v in rec_env.items()}, dict(os.environ))
    env.update(overrides or {})
    stack = started.get("stack")
    if isinstance(stack, dict) and {"env_bytes", "env_vars"} <= set(stack):
        env[STACK_LIKE] = f"{int(stack['env_bytes'])},{int(stack['env_vars'])}"
    return env


def fill_tape(tape: Path, started: Mapping[str, Any], events: Sequence[Event],
              blobs: Mapping[str, bytes] | BlobStore, *, protocol: int | None,
              killed: int | None = None, extra: Iterable[Event] = ()) -> None:
    """The tape directory for ``events``: the shim's streams (none for a protocol it
    cannot read), the hooks' tape with ``extra`` exchanges after the recorded ones, and
    the recording's key shapes."""
    if protocol is not None:
        prepare_tape(events, tape, killed=killed, protocol=protocol)
    prepare_py_tape([*events, *extra], tape, blobs)
    keyshapes.install(keyshapes.for_run(dict(started)), tape)


@dataclass
class Workspace:
    """The recorded workspace as a sealed run sees it."""

    mounts: list[WorkspaceMount] = field(default_factory=list)
    secret_files: list[SecretServed] = field(default_factory=list)


def restore_workspace(tape: Path, started: Mapping[str, Any], events: Sequence[Event],
                      blobs: Mapping[str, bytes], *, live: Sequence[str] = (),
                      code_globs: Sequence[str] | None = None,
                      maps: Sequence[CodeMap] = ()) -> Workspace:
    """Each recorded workspace root restored from the start snapshot under ``tape/ws``
    for an overlay (nothing when the recording took no snapshot). ``live`` paths are
    shown as they are now; ``code_globs`` names a build's code, live too (``("none",)``:
    none), except under the recorded side of a code map (``maps``), which is data
    (``buildcode``). The values of the secret files served live go beside the tape for
    the hooks to learn."""
    snap = start_snapshot(list(events))
    if snap is None:
        return Workspace()
    blob_map = MapBlobs(dict(blobs))
    manifest = load_manifest(blob_map, snap)
    rules = recorded_rules(dict(started))
    live = list(live)
    if code_globs is not None and tuple(code_globs) != ("none",):
        live += buildcode.code_paths({r: manifest.trees.get(r, {}) for r in manifest.roots},
                                     rules, code_globs or buildcode.CODE_GLOBS,
                                     skip=[m.recorded for m in maps])
    out = Workspace()
    t0 = started.get("started")
    out.mounts = prepare_workspace(manifest, blob_map, rules, tape / "ws", live=live,
                                   since=float(t0) if isinstance(t0, (int, float)) else None,
                                   secrets=out.secret_files,
                                   secret_rules=recorded_secrets(
                                       dict(started), keyshapes.for_run(dict(started))))
    write_values({v for n in out.secret_files for v in n.values}, tape)
    return out


def killed_by(ended: Mapping[str, Any]) -> int | None:
    """The signal that ended the recorded run, if one did (exit status ``-signal``)."""
    status = ended.get("status")
    return -status if isinstance(status, int) and status < 0 else None


def _blob_json(ref: Any, blobs: Any) -> Any:
    """The JSON in blob ``ref`` (zlib-compressed or not), or None."""
    if blobs is None or not isinstance(ref, dict) or ref.get("$blob") not in blobs:
        return None
    try:
        data = blobs[ref["$blob"]]
        with contextlib.suppress(zlib.error):
            data = zlib.decompress(data)
        return json.loads(data)
    except Exception:  # an export without the blob: nothing given back
        return None


def seal(started: Mapping[str, Any], tape: Path, *, hide: Any, keep: Sequence[Path],
         workspaces: Sequence[WorkspaceMount] = (), cwd: str | None = None,
         keep_writes: Path | None = None, since_recorded: bool = True,
         blobs: Mapping[str, bytes] | None = None) -> Seal:
    """The private view a run from a recording gets (``runner.seal.Seal``): ``hide``
    (``{root: [name...]}``) in the temporary roots, and with ``since_recorded`` every
    name born there since the recording started too (``seal.born_since``); the recorded
    host state put back, ``keep`` the real directories, the workspace overlaid, ``cwd``
    entered."""
    state = started.get("sealed_state") or {}
    stage = tape / ".seal"
    stage.mkdir(exist_ok=True)
    hidden = {str(k): [str(n) for n in v] for k, v in (hide or {}).items()
              if isinstance(v, list)}
    t0 = started.get("started")
    place: dict[str, list[tuple[str, str]]] = {}
    if since_recorded and isinstance(t0, (int, float)):
        roots = seal_roots(os.environ)
        spare = [str(k) for k in keep] + [m.target for m in workspaces] + [str(stage)]
        if isinstance(cwd, str):
            spare.append(cwd)
        listed = list(recorded_listings(tape, roots))
        for root, names in born_since(listed, roots, float(t0), spare).items():
            hidden[root] = sorted(set(hidden.get(root, [])) | set(names))
        tree = _blob_json(started.get("tmp_tree"), blobs)
        if isinstance(tree, dict):
            place = gone_from(tree, listed, spare)
    return Seal(
        place=place,
        hide=hidden,
        state={str(k): v for k, v in state.items() if v is None or isinstance(v, dict)},
        keep=[str(Path(k).resolve()) for k in keep], stage=str(stage.resolve()),
        workspaces=list(workspaces), cwd=cwd,
        keep_writes=str(keep_writes.resolve()) if keep_writes else None)


def here(cmd: list[str], recorded_cwd: Any) -> list[str]:
    """A command typed here runs in the recorded working directory: if that is not this
    one, its relative paths that name files here (the program, a script) are made
    absolute first."""
    if not isinstance(recorded_cwd, str) or os.path.realpath(recorded_cwd) == os.getcwd():
        return cmd
    out = []
    for i, a in enumerate(cmd):
        if not os.path.isabs(a) and ((i == 0 and "/" in a) or i > 0) and os.path.isfile(a):
            a = os.path.abspath(a)
        out.append(a)
    return out
