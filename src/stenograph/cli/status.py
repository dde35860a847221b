"""``stenograph status``: what a store's trajectories are doing, and their effects.

For each trajectory: its state -- ``running`` (a writer holds the store), ``ended`` (the
run ended and said so), ``crashed`` (no writer, no end), ``needs-attention`` (crashed
with an effect in doubt) -- its model turns, the lease epoch and holder, and every
effect as ``settled`` or ``in-doubt`` (``recorder/effects.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from stenograph.cli.options import (
    emit_json,
    json_stream_options,
    label_filter,
    labels_match,
    parse_labels,
)
from stenograph.recorder.didwhat import described
from stenograph.recorder.errors import BadInput, StenographError
from stenograph.recorder.inputs import traj_id
from stenograph.recorder.resumes import states


@click.command("status")
@click.argument("store", type=click.Path(path_type=Path), required=False)
@click.argument("traj", required=False)
@click.option("--db", "db_url", metavar="URL",
              help="Every host's trajectories, from the warm tier (a postgresql:// URL "
                   "`ship` fills): `status --db URL [TRAJ]`.")
@label_filter
@json_stream_options("trajectory")
def status(store: Path | None, traj: str | None, db_url: str | None, labels: tuple[str, ...],
           out: str) -> None:
    """The state of each trajectory in STORE (or of TRAJ), and of its effects.

    --json prints one document: TRAJ's object (state, turns, epoch, `effects`,
    `approvals`), or for a whole store `{"trajectories": [...]}`; --jsonl one
    trajectory's object per line. With --db URL: every trajectory every host has
    shipped (host, state, last event, effects in doubt, approvals waiting, how long
    since its store last shipped). --label KEY=VALUE keeps the trajectories recorded
    with that label (`record --label`)."""
    want = parse_labels(labels)
    if db_url is not None:
        if traj is not None:
            raise BadInput("status --db takes one TRAJ at most (no STORE)", str(store))
        _fleet(db_url, str(store) if store is not None else None, out, want)
        return
    if store is None:
        raise BadInput("status needs a STORE (or --db URL)", "status")
    if traj is not None:
        traj_id(traj)
    found = [st for st in states(store, traj) if labels_match(st.labels, want)]
    live = _live(store)

    def doc(st: Any) -> dict[str, Any]:
        return {**st.to_json(), **({"live": live[st.traj]} if st.traj in live else {})}

    if out == "json" and traj is not None:
        for st in found:
            click.echo(json.dumps(doc(st), sort_keys=True))
        return
    if out != "text":
        emit_json(out, "trajectories", (doc(st) for st in found))
        return
    for st in found:
        doubt = sum(e.state == "in-doubt" for e in st.effects)
        holder = f" (pid {st.holder})" if st.holder is not None else ""
        now = live.get(st.traj)
        recording = (f"  recording: pid {now['pid']}, lag {now['lag']} event(s)"
                     if now else "")
        tags = "".join(f"  {k}={v}" for k, v in sorted(st.labels.items()))
        click.echo(f"{st.traj}  {st.state}  turns {st.turns}  epoch {st.epoch}{holder}  "
                   f"effects {len(st.effects)} ({doubt} in doubt){recording}{tags}")
        for e in st.effects:
            click.echo(f"    {e.call_id:<16} {e.state:<9} {e.target}"
                       + (f"  key {e.idempotency_key}" if e.idempotency_key else "")
                       + (f"  by {brief_command(e.by)}" if e.by else "")
                       + (f"  ({e.mark})" if e.mark else ""))
            if e.state == "in-doubt" and e.did:
                click.echo(f"    {'':<16} did: {described(e.did)}")
        for a in st.approvals:
            click.echo(f"    {a.call_id:<16} approval {a.state}{' (used)' if a.used else ''}"
                       f"  {a.call}" + (f"  by {a.by}" if a.by else ""))


def _fleet(url: str, traj: str | None, out: str, want: dict[str, str]) -> None:
    """``status --db``: the warm tier's view of every host's trajectories."""
    from stenograph.warm.status import fleet_status

    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput("--db wants a postgresql:// URL", url)
    if traj is not None:
        traj_id(traj)
    rows = [r for r in fleet_status(url, traj) if labels_match(r.get("labels"), want)]
    if out == "json" and traj is not None:
        if rows:
            click.echo(json.dumps(rows[0], sort_keys=True))
        return
    if out != "text":
        emit_json(out, "trajectories", iter(rows))
        return
    if not rows:
        click.echo("no trajectory has been shipped there", err=True)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for col in ("trajectory", "host", "state", "epoch", "last", "effects", "in doubt",
                "approvals", "shipped", "labels"):
        t.add_column(col, justify="right" if col in ("effects", "in doubt", "approvals")
                     else "left")
    for r in rows:
        ago = r["shipped_ago"]
        t.add_row(r["traj"], r["host"], r["state"],
                  "-" if r["epoch"] is None else str(r["epoch"]),
                  f"{r['last_kind']} #{r['last_seq']}",
                  str(r["effects"]), str(r["in_doubt"]), str(r["approvals_waiting"]),
                  "-" if ago is None else f"{ago:.0f} s ago",
                  " ".join(f"{k}={v}" for k, v in sorted((r.get("labels") or {}).items())))
    Console(width=160, highlight=False).print(t)


def _live(store: Path) -> dict[str, dict[str, Any]]:
    """The trajectories the store's host recorder is taking now, by id: the recording's
    pid, its epoch, how many events it sent, and its lag (events sent, not yet durable)."""
    from stenograph.recorder.hostclient import RemoteStore, serving

    if not serving(store):
        return {}
    try:
        with RemoteStore(store) as rs:
            return {str(s["traj"]): {k: s[k] for k in ("pid", "epoch", "appended", "lag",
                                                        "since")}
                    for s in rs.sessions()}
    except (OSError, StenographError):
        return {}


def brief_command(line: str, width: int = 100) -> str:
    """A command line as one short line: ``psql -X -h ... -c INSERT INTO pay...``."""
    return line if len(line) <= width else line[:width - 3] + "..."


def _db_option(f: Any) -> Any:
    return click.option(
        "--db", "db_url", metavar="URL", default=None,
        help="Decide through the warm tier, from any machine: `--db URL TRAJ CALL` (no "
        "STORE). The trajectory's next `resume --db`, on whichever host, writes it into "
        "its log.")(f)


def _where(store: Path | None, traj: str | None, call: str | None,
           db_url: str | None) -> tuple[Path | None, str, str]:
    """STORE TRAJ CALL, or with --db TRAJ CALL (which click read as STORE TRAJ)."""
    if db_url is not None:
        if call is not None or traj is None or store is None:
            raise BadInput("with --db give TRAJ CALL (no STORE)", db_url)
        if not db_url.startswith(("postgresql://", "postgres://")):
            raise BadInput("--db wants a postgresql:// URL", db_url)
        return None, traj_id(str(store)), traj
    if store is None or traj is None or call is None:
        raise BadInput("give STORE TRAJ CALL (or --db URL TRAJ CALL)", "arguments")
    return store, traj_id(traj), call


def _held_call(f: Any) -> Any:
    """[STORE] TRAJ CALL: the call a decision is about (approve, deny, settle); STORE is
    left out with --db."""
    f = _db_option(f)
    for arg in ("call", "traj"):
        f = click.argument(arg, required=False, metavar="")(f)
    return click.argument("store", type=click.Path(path_type=Path), required=False,
                          metavar="[STORE] TRAJ CALL")(f)


@click.command("settle")
@_held_call
@click.option("--as", "as_", type=click.Choice(["done", "not-done"]), required=True,
              help="What a person found: the effect happened (done) or did not.")
@click.option("--result", "result_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="done: a JSON file, the answer the program gets for the "
              "call (an HTTP request's: a 200 with this body, on its own socket too).")
@click.option("--output", "output_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="done, for an effect made by a command the agent ran "
              "(psql, curl, a Go binary...): that command is not started again and the "
              "agent gets this file as its stdout.")
@click.option("--exit", "exit_status", type=click.IntRange(0, 255), default=None,
              help="With --output: the command's exit status (default 0).")
@click.option("--by", default=None, help="Who decided (kept in the log).")
def settle(store: Path | None, traj: str | None, call: str | None, db_url: str | None,
           as_: str, result_file: Path | None, output_file: Path | None,
           exit_status: int | None, by: str | None) -> None:
    """Record a person's decision on an effect in doubt (a `Settled` event).

    \b
    --as not-done        the resumed run makes it again, once
    --as done --result F the call is not made; the program gets F's JSON as its answer
    --as done --output F [--exit N]
                         the command that made it is not run again; the agent gets F
                         as its stdout and N as its status
    --as done            the call is not made and nothing answers it: the program sees
                         it fail as a lost connection (a model may then try again)"""
    from stenograph.recorder.inputs import input_file
    from stenograph.runner.hostrecorder import open_writer

    store, traj, call = _where(store, traj, call, db_url)
    if as_ == "not-done" and (result_file or output_file):
        raise BadInput("--result and --output say what a done call gave; not with "
                       "--as not-done", call)
    if result_file and output_file:
        raise BadInput("--result (the call's answer) or --output (the command's stdout), "
                       "not both", call)
    if exit_status is not None and output_file is None:
        raise BadInput("--exit goes with --output (the command's status)", call)
    result = output = None
    if result_file is not None:
        input_file(str(result_file))
        try:
            result = json.loads(result_file.read_text())
        except ValueError as exc:
            raise BadInput(f"--result is not JSON: {exc}", str(result_file)) from None
    if output_file is not None:
        input_file(str(output_file))
        output = output_file.read_bytes()
    if db_url is not None:
        from stenograph.warm.decisions import settle as settle_in_db

        what = settle_in_db(db_url, traj, call, as_, by, result, output, exit_status)
        click.echo(f"stenograph: {traj} {call} ({what}) settled as {as_}, in the warm tier; "
                   f"`stenograph resume STORE {traj} --db URL` writes it into the log and "
                   "goes on", err=True)
        return
    assert store is not None
    (st,) = states(store, traj)
    eff = next((e for e in st.effects if e.call_id == call), None)
    if eff is None:
        raise BadInput(f"no effect {call!r} in {traj} (see `stenograph status`)", str(store))
    if eff.state != "in-doubt":
        raise BadInput(f"{call} is already {eff.state}", str(store))
    kind = settle_kind(store, traj, call)
    if output is not None and kind != "command":
        raise BadInput(f"{call} was not made by a command the agent ran (it was the agent's "
                       f"own call): give its answer with --result", call)
    if result is not None and "/net/" in call and call.endswith(".0"):
        raise BadInput(f"{call} is a connection ({eff.target}), which has no one answer: "
                       "give the output of the command that made it with --output", call)
    body: dict[str, Any] = {"call_id": call, "as": as_, "result": result, "by": by}
    if output is not None:
        body.update(output=_kept(store, output), exit=exit_status or 0)
    with open_writer(store) as s:
        s.append(traj, "Settled", body)
    told = ("the program gets that answer" if result is not None else
            f"the command is not run again: its stdout is {output_file}, its status "
            f"{exit_status or 0}" if output is not None else
            "the resumed run makes it again, once" if as_ == "not-done" else
            "nothing answers it: the program sees the call fail as a lost connection "
            "(give the answer with --result, or a command's output with --output)"
            if kind in ("request", "command") else "the call is not made again")
    click.echo(f"stenograph: {traj} {call} settled as {as_}: {told}", err=True)


def settle_kind(store: Path, traj: str, call: str) -> str:
    """What a person settles: ``command`` (an effect a command the agent ran made: its
    output can stand in for it), ``request`` (the agent's own HTTP request on its own
    socket: an answer can), ``connection`` (a raw connection the agent itself opened),
    or ``call`` (a hooked call, a tool, an MCP call: ``--result`` is its result)."""
    from stenograph.recorder.reader import StoreReader

    intent: dict[str, Any] = {}
    started: set[str] = set()
    for ev in StoreReader(store).events(traj=traj, lazy_tape=True):
        if ev.kind == "ProcessStarted":
            started.add(str(ev.body.get("proc")))
        elif ev.kind == "ToolIntent" and ev.body.get("call_id") == call:
            intent = ev.body
            break
    channel = intent.get("channel")
    if channel == "exec" or (channel == "net" and intent.get("proc") in started):
        return "command"
    if channel == "net":
        return "connection" if call.endswith(".0") else "request"
    return "call"


def _kept(store: Path, data: bytes) -> Any:
    """Bytes for the log: inline when small, else a blob (its reference)."""
    if len(data) <= 64 << 10:
        return data
    from stenograph.recorder.blobs import BlobStore

    return BlobStore(store / "blobs").put(data).to_body()


@click.command("deliver")
@_held_call
@click.option("--result", "result_file", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="A JSON file: the call's result.")
@click.option("--by", default=None, help="Who or what delivers it (kept in the log).")
def deliver(store: Path | None, traj: str | None, call: str | None, db_url: str | None,
            result_file: Path, by: str | None) -> None:
    """Deliver the late result of an effect of TRAJ whose answer never came back (an
    asynchronous tool: a job finished, a webhook fired). It goes into the log as a
    `ToolResult`; the next `resume` hands it to the program instead of calling again.
    With --db URL (no STORE), from any machine: it waits in the warm tier until `resume
    --db` on the host that runs the trajectory writes it into the log."""
    from stenograph.recorder.inputs import input_file
    from stenograph.runner.hostrecorder import open_writer

    store, traj, call = _where(store, traj, call, db_url)
    input_file(str(result_file))
    try:
        result = json.loads(result_file.read_text())
    except ValueError as exc:
        raise BadInput(f"--result is not JSON: {exc}", str(result_file)) from None
    if db_url is not None:
        from stenograph.warm.decisions import DELIVERED
        from stenograph.warm.decisions import settle as settle_in_db

        what = settle_in_db(db_url, traj, call, DELIVERED, by, result, None, None)
        click.echo(f"stenograph: {traj} {call} ({what}): result delivered to the warm tier; "
                   f"`stenograph resume STORE {traj} --db URL` hands it over", err=True)
        return
    assert store is not None
    (st,) = states(store, traj)
    if st.state == "ended":
        raise BadInput(f"{traj} has ended: a result delivered now would reach no one",
                       str(store))
    eff = next((e for e in st.effects if e.call_id == call), None)
    if eff is None:
        raise BadInput(f"no effect {call!r} in {traj} (see `stenograph status`)", str(store))
    if eff.state != "in-doubt":
        raise BadInput(f"{call} already has its result", str(store))
    with open_writer(store) as s:
        s.append(traj, "ToolResult", {"call_id": call, "result": result, "by": by,
                                      "at": time.time(), "as": "done"})
    click.echo(f"stenograph: {traj} {call}: result delivered; `stenograph resume {store} "
               f"{traj}` hands it over", err=True)


def _decide(store: Path | None, traj: str, call: str, decision: str, by: str,
            note: str | None, db_url: str | None) -> None:
    from stenograph.runner.hostrecorder import open_writer

    if db_url is not None:
        from stenograph.warm.decisions import decide

        what = decide(db_url, traj, call, decision, by, note)
        click.echo(f"stenograph: {traj} {call} ({what}) {decision} by {by}, in the warm "
                   f"tier; `stenograph resume STORE {traj} --db URL` on the host that runs "
                   "it (or any other) continues", err=True)
        return
    assert store is not None
    (st,) = states(store, traj)
    a = next((a for a in st.approvals if a.call_id == call), None)
    if a is None:
        raise BadInput(f"no approval {call!r} asked for in {traj} (see `stenograph "
                       "status`)", str(store))
    if a.state != "pending" or a.used:
        raise BadInput(f"{call} is already {a.state}", str(store))
    with open_writer(store) as s:
        s.append(traj, "ApprovalResolved", {"call_id": call, "decision": decision, "by": by,
                                            "note": note, "at": time.time()})
    click.echo(f"stenograph: {traj} {call} ({a.call}) {decision} by {by}; `stenograph "
               f"resume {store} {traj}` continues", err=True)


@click.command("approve")
@_held_call
@click.option("--by", required=True, help="Who approves (kept in the log).")
@click.option("--note", default=None, help="Why, for the record.")
def approve(store: Path | None, traj: str | None, call: str | None, db_url: str | None,
            by: str, note: str | None) -> None:
    """Approve the held CALL of TRAJ (an `ApprovalResolved` event); resume continues."""
    _decide(*_where(store, traj, call, db_url), "approved", by, note, db_url)


@click.command("deny")
@_held_call
@click.option("--by", required=True, help="Who denies (kept in the log).")
@click.option("--note", default=None, help="Why, for the record (the program sees it).")
def deny(store: Path | None, traj: str | None, call: str | None, db_url: str | None,
         by: str, note: str | None) -> None:
    """Deny the held CALL of TRAJ: on resume the program gets `ApprovalDenied`."""
    _decide(*_where(store, traj, call, db_url), "denied", by, note, db_url)
