"""Replay a recording: re-run its command (or another one) with the shim serving every
recorded value, sealed, and judge it.

A replay reports either the divergences the shim and the hooks found, or whether stdout,
stderr and the exit status were bit-identical. A build replay (``build``) judges another
build of the program the way ``runner/buildreplay.py`` says: model and tool calls,
effects and the exit status strict, the incidental channels served while they fit.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stenograph.recorder.codec import Event
from stenograph.recorder.errors import WRITE_ERRNOS, BadInput, CorruptLog, WriteFailed
from stenograph.recorder.resumes import view
from stenograph.recorder.tape import describe, python_stacks, read_divergences, stream_records
from stenograph.runner import buildcode, buildreplay, prepare
from stenograph.runner.buildcode import CodeMap
from stenograph.runner.launch import RunResult, run_under_shim
from stenograph.runner.seal import seal_kind
from stenograph.runner.settings import Settings, TapeFiles
from stenograph.runner.shim import PROTOCOL


@dataclass
class ReplayRequest:
    """What ``stenograph replay`` was asked."""

    file: str
    cmd: list[str] = field(default_factory=list)
    """Another command to run (empty: the recorded one)."""
    lenient: bool = False
    passthrough: bool = True
    """The program's output goes to ours (not with ``--json``)."""
    allow_network: bool = False
    unsealed: bool = False
    keep_tape: Path | None = None
    keep_writes: Path | None = None
    live: list[str] = field(default_factory=list)
    build: bool = False
    compare_output: bool = False
    code_globs: tuple[str, ...] = ()
    maps: list[CodeMap] = field(default_factory=list)
    """Recorded directories that show a directory here's code (``buildcode``)."""
    env: dict[str, str] = field(default_factory=dict)
    stop_at: str | None = None


def check_request(req: ReplayRequest) -> None:
    """Refuse bad combinations before anything is read or made."""
    if req.build and req.lenient:
        raise BadInput("--lenient and --build do not mix (build replay serves live values "
                       "wherever the tape does not fit)")
    if not req.build and (req.compare_output or req.code_globs or req.env or req.maps):
        raise BadInput("--compare-output, --code, --map and --env need --build")
    if req.maps and req.unsealed:
        raise BadInput("--map needs a sealed replay (drop --unsealed)")
    for name in req.env:
        if name.startswith("STENO_"):
            raise BadInput("--env wants NAME=VALUE (not a STENO_ variable)", name)
    if req.keep_tape is not None:
        kt = req.keep_tape
        if kt.exists() and (not kt.is_dir() or any(kt.iterdir())):
            raise BadInput("--keep-tape: not an empty directory (the tape is moved into "
                           "it after the run, and nothing of yours may be mixed in)",
                           str(kt))
    if req.keep_writes is not None:
        if req.unsealed:
            raise BadInput("--keep-writes needs a sealed replay (drop --unsealed)")
        kw = req.keep_writes
        if kw.exists() and (not kw.is_dir() or any(kw.iterdir())):
            raise BadInput("--keep-writes: not an empty directory", str(kw))


def load(path: str) -> tuple[dict[str, Any], dict[str, Any], list[Event], dict[str, bytes]]:
    """A complete recorded run: RunStarted's and RunEnded's bodies, the events (a resumed
    run's as one run) and the blobs."""
    from stenograph.recorder.trajfile import read_trajectory

    tf = read_trajectory(path, lazy_tape=True)  # a run of any length: its tape stays on disk
    tf.events = view(tf.events)  # a resumed run: each resume's re-run edge dropped
    started = next((e.body for e in tf.events if e.kind == "RunStarted"), None)
    ended = next((e.body for e in tf.events if e.kind == "RunEnded"), None)
    if started is None:
        raise BadInput("not a recorded run (no RunStarted event)", path)
    if ended is None:
        raise CorruptLog("recorded run has no RunEnded event (recorder killed?)", path, 0)
    if not isinstance(started.get("argv"), list) or not started["argv"]:
        raise CorruptLog("RunStarted has no argv", path, 0)
    return started, ended, tf.events, tf.blobs


