"""``stenograph fork FILE --at N -o NEW``: what would the run have done if turn N went
otherwise?

The fork is a resume of the parent's prefix (``harness/fork.py``) into a store of its
own, sealed like a replay: the recorded workspace is an overlay (nothing reaches the
real files), /tmp is private. The prefix is served from the tape (no model call, no
effect, no tool re-run); from turn N the program is live with the one change: the
reply of turn N (``--reply``) and/or where model calls go from turn N on
(``--model-url``). Live effects go to ``--effects-url`` or are refused; the program sees
the refusal as its HTTP library's connection error. The fork is then exported as a
recording of its own, whose header (and ``RunStarted``) names its parent.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from stenograph.cli.record import (
    _exit_code,
    _Flusher,
    _here,
    _shim_env,
    _stalls,
    replay_env,
    run_ended,
    sweep_dead_sockets,
)
from stenograph.harness import fork as forking
from stenograph.harness.source import open_recording
from stenograph.interpose import resume_plan
from stenograph.recorder import keyshapes
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput, ReplayDiverged
from stenograph.recorder.exchanges import ExchangeServer, prepare_py_tape
from stenograph.recorder.inputs import input_file, output_file
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.secretfiles import recorded_secrets, write_values
from stenograph.recorder.snapshots import MapBlobs, load_manifest, recorded_rules, start_snapshot
from stenograph.recorder.store import Store
from stenograph.recorder.tape import RecordSession, prepare_tape, read_divergences
from stenograph.recorder.trajfile import write_trajectory
from stenograph.runner import buildreplay
from stenograph.runner.launch import Seal, run_under_shim
from stenograph.runner.shim import PROTOCOL, readable
from stenograph.runner.workspace import SecretServed
from stenograph.runner.workspace import prepare as prepare_workspace


def _url(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    u = urlsplit(value)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise BadInput(f"{name}: an http(s) URL, e.g. http://127.0.0.1:8000/v1", value)
    return value


@click.command("fork")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--at", "at", type=click.IntRange(min=1), required=True, metavar="N",
              help="The turn to change: the prefix before its model request is replayed.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The fork's recording (.steno).")
@click.option("--reply", "reply_file", type=click.Path(dir_okay=False), default=None,
              help='The model\'s reply at turn N instead of the recorded one: a turn '
              '{"text": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}, a text, '
              "or a raw reply body of the recorded API.")
@click.option("--model-url", default=None, metavar="URL",
              help="Where the live model calls go from turn N on (its scheme, host, port "
              "and base path replace the recorded ones).")
@click.option("--effects-url", default=None, metavar="URL",
              help="Where the live effects go (a test service); without it they are "
              "refused, never sent to the recorded targets.")
@click.option("--json", "as_json", is_flag=True, help="One JSON summary on stdout.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def fork(file: str, at: int, output: str, reply_file: str | None, model_url: str | None,
         effects_url: str | None, as_json: bool, cmd: tuple[str, ...]) -> None:
    """Fork a recording at turn N: replay the prefix sealed, change one thing, go live.

    The prefix (everything the program did before its N-th model request) is served
    from the tape. At turn N the model's reply is replaced (--reply) or the request goes
    to another endpoint (--model-url), or another build of the harness runs (-- CMD:
    its prefix is build-replayed, so it must make the same model and tool calls up to
    turn N, and its N-th request is sent live); from there the program runs live in the
    sandbox:
    the recorded workspace as an overlay, /tmp private, effects to --effects-url or
    refused. The fork is a new recording; its header points to its parent, and `show`,
    `view` and `log ls` print that pointer.

    \b
    Examples:
      stenograph fork run.steno --at 6 --reply better.json -o what-if.steno
      stenograph fork run.steno --at 6 --model-url http://127.0.0.1:8000/v1 -o m2.steno
      stenograph fork run.steno --at 6 -o new-rule.steno -- python agent.py
      stenograph show what-if.steno
    """
    input_file(file)
    out = output_file(output, inputs=(Path(file),))
    model_url, effects_url = _url(model_url, "--model-url"), _url(effects_url, "--effects-url")
    if reply_file is None and model_url is None and not cmd:
        raise BadInput("say what changes at turn N: --reply FILE, --model-url URL, or the "
                       "harness build (-- CMD)")
    if cmd and reply_file is not None:
        raise BadInput("--reply and -- CMD do not mix: a fork changes one thing (the new "
                       "build's request at turn N is sent live)")
    reply: Any = None
    if reply_file is not None:
        input_file(reply_file, "a reply file")
        try:
            text = Path(reply_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"--reply: cannot read it: {exc}", reply_file) from None
        reply = forking.load_reply(text, reply_file)
    rec = open_recording(file)
    tr = rec.trajectory()
    started = tr.started
    if readable(started.get("shim")) is None:
        raise BadInput(f"recorded with shim protocol {started.get('shim')}; this stenograph "
                       f"speaks {PROTOCOL}", file)
    argv = _here(list(cmd), started.get("cwd")) if cmd else None
    change = " and ".join(x for x in (
        f"reply from {Path(reply_file).name}" if reply_file else "",
        f"model at {model_url}" if model_url else "",
        f"harness {shlex.join(argv)}" if argv else "") if x)
    fp = forking.plan(tr, os.path.abspath(file), at, change)
    extra: list[dict[str, Any]] = []
    if reply is not None:
        extra.append(forking.reply_entry(fp.turn_event, reply, rec.body, file))
    outcome = _run(rec, fp, extra, out, model_url, effects_url, as_json, argv)
    doc = {"fork": str(out), "parent": fp.parent, **outcome}
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True, default=str))
    if "divergences" in outcome:
        for d in outcome["divergences"][:5]:
            what = {k: d[k] for k in ("turn", "channel", "call", "kind", "proc", "thread",
                                      "position", "recorded", "asked") if k in d}
            click.echo(f"stenograph: divergence: {json.dumps(what, default=str)[:400]}",
                       err=True)
        raise ReplayDiverged(f"the prefix before turn {at} did not replay (the recording "
                             "and this machine disagree); no fork was written", file)
    click.echo(f"stenograph: forked {file} at turn {at} ({change}): {out}, "
               f"{outcome['turns']} turn(s), {outcome['live_turns']} of them live; "
               f"exit {outcome['status']}", err=True)
    sys.exit(_exit_code(outcome["status"]))


def _traj_name(turn: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"fork-{stamp}-{os.getpid()}-t{turn}"


def _run(rec: Any, fp: forking.ForkPlan, extra: list[dict[str, Any]], out: Path,
         model_url: str | None, effects_url: str | None, as_json: bool,
         argv: list[str] | None) -> dict[str, Any]:
    """The fork run: the prefix into a private store, the program under the shim (resume
    mode; build mode too for another build), the result exported."""
    started = next(e.body for e in fp.prefix if e.kind == "RunStarted")
    recorded_argv = [str(a) for a in started["argv"]]
    ended = next((e.body for e in rec.events if e.kind == "RunEnded"), {})
    traj = _traj_name(fp.turn)
    sweep_dead_sockets()
    work = Path(tempfile.mkdtemp(prefix="steno-fork-"))
    sock_dir = Path(tempfile.mkdtemp(prefix="steno-rec-"))
    tape, store_dir = work / "tape", work / "store"
    tape.mkdir()
    try:
        with Store(store_dir) as s:
            blobs = BlobStore(store_dir / "blobs")
            for data in rec.blobs.values():
                blobs.put(data)
            for ev in fp.prefix:
                body = ev.body
                if ev.kind == "RunStarted":  # another build: its replays run that command
                    body = {**body, "parent": fp.parent, **(
                        {"argv": argv, "build_of": recorded_argv} if argv else {})}
                s.append(traj, ev.kind, body, durable=False)
            s.flush()
            cut = s.next_seq(traj) - 1
            s.append(traj, "LeaseAcquired", {"epoch": 1, "pid": os.getpid(), "by": "fork",
                                             "host": os.uname().nodename, "resumed_at": cut})
            for entry in extra:
                s.append(traj, "Exchange", entry)
            extra_events = [Event(0, traj, 1 << 60, None, "Exchange", e) for e in extra]
            prepare_tape(fp.prefix, tape, protocol=readable(started.get("shim")))
            prepare_py_tape([*fp.prefix, *extra_events], tape, rec.blobs)
            (tape / "py" / resume_plan.FILE).write_text(json.dumps(
                {"in_doubt": {}, "approvals": {}, "drift": {}}))
            mounts = []
            snap = start_snapshot(fp.prefix)
            if snap is not None:
                mb = MapBlobs(rec.blobs)
                manifest = load_manifest(mb, snap)
                live: list[str] = []
                if argv:  # the build's code is the one on disk now
                    live = [a for a in argv if os.path.exists(a)] + buildreplay.code_paths(
                        {r: manifest.trees.get(r, {}) for r in manifest.roots},
                        recorded_rules(started), buildreplay.CODE_GLOBS)
                served: list[SecretServed] = []
                mounts = prepare_workspace(manifest, mb, recorded_rules(started),
                                           tape / "ws", live=live, secrets=served,
                                           secret_rules=recorded_secrets(
                                               started, keyshapes.for_run(started)))
                write_values({v for n in served for v in n.values}, tape)
            session = RecordSession(s, traj, sock_dir / "tape.sock")
            exchanges = ExchangeServer(s, traj, sock_dir / "py.sock",
                                       before_append=session.drain_all)
            flusher = _Flusher(s)
            rec_env = started.get("env") or {}
            env = replay_env({str(k): str(v) for k, v in rec_env.items()}, dict(os.environ))
            settings = {"STENO_TAPE": str(tape), "STENO_RESUME": "1", "STENO_FORK": "1",
                        "STENO_SOCK": session.sock_path, "STENO_PYSOCK": exchanges.path,
                        "STENO_STORE": str(store_dir), "STENO_TRAJ": traj,
                        "STENO_EPOCH": "1"}
            keyshapes.install(keyshapes.for_run(started), tape)
            if model_url:
                settings["STENO_MODEL_URL"] = model_url
            if effects_url:
                settings["STENO_EFFECTS_URL"] = effects_url
            if argv:
                settings["STENO_BUILD"] = "1"
                if argv != recorded_argv:
                    settings["STENO_EDITED"] = "1"
            elif started.get("asyncio"):
                settings["STENO_ASYNCIO"] = "1"
            cwd = started.get("cwd")
            stage = tape / ".seal"
            stage.mkdir()
            hide = ended.get("tmp_created") or {}
            state = started.get("sealed_state") or {}
            seal = Seal(
                hide={str(k): [str(n) for n in v] for k, v in hide.items()
                      if isinstance(v, list)},
                state={str(k): v for k, v in state.items() if v is None or isinstance(v, dict)},
                keep=[str(work.resolve()), str(sock_dir.resolve())],
                stage=str(stage.resolve()), workspaces=mounts,
                cwd=cwd if isinstance(cwd, str) and mounts else None)
            t0 = time.monotonic()
            try:
                result = run_under_shim(
                    argv or recorded_argv, _shim_env(env, "replay", **settings),
                    cwd=cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None,
                    passthrough=not as_json, seal=seal)
            finally:
                flusher.close()
                exchanges.close()
                stats = session.close()
            outcome: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 3),
                                       "status": result.status, "traj": traj}
            divs = [d.to_json() for d in read_divergences(tape) if d.kind == "divergence"]
            if argv:  # another build: the prefix is judged as a build replay judges it
                divs += buildreplay.read_jsonl(tape / "build-divergence.jsonl")
            if divs:
                outcome["divergences"] = divs
                return outcome
            s.append(traj, "RunEnded", {
                **run_ended(result, stats, exchanges, None, _stalls(sock_dir / "stalls")),
                "tmp_created": ended.get("tmp_created") or {}, "forked": True})
        events = list(StoreReader(store_dir).events(traj=traj))
        write_trajectory(out, traj, events, blobs=BlobStore(store_dir / "blobs"),
                         extra={"parent": fp.parent})
        turns = sum(1 for e in events if e.kind == "Exchange"
                    and e.body.get("channel") == "model")
        outcome.update(turns=turns, live_turns=turns - fp.turn + (0 if extra else 1))
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
