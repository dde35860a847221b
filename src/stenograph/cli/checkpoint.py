"""``stenograph checkpoint ls`` and ``stenograph checkpoint restore``: the files of a
recorded run at any turn.

A turn is a model request: turn N is the moment the program sent its N-th one (counted
over the whole run, in the order the recorder took them). ``restore --at N`` takes the
checkpoint recorded at N when there is one; otherwise it replays the recording, sealed,
up to that request and takes the files from there (``interpose/stoppoint.py``): the
start snapshot plus everything the replayed program wrote, which is what it wrote when
it was recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import RECORDING, emit_json, json_stream_options
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.checkpoints import CheckpointInfo, checkpoints_of, times_at
from stenograph.recorder.errors import BadInput, CorruptLog, StenographError
from stenograph.recorder.inputs import input_file
from stenograph.recorder.resumes import view
from stenograph.recorder.snapshots import Manifest, MapBlobs, Tree, load_manifest, restore_tree


@click.group("checkpoint")
def checkpoint() -> None:
    """The workspace snapshots of a recording: list them, restore the files at a turn.

    \b
    Examples:
      stenograph checkpoint ls run.steno
      stenograph checkpoint restore run.steno --at 7 -o at7/
      stenograph checkpoint restore run.steno --at start -o before/
    """


def _turns(events: list[Any]) -> list[tuple[str, int]]:
    """(proc, pos) of every model request, in log order: turn N is the N-th."""
    return [(str(ev.body.get("proc")), int(ev.body.get("pos", -1))) for ev in events
            if ev.kind == "Exchange" and isinstance(ev.body, dict)
            and ev.body.get("channel") == "model"]


def _read(file: str) -> tuple[Any, list[CheckpointInfo]]:
    from stenograph.recorder.trajfile import read_trajectory

    input_file(file)
    tf = read_trajectory(file)
    tf.events = view(tf.events)  # a resumed run: each resume's re-run edge dropped
    cps = checkpoints_of(tf.events)
    if not cps:
        raise BadInput("the recording has no workspace snapshots (recorded with "
                       "--workspace none, or before snapshots existed)", file)
    return tf, cps


@checkpoint.command("ls")
@click.argument("file", type=RECORDING)
@json_stream_options("checkpoint")
def checkpoint_ls(file: str, out: str) -> None:
    """List the checkpoints of a recording: index, turn, log position, files, bytes added.

    --json: `{"checkpoints": [...], "turns": N}`; --jsonl: one checkpoint per line."""
    tf, cps = _read(file)
    turns = len(_turns(tf.events))
    rows = [{"index": c.index, "at": c.at, "turn": c.turn, "lsn": c.lsn,
             "covers_lsn": c.covers_lsn, "files": c.files, "bytes_added": c.bytes_added,
             "snapshot": c.snapshot.sha256} for c in cps]
    if out != "text":
        emit_json(out, "checkpoints", rows, {"turns": turns})
        return
    for c in cps:
        click.echo(f"{c.index:4d}  {c.at:5s}  turn {c.turn:<4d} lsn {c.lsn:<8d} "
                   f"{c.files:7d} files  +{c.bytes_added} bytes")
    click.echo(f"({turns} model turn(s); `checkpoint restore --at N` reaches any of "
               "them, by replay where no checkpoint was taken)", err=True)


def _at(value: str) -> str | int:
    if value in ("start", "end"):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise BadInput(f"--at: {value!r} is not a turn number (1, 2...), start or end")


@checkpoint.command("restore")
@click.argument("file", type=RECORDING)
@click.option("--at", "at_", required=True, metavar="N|start|end",
              help="The files as they were when the program sent its N-th model request "
              "(start: before it ran; end: after its tree exited).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="Directory to create (must not exist, or be empty): one subdirectory "
              "per workspace root when the run had several, else the root's files.")
def checkpoint_restore(file: str, at_: str, output: str) -> None:
    """Restore the workspace of a recording as it was at a turn.

    A turn with a checkpoint is restored from it. Any other turn is reached by a sealed
    replay of the recording stopped at that model request; its files' mtimes are the
    ones the recording noted at that turn (a metadata walk at every turn without a
    checkpoint). Where it noted none, they come from the checkpoints around it where an
    entry is unchanged, and the command names each entry that keeps the replay's."""
    at = _at(at_)
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput("-o: not an empty directory", output)
    tf, cps = _read(file)
    turns = _turns(tf.events)
    if isinstance(at, int) and at > len(turns):
        raise BadInput(f"--at {at}: the run made {len(turns)} model request(s)", file)
    found = next((c for c in cps if (c.at == at) or (c.at == "turn" and c.turn == at)), None)
    tmp: Path | None = None
    try:
        if found is not None:
            blobs: Any = MapBlobs(tf.blobs)
            ref = found.snapshot
            how = f"checkpoint {found.index}"
        elif at == "end":
            raise BadInput("the recording has no end snapshot (the run did not finish)", file)
        else:
            assert isinstance(at, int)
            tmp = Path(tempfile.mkdtemp(prefix="steno-restore-"))
            blobs, ref = _by_replay(file, turns[at - 1], tmp)
            how = f"a sealed replay stopped at model request {at}"
        manifest = load_manifest(blobs, ref)
        if found is None:
            assert isinstance(at, int)
            # (an "effect" checkpoint of turn t was taken after request t was answered)
            before = [c for c in cps if c.at == "start"
                      or (c.at in ("turn", "effect") and c.turn < at)]
            after = [c for c in cps if c.at == "end" or (c.at == "turn" and c.turn > at)
                     or (c.at == "effect" and c.turn >= at)]
            recorded = times_at(tf.events, at, lambda r: load_manifest(MapBlobs(tf.blobs), r))
            if recorded is not None:
                unknown = _exact_times(manifest, recorded)
                how += "; mtimes as recorded at that turn"
            else:
                unknown = _recorded_times(manifest, [
                    load_manifest(MapBlobs(tf.blobs), c.snapshot)
                    for c in before[-1:] + after[:1]])
            if unknown:
                how += (f"; {len(unknown)} entr{'y' if len(unknown) == 1 else 'ies'} with "
                        "the replay's mtime, not the recorded one (changed between the "
                        "checkpoints around it, and no file times were recorded for that "
                        "turn): " + ", ".join(unknown[:10])
                        + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))
        out.mkdir(parents=True, exist_ok=True)
        try:
            if len(manifest.roots) == 1:
                restore_tree(blobs, manifest.trees[manifest.roots[0]], out)
            else:
                for i, root in enumerate(manifest.roots):
                    restore_tree(blobs, manifest.trees[root],
                                 out / f"{i}-{os.path.basename(root)}")
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    click.echo(f"stenograph: restored {manifest.files()} files of {len(manifest.roots)} "
               f"root(s) at {at_} ({how}) -> {out}", err=True)