def replay(req: ReplayRequest) -> dict[str, Any]:
    """Run the replay; its report (``divergences``, ``drift``, ``identical``...; a build
    replay's as ``buildreplay.report`` makes it)."""
    check_request(req)
    file = req.file
    started, ended, events, blobs = load(file)
    if started.get("build_of") and not req.build:
        raise BadInput("a fork of another build (its prefix was recorded by the parent's "
                       "build): replay it with --build", file)
    protocol = prepare.protocol(started, file, build=req.build)
    recorded_argv = [str(a) for a in started["argv"]]
    maps = code_maps(req, started, recorded_argv)
    pointed: dict[str, str] = {}
    if maps:  # the command's files from the build under test, its data the recording's
        pp = (started.get("env") or {}).get("PYTHONPATH")
        argv, pointed = buildcode.point(list(req.cmd) or recorded_argv, started.get("cwd"),
                                        maps, pp if isinstance(pp, str) else None)
    else:
        argv = prepare.here(list(req.cmd), started.get("cwd")) or recorded_argv
    tape = Path(tempfile.mkdtemp(prefix="steno-tape-"))  # (--keep-tape's: after the run)
    try:
        killed = prepare.killed_by(ended)
        prepare.fill_tape(tape, started, events, blobs, protocol=protocol, killed=killed)
        env = prepare.environ(started, file, {**pointed, **req.env})
        settings = Settings(
            "replay", tape=tape,
            build=req.build,  # and no loop tape: another build's ticks differ
            asyncio=bool(started.get("asyncio")) and not req.build,
            edited=argv != recorded_argv,  # another command: its own paths are not divergences
            lenient=req.lenient, stop_at=req.stop_at, nonet=not req.allow_network)
        if req.stop_at:
            (tape / "stop").mkdir(exist_ok=True)
            (tape / "stop" / "spec.json").write_text(json.dumps(started.get("workspace")))
        ws = prepare.Workspace()
        if not req.unsealed:
            ws = prepare.restore_workspace(
                tape, started, events, blobs,
                live=[*req.live, *([a for a in argv if Path(a).exists()] if req.cmd else [])],
                code_globs=req.code_globs if req.build else None, maps=maps)
        cwd = started.get("cwd")
        sealed_cwd = cwd if isinstance(cwd, str) and ws.mounts else None
        if not isinstance(cwd, str) or not Path(cwd).is_dir():
            cwd = None
        if req.keep_writes is not None:
            req.keep_writes.mkdir(parents=True, exist_ok=True)
        cut = (ended.get("stdout_bytes"), ended.get("stderr_bytes"))
        result = run_under_shim(
            argv, settings.environ(env), cwd=cwd, passthrough=req.passthrough,
            seal=None if req.unsealed else prepare.seal(
                started, tape, hide=ended.get("tmp_created"), keep=[tape],
                workspaces=ws.mounts, cwd=sealed_cwd, keep_writes=req.keep_writes,
                blobs=blobs),
            cut=cut if killed and all(isinstance(n, int) for n in cut) else None,
            stop_on=None if req.lenient else tape / "divergence")
        if req.build:
            report = buildreplay.report(file, tape, events, ended, result, argv,
                                        req.compare_output)
            report["code"] = ([m.to_json() for m in maps] if maps else
                              "as recorded" if tuple(req.code_globs) == ("none",) and
                              not req.cmd else "live at the recorded paths")
            if protocol is None:
                report["notes"] = [f"recorded with shim protocol "
                                   f"{prepare.recorded_protocol(started)}: its C tape is "
                                   "not served (every clock, entropy and listing read ran "
                                   "live)"]
        else:
            report = judge(file, tape, ended, result, argv)
        if protocol is not None and protocol != PROTOCOL:
            report.setdefault("notes", []).append(
                f"recorded with shim protocol {prepare.recorded_protocol(started)}, read as "
                f"protocol {PROTOCOL} (the records it no longer serves left out)")
        if ws.secret_files:
            report["secret_files"] = [n.to_json() for n in ws.secret_files]
        report["sealed"] = "no" if req.unsealed else seal_kind()
        refused = TapeFiles(tape).refused_lines()
        if refused:
            report["refused"] = refused
        if req.build:  # a connection the recording never made: the build did something new
            report["divergences"] += [
                {"kind": "unrecorded", "channel": "net", "call": line, "turn": None,
                 "nearest": None, "diff": []} for line in refused]
        if req.allow_network:
            report["network"] = "allowed"
        if req.keep_tape is not None:
            keep_tape(tape, req.keep_tape)
        return report
    finally:  # (the values the hooks learnt go with the tape)
        shutil.rmtree(tape, ignore_errors=True)
        if req.keep_writes is not None:  # overlayfs's work directories: nothing to keep
            for w in req.keep_writes.glob(".work-*"):
                shutil.rmtree(w, ignore_errors=True)


