"""The ``stenograph`` command.

Every failure the user can cause prints one line,
``stenograph: error: <what> (<where>)``, and exits with its documented code:
0 ok, 1 replay diverged, 2 usage or unreadable input, 3 corrupt log, 4 an in-doubt
action needs a person, 5 paused, 6 stopped, 7 a write the system refused, 8 lease lost
(``recorder/errors.py``). Commands are imported when they run (``LazyGroup``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from stenograph import __version__
from stenograph.cli.options import emit_json, json_stream_options
from stenograph.recorder.codec import Event, Hole
from stenograph.recorder.errors import WRITE_ERRNOS, BadInput, StenographError, WriteFailed
from stenograph.recorder.inputs import input_file, output_file, traj_id
from stenograph.recorder.reader import StoreReader, is_store
from stenograph.recorder.segment import TRAJ_MAGIC, WAL_MAGIC

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


LAZY = {
    "record": "record", "replay": "replay", "bisect": "bisect", "checkpoint": "checkpoint",
    "resume": "resume", "regress": "regress", "status": "status", "settle": "status",
    "approve": "status", "deny": "status", "deliver": "status", "show": "show",
    "view": "view", "diff": "diff", "fork": "fork", "serve": "serve", "ship": "ship",
    "drain": "ship", "archive": "archive", "query": "archive",
}
"""Commands that live in their own modules: ``stenograph.cli.<module>.<command>``."""


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (or help lists it): a
    ``stenograph show`` does not pay for the recorder's and the bisect's imports."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY and name not in self.commands:
            import importlib

            mod = importlib.import_module(f"stenograph.cli.{LAZY[name]}")
            self.add_command(getattr(mod, name.replace("-", "_")), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="stenograph")
def main() -> None:
    """Record an agent run to a durable log; replay it offline, bit for bit.

    \b
    A store is a directory of log segments shared by many trajectories;
    a trajectory file (.steno) is one trajectory exported from a store.
    \b
    Exit codes: 0 ok, 1 replay diverged, 2 usage or unreadable input,
    3 corrupt log, 4 an in-doubt action needs a person, 5 paused for an approval,
    6 stopped by policy or budget, 7 a write the system refused, 8 lease lost.
    record, resume and fork otherwise exit with the program's own status.
    \b
    --json prints one JSON document on stdout; --jsonl (where a command
    lists many things) one JSON object per line.
    \b
    What stenograph writes is its owner's alone (a store 0700, files 0600).
    """
    from stenograph.recorder.hostconfig import keep_private

    keep_private()


@main.group(context_settings=CONTEXT)
def log() -> None:
    """Inspect, check, export and write logs (stores and .steno files).

    \b
    Examples:
      stenograph log append runs/ --traj t1 --kind Note --body '{"hello": "world"}'
      stenograph log ls runs/
      stenograph log cat runs/ --traj t1 --jsonl
      stenograph log export runs/ t1 -o t1.steno
      stenograph log verify t1.steno
    """


# -- helpers --------------------------------------------------------------------------


def _kind_of_path(path: Path) -> str:
    """'store' or 'file', decided by what is on disk, never by the name."""
    if path.is_dir():
        if is_store(path):
            return "store"
        raise BadInput("directory is not a stenograph store", str(path))
    if not path.exists():
        raise BadInput("no such file or directory", str(path))
    input_file(path, "a .steno file or a store")  # a named pipe would block the open
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == TRAJ_MAGIC:
        return "file"
    if magic == WAL_MAGIC:
        raise BadInput("this is one segment of a store; pass the store directory", str(path))
    if not magic:
        raise BadInput("empty file, not a stenograph log", str(path))
    raise BadInput("not a stenograph store or trajectory file (wrong magic)", str(path))


def _line(ev: Event) -> str:
    body = json.dumps(ev.to_json()["body"], ensure_ascii=False, separators=(",", ":"))
    if len(body) > 160:
        body = body[:157] + "..."
    return f"{ev.lsn:>8} {ev.traj} #{ev.seq} {ev.kind} {body}"


def _err_console() -> Any:
    from rich.console import Console  # rich costs 15 ms to import: only when printing

    return Console(stderr=True, highlight=False)


# -- log commands ------------------------------------------------------------------


@log.command("ls")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def log_ls(store: Path, as_json: bool) -> None:
    """List the trajectories of STORE: events, bytes, LSN range, kinds."""
    reader = StoreReader(store)
    summary = reader.summary()
    if as_json:
        click.echo(json.dumps({
            "store": str(store),
            "trajectories": [
                {"traj": s.traj, "events": s.events, "bytes": s.bytes, "first_lsn": s.first_lsn,
                 "last_lsn": s.last_lsn, "kinds": s.kinds, "parent": s.parent}
                for s in summary.values()],
            "torn_tail": None if reader.torn is None else vars_of(reader.torn),
        }))
        return
    from rich.console import Console
    from rich.table import Column, Table

    table = Table(Column("trajectory", overflow="fold"),  # an id wraps, never cut
                  "events", "bytes", "lsn", "kinds", title=str(store))
    forks = any(s.parent for s in summary.values())
    if forks:
        table.add_column("forked from", overflow="fold")
    for s in summary.values():
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(s.kinds.items()))
        row = [s.traj, str(s.events), str(s.bytes), f"{s.first_lsn}-{s.last_lsn}", kinds]
        if forks:
            p = s.parent or {}
            row.append(f"{p.get('traj')} turn {p.get('turn')}" if p else "")
        table.add_row(*row)
    Console(highlight=False).print(table)
    if not summary:
        click.echo("(no trajectories)")
    _report_torn(reader)


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


def _report_torn(reader: StoreReader) -> None:
    if reader.torn is not None:
        t = reader.torn
        _err_console().print(
            f"note: torn tail in {t.segment} at {t.offset}: {t.dropped} bytes ({t.reason}); "
            "the next writer will cut it"
        )


@log.command("cat")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--traj", help="Only this trajectory.")
@click.option("--from-lsn", type=click.IntRange(min=0), default=0, help="Start at this LSN.")
@json_stream_options("event (bytes as {\"$hex\": ...})")
def log_cat(path: Path, traj: str | None, from_lsn: int, out: str) -> None:
    """Print the events of a store or a .steno file, in LSN order.

    --json: `{"events": [...]}`; --jsonl: one event per line, as they are read."""
    from stenograph.recorder.trajfile import read_trajectory

    if _kind_of_path(path) == "store":
        reader = StoreReader(path)
        events = reader.events(traj=traj, from_lsn=from_lsn)
    else:
        reader = None
        tf = read_trajectory(path)
        events = (e for e in tf.events if (traj is None or e.traj == traj) and e.lsn >= from_lsn)
    if out != "text":
        emit_json(out, "events", (ev.to_json() for ev in events))
    else:
        for ev in events:
            click.echo(_line(ev))
    if reader is not None:
        _report_torn(reader)


@log.command("verify")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def log_verify(path: Path, as_json: bool) -> None:
    """Check every frame, checksum, LSN and back-pointer of a store or .steno file.

    Exits 3 on corruption (naming segment and offset). A torn tail at the end of
    a store's last segment is what a crash leaves: it is reported (what the next
    writer will cut) and is not an error. A .steno file must also hold every blob
    its events reference (or list it as external, as --no-blobs exports do); a
    missing one is corruption, named. Nothing is modified.
    """
    from stenograph.recorder.trajfile import read_trajectory

    result: dict[str, Any] = {"path": str(path), "ok": True}
    if _kind_of_path(path) == "store":
        reader = StoreReader(path)
        events = markers = archived = 0
        trajs: set[str] = set()
        for _seg, _off, _size, item in reader.frames():
            if isinstance(item, Event):
                events += 1
                trajs.add(item.traj)
            elif isinstance(item, Hole):
                archived += item.count
            else:
                markers += 1
        result.update(kind="store", segments=len(reader.segments), events=events,
                      batches=markers, trajectories=len(trajs), archived_events=archived,
                      torn_tail=None if reader.torn is None else vars_of(reader.torn))
    else:
        tf = read_trajectory(path)
        result.update(kind="trajectory", traj=tf.traj, events=len(tf.events),
                      blobs=len(tf.blobs),
                      external_blobs=len(tf.header.get("external_blobs", [])),
                      format=tf.header.get("format"),
                      written_by=tf.header.get("stenograph"))
    if as_json:
        click.echo(json.dumps(result))
        return
    if result["kind"] == "store":
        click.echo(f"ok: {result['events']} events in {result['trajectories']} trajectories, "
                   f"{result['segments']} segments, {result['batches']} batches")
        t = result["torn_tail"]
        if t:
            click.echo(f"torn tail: {t['dropped']} bytes at {t['segment']} @ {t['offset']} "
                       f"({t['reason']}); the next writer cuts it")
    else:
        external = (f", {result['external_blobs']} external (not in the file)"
                    if result["external_blobs"] else "")
        click.echo(f"ok: trajectory {result['traj']}: {result['events']} events, "
                   f"{result['blobs']} embedded blobs{external} (format {result['format']}, "
                   f"written by stenograph {result['written_by']})")


@log.command("export")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("traj")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="The .steno file to write (replaced atomically).")
@click.option("--no-blobs", is_flag=True, help="Do not embed referenced blobs.")
def log_export(store: Path, traj: str, output: Path, no_blobs: bool) -> None:
    """Export trajectory TRAJ of STORE into a self-contained .steno file."""
    from stenograph.recorder.trajfile import export_trajectory

    output_file(output, inputs=(store,))
    existed = output.exists()
    try:
        tf = export_trajectory(store, traj, output, embed_blobs=not no_blobs)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(f"{exc.strerror}: nothing was written"
                          + (f", {output} is as it was" if existed else ""),
                          str(exc.filename or output)) from None
    click.echo(f"wrote {output}: {tf.events} events, {tf.blobs} blobs")


@log.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--as", "as_traj", help="Trajectory id in the store (default: the file's).")
def log_import(file: Path, store: Path, as_traj: str | None) -> None:
    """Append the trajectory in FILE to STORE (created if missing)."""
    from stenograph.recorder.store import Store
    from stenograph.recorder.trajfile import import_trajectory, read_trajectory

    input_file(file)
    if as_traj is not None:
        traj_id(as_traj)
    tf = read_trajectory(file)  # check the input fully before touching the store
    name = as_traj or tf.traj
    if is_store(store) and name in StoreReader(store).summary():  # read-only: no LOCK
        raise BadInput(f"the store already has a trajectory {name!r}", str(store))
    from stenograph.runner.hostrecorder import alone

    if is_store(store):
        alone(store, "log import")
    try:
        with Store(store) as st:
            name = import_trajectory(st, file, traj=as_traj)
            n = st.trajectories()[name]
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(f"{exc.strerror}: {_what_stayed(store, name, len(tf.events))}",
                          str(exc.filename or store)) from None
    click.echo(f"imported {name}: {n} events")


@log.command("append")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--traj", required=True, help="Trajectory id.")
@click.option("--kind", required=True, help="Event kind (see docs/log-format.md).")
@click.option("--body", default="{}", help="Event body as a JSON object.")
@click.option("--no-sync", is_flag=True, help="Return before the event is durable.")
def log_append(store: Path, traj: str, kind: str, body: str, no_sync: bool) -> None:
    """Append one event to STORE (created if missing) and print its LSN."""
    from stenograph.recorder.codec import pack_body
    from stenograph.recorder.kinds import check_kind
    from stenograph.recorder.store import check_traj

    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        raise BadInput(f"--body is not JSON: {exc}") from None
    except RecursionError:
        raise BadInput("--body is nested too deep to read") from None
    if not isinstance(parsed, dict):
        raise BadInput("--body must be a JSON object")
    check_kind(kind)
    check_traj(traj)
    pack_body(parsed)  # what the store would refuse, refused before it is opened
    from stenograph.runner.hostrecorder import open_writer

    try:
        with open_writer(store) as st:
            lsn = st.append(traj, kind, parsed, durable=not no_sync)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise WriteFailed(f"{exc.strerror}: the event was not appended; the store is as it was"
                          if is_store(store) else f"{exc.strerror}: no store was made",
                          str(exc.filename or store)) from None
    click.echo(lsn)


def _what_stayed(store: Path, traj: str, events: int) -> str:
    """After a refused import: what the store holds of it (read-only, no lock)."""
    if not is_store(store):
        return "nothing was imported, no store was made"
    try:
        got = StoreReader(store).summary().get(traj)
    except StenographError:
        got = None
    if got is None:
        return "nothing was imported; the store is as it was"
    return (f"{got.events} of the {events} events of {traj!r} are in the store (an I/O "
            "error after they were written); import into a new store to get all of them")


@log.command("scan")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--secret", "secrets_", multiple=True,
              help="A value that must not be in the log (repeatable).")
@click.option("--shapes", is_flag=True,
              help="Also look for any value in the shape of a known key (the rule set "
              "recordings are redacted with, docs/record-your-agent.md), raw or base64/hex "
              "encoded.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: `found`, "
              "`hits`, what was looked for.")
def log_scan(path: Path, secrets_: tuple[str, ...], shapes: bool, as_json: bool) -> None:
    """Find a secret in a store or .steno file: raw, base64 (any alignment), hex or
    URL-encoded, in every event, blob and file byte. Exits 1 if found, 0 if not.

    Events are searched decoded (a compressed payload hides nothing) and every file is
    searched as it is on disk, so a copy outside any event (a torn tail) is found too.
    With --shapes, values nobody named are looked for by their shape (an API key, a
    token, a private key block) as well.
    """
    import msgpack

    from stenograph.interpose.redact import encodings
    from stenograph.recorder.blobs import blob_refs
    from stenograph.recorder.chunks import chunk_data
    from stenograph.recorder.keyshapes import KeyShapes, maintained
    from stenograph.recorder.trajfile import read_trajectory

    if not secrets_ and not shapes:
        raise BadInput("give --secret VALUE (repeatable), --shapes, or both")
    needles = [(s, e) for s in secrets_ for e in encodings(s.encode())]
    finder = KeyShapes(maintained()) if shapes else None
    hits: list[str] = []

    def look(where: str, data: bytes) -> None:
        for secret, enc in needles:
            at = data.find(enc)
            if at >= 0:
                how = "raw" if enc == secret.encode() else f"encoded as {enc.decode()!r}"
                hits.append(f"{where}: {how} at byte {at}")
        for found in finder.found(data) if finder is not None else ():
            shown = found if len(found) <= 12 else f"{found[:8]}...({len(found)} chars)"
            hits.append(f"{where}: a key-shaped value {shown!r}")

    if _kind_of_path(path) == "store":
        reader = StoreReader(path)
        events: Any = reader.events()
        blobs = {p.parent.name + p.name: p.read_bytes()
                 for p in sorted((path / "blobs").glob("*/*")) if p.is_file()}
        files = [p for p in sorted(path.rglob("*")) if p.is_file()]
    else:
        tf = read_trajectory(path)
        events, blobs, files = tf.events, dict(tf.blobs), [path]
    users: dict[str, list[str]] = {}
    for i, ev in enumerate(events):
        look(f"event {i} (lsn {ev.lsn}, {ev.kind})",
             msgpack.packb(ev.body, use_bin_type=True, default=repr))
        if ev.kind == "TapeChunk" and "zdata" in ev.body:  # the records, inflated
            with contextlib.suppress(ValueError):
                look(f"event {i} (lsn {ev.lsn}, TapeChunk records)", chunk_data(ev.body))
        for ref in blob_refs(ev.body):
            users.setdefault(ref.sha256, []).append(f"event {i}")
    for sha, data in blobs.items():
        look(f"blob {sha} (of {', '.join(users.get(sha, [])) or 'no event'})", data)
    for f in files:
        look(f"file {f}", f.read_bytes())
    if as_json:
        click.echo(json.dumps({"found": bool(hits), "hits": hits, "encodings": len(needles),
                               "secrets": len(secrets_),
                               "key_shapes": len(finder.shapes) if finder else 0}))
        sys.exit(1 if hits else 0)
    for line in hits:
        click.echo(line)
    if hits:
        sys.exit(1)
    click.echo(f"not found: {len(needles)} encodings of {len(secrets_)} secret(s)"
               + (f", {len(finder.shapes)} key shapes" if finder is not None else ""))


@main.command("gc")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@click.option("--policy", "policy_file", type=click.Path(path_type=Path), default=None,
              metavar="FILE", help="A retention policy (TOML): snapshots_days, "
              "tool_output_days, offload_to (docs/archive.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def gc_cmd(store: Path, dry_run: bool, policy_file: Path | None, as_json: bool) -> None:
    """Remove the blobs of STORE that no event needs, and stale temporary files.

    A blob is kept if a durable event references it, directly or through a
    Checkpoint's workspace snapshot (its manifest, the delta manifests back to its
    full base, and every file they name). Temporary files in blobs/ (.*.tmp) older
    than an hour are removed too; nothing else is touched.

    \b
    Refused (exit 2) while a writer holds the store: gc never runs beside a live
    recording, and holds the store's lock itself until it is done. A log it cannot
    read, or a snapshot manifest that is missing or damaged, stops it before it
    removes anything (exit 3). A torn tail is not an error: the events before it
    are what is kept. Delta chains need no compaction: they are cut at write time
    (a full manifest after 16 deltas).

    \b
    With --policy FILE (TOML), older blobs go too, never an event:
      snapshots_days = 14     snapshots older than this, except each run's start
                              (what a replay restores), pre-resume and last ones
      tool_output_days = 30   tool output older than this is moved (copied, synced,
      offload_to = "DIR"      then removed here) to DIR; the store still reads it
    """
    from stenograph.recorder.gc import Retention, collect
    from stenograph.runner.hostrecorder import alone

    if is_store(store):
        alone(store, "gc")
    policy = Retention.load(policy_file) if policy_file is not None else None
    r = collect(store, dry_run=dry_run, policy=policy)
    if as_json:
        click.echo(json.dumps(r.to_json()))
        return

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or unit == "GiB":
                return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024  # type: ignore[assignment]
        return ""  # unreachable

    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {r.removed} unreferenced blob{'s' * (r.removed != 1)} "
               f"({size(r.removed_bytes)}) and {r.temp_removed} stale temporary "
               f"file{'s' * (r.temp_removed != 1)} ({size(r.temp_removed_bytes)}); kept "
               f"{r.kept} blob{'s' * (r.kept != 1)} ({size(r.kept_bytes)}) that {r.events} "
               f"events and {r.snapshots} snapshots reference")
    notes = []
    if r.snapshots_dropped:
        notes.append(f"the policy let {r.snapshots_dropped} old snapshot(s) go")
    if r.offloaded:
        notes.append(f"{r.offloaded} blob(s) of old tool output moved to "
                     f"{policy.offload_to if policy else '?'}")
    if r.temp_kept:
        notes.append(f"{r.temp_kept} temporary files less than an hour old were left")
    if r.other_files:
        notes.append(f"{r.other_files} files in blobs/ that are not blobs were left alone")
    if r.missing:
        notes.append(f"{r.missing} blobs that events reference are not in the store")
    if r.torn_tail is not None:
        t = r.torn_tail
        notes.append(f"torn tail in {t.segment} at {t.offset} ({t.dropped} bytes, {t.reason}): "
                     "the events before it were read; the next writer cuts it")
    for n in notes:
        _err_console().print(f"note: {n}")




def fail(message: str, code: int) -> NoReturn:
    click.echo(f"stenograph: error: {message}", err=True)
    sys.exit(code)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; map every expected failure to one line and an exit code."""
    try:
        main.main(args=argv, prog_name="stenograph", standalone_mode=False)
    except StenographError as exc:
        fail(str(exc), exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        return 2
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        fail(f"{exc.format_message()}{hint}", 2)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        fail("aborted", 130)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        fail(f"{exc.strerror} ({exc.filename})", 2)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        fail(f"{exc.strerror} ({exc.filename})", WriteFailed.exit_code)
    return 0


def main_entry() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main_entry()