def _exact_times(at: Manifest, recorded: dict[str, dict[str, int]]) -> list[str]:
    """Give the entries of a replay-made snapshot the mtimes the recording had at that
    turn (``checkpoints.times_at``); returns the paths it has none for."""
    unknown: list[str] = []
    for root, tree in at.trees.items():
        known = recorded.get(root, {})
        for path, e in list(tree.items()):
            mt = known.get(path)
            if mt is None:
                unknown.append(path or ".")
            else:
                tree[path] = dataclasses.replace(e, mtime_ns=mt)
    return unknown


def _recorded_times(at: Manifest, around: list[Manifest]) -> list[str]:
    """Give the entries of a replay-made snapshot their recorded mtimes.

    The replay starts from the start snapshot, so whatever the replayed program wrote
    carries the replay's mtimes (the kernel stamps them). An entry that is the same at
    the checkpoint before this turn, or at the one after (same type and content; for a
    directory, the same names in it), was last changed before the first or not until
    after the second, so its recorded mtime is the one it has there. Returns how many
    entries keep the replay's mtime (changed both after the checkpoint before and
    again before the one after)."""
    unknown: list[str] = []
    for root, tree in at.trees.items():
        names = _children(tree)
        for path, e in list(tree.items()):
            for m in around:
                t = m.trees.get(root, {}).get(path)
                if t is None or t.kind != e.kind:
                    continue
                if ((e.kind == "f" and e.sha256 == t.sha256)
                        or (e.kind == "l" and e.target == t.target)
                        or (e.kind == "d" and names.get(path) == _children(
                            m.trees.get(root, {})).get(path))):
                    tree[path] = dataclasses.replace(e, mtime_ns=t.mtime_ns)
                    break
            else:
                unknown.append(path or ".")
    return unknown


def _children(tree: Tree) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in tree:
        if p:
            parent, _, name = p.rpartition("/")
            out.setdefault(parent, set()).add(name)
    return out


def _by_replay(file: str, point: tuple[str, int], tmp: Path) -> tuple[BlobStore, BlobRef]:
    tape = tmp / "tape"
    p = subprocess.run([sys.executable, "-m", "stenograph", "replay", "--json",
                        "--keep-tape", str(tape), "--stop-at", f"{point[0]}:{point[1]}",
                        os.path.abspath(file)], capture_output=True, text=True)
    made = tape / "stop" / "manifest.json"
    if not made.is_file():
        err = p.stderr.strip().splitlines()
        raise StenographError("the replay did not reach that model request"
                              + (f": {err[-1]}" if err else ""), file)
    try:
        ref = BlobRef.from_body(json.loads(made.read_text()))
    except (ValueError, BadInput) as exc:
        raise CorruptLog(f"the stop snapshot: {exc}", str(made), 0) from None
    return BlobStore(tape / "stop" / "blobs"), ref