def keep_tape(tape: Path, dest: Path) -> None:
    """``--keep-tape``: the tape of a replay that ran, moved to ``dest`` (absent or empty)
    once the run is over. It is prepared elsewhere, in a directory of its own: a
    workspace's overlay cannot have its lower layers (``tape/ws``) inside itself, and
    ``dest`` may be in the workspace. Nothing is left in ``dest`` if the move fails."""
    dest = dest.resolve()
    made = not dest.exists()
    names = os.listdir(tape)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tape, dest)  # (onto an empty directory too)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        shutil.copytree(tape, dest, symlinks=True, dirs_exist_ok=True,
                        copy_function=_copy_entry)
    except BaseException as exc:
        if made:
            shutil.rmtree(dest, ignore_errors=True)
        else:  # what was copied of the tape, and nothing else
            for name in names:
                p = dest / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        if isinstance(exc, shutil.Error):  # (copytree's: every file that failed)
            why = exc.args[0][0][2] if exc.args and isinstance(exc.args[0], list) else exc
            raise WriteFailed(f"--keep-tape: the tape could not be copied there ({why}); "
                              "nothing of it was left", str(dest)) from None
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
            raise WriteFailed(f"--keep-tape: the tape could not be copied there "
                              f"({exc.strerror}); nothing of it was left", str(dest)) from None
        raise


def _copy_entry(src: str, dst: str) -> None:
    """A file of the tape copied, or a special one (an overlay whiteout) made again
    where this user may."""
    st = os.lstat(src)
    if stat.S_ISREG(st.st_mode):
        shutil.copy2(src, dst)
    else:
        with contextlib.suppress(OSError):
            os.mknod(dst, st.st_mode, st.st_rdev)


def code_maps(req: ReplayRequest, started: Mapping[str, Any],
              recorded_argv: list[str]) -> list[CodeMap]:
    """The code maps of a build replay: the ones asked for, else the default rule's
    (``buildcode.default_map``); none for a plain replay."""
    if not req.build or req.unsealed:
        return list(req.maps)
    if req.maps:
        return list(req.maps)
    m = buildcode.default_map(req.cmd or recorded_argv, started.get("cwd"), os.getcwd())
    return [m] if m is not None else []


def judge(file: str, tape: Path, ended: dict[str, Any], result: RunResult,
          argv: list[str]) -> dict[str, Any]:
    """A replay's report: the divergences (with the records before each, or the hook's
    diff, and the Python stack that asked), the drift, and whether the output and the exit
    status were identical -- up to the kill, for a run that was killed."""
    found = read_divergences(tape)
    divs, drift = [], []
    stacks = python_stacks(tape)
    for d in found:
        entry = d.to_json()
        if d.kind == "divergence" and d.proc in stacks:
            entry["python_stack"] = stacks.pop(d.proc)
        if d.kind == "divergence" and d.detail:
            divs.append(entry)  # a Python hook's call: its report carries the diff
        elif d.kind == "divergence":
            before = stream_records(tape, d.proc, d.thread, d.channel)[max(0, d.pos - 5):d.pos]
            entry["before"] = [describe(ch, op, p) for ch, op, p in before]
            divs.append(entry)
        else:
            drift.append(entry)
    same = {
        "stdout": result.stdout_sha256 == ended.get("stdout_sha256"),
        "stderr": result.stderr_sha256 == ended.get("stderr_sha256"),
        "exit_status": result.status == ended.get("status"),
    }
    report: dict[str, Any] = {
        "file": file,
        "argv": argv,
        "divergences": divs,
        "drift": drift,
        "exit_status": {"recorded": ended.get("status"), "replayed": result.status},
        "identical": same,
    }
    sizes = {name: {"recorded": ended.get(f"{name}_bytes"), "replayed": n}
             for name, n in (("stdout", result.stdout_bytes), ("stderr", result.stderr_bytes))
             if not same[name]}
    if sizes:  # what differs, where the bytes themselves are only hashed
        report["sizes"] = sizes
    killed = prepare.killed_by(ended)
    if killed is not None:
        # A kill lands between two taped calls; the replay ends at the next one, so it
        # may print what the recorded run was killed before printing. What the recorded
        # run printed must come out first, byte for byte.
        past = {}
        for name, prefix, n in (("stdout", result.stdout_prefix_sha256, result.stdout_bytes),
                                ("stderr", result.stderr_prefix_sha256, result.stderr_bytes)):
            recorded_n = ended.get(f"{name}_bytes")
            if not same[name] and prefix is not None and prefix == ended.get(f"{name}_sha256"):
                same[name] = True
                past[name] = n - int(recorded_n or 0)
        report["killed"] = {"signal": killed, "after_kill_bytes": past}
    return report
