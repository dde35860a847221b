"""``stenograph show``: a recording as its turns, or one turn exactly as the model saw it."""

from __future__ import annotations

import json
from typing import Any

import click

from stenograph.cli.options import RECORDING
from stenograph.harness.documents import parent_line, summary_doc, turn_doc
from stenograph.harness.source import Recording, open_input
from stenograph.harness.trajectory import Trajectory, action_line, short
from stenograph.recorder.checkpoints import checkpoints_of


@click.command("show")
@click.argument("file", type=RECORDING)
@click.option("--turn", "turn", type=click.IntRange(min=1), metavar="N",
              help="One turn in full: the request the model received, its reply, the "
              "tool calls and their results, the nearest checkpoint, the tape position.")
@click.option("--traj", help="The trajectory, when FILE is a store holding several.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def show(file: str, turn: int | None, traj: str | None, as_json: bool) -> None:
    """Show a recording as its trajectory: one line per model turn, or one turn in full.

    A turn is one model exchange (OpenAI chat completions or Responses, Anthropic
    messages, stenograph.model), read from the tape: no change to the agent is needed.
    The tool results of a turn are the ones the next request handed back to the model.

    \b
    Examples:
      stenograph show run.steno
      stenograph show run.steno --turn 23
      stenograph show run.steno --turn 23 --json | jq .request.body.messages
    """
    rec = open_input(file, traj)
    tr = rec.trajectory()
    if turn is None:
        _summary(rec, tr, as_json)
        return
    t = tr.turn(turn)
    doc = turn_doc(tr, t, checkpoints_of(rec.events))
    if as_json:
        click.echo(json.dumps(doc, ensure_ascii=False, default=repr))
        return
    _turn_text(doc)


def _summary(rec: Recording, tr: Trajectory, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary_doc(rec, tr), ensure_ascii=False, default=repr))
        return
    r = tr.record
    end = f"exit {r.exit_status}" if r.ended else "not ended"
    click.echo(f"{tr.traj}: {len(tr.turns)} turn(s), {r.input_tokens} input + "
               f"{r.output_tokens} output tokens, {r.calls_made} call(s), {end}")
    if (line := parent_line(rec)) is not None:
        click.echo(line)
    if isinstance(labels := tr.started.get("labels"), dict) and labels:
        click.echo("labels: " + " ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    for c in tr.before:
        click.echo(f"   0  {'':14s} {c.target}  {c.state}")
    for t in tr.turns:
        model = (t.reply.served_model or t.context.model or "?")[:14]
        click.echo(f"{t.index:4d}  {model:14s} in {t.reply.input_tokens:<6d} "
                   f"out {t.reply.output_tokens:<5d} {action_line(t)}")
        for c in t.calls:
            kind = "effect" if c.effect else "call"
            click.echo(f"{'':6s}{kind}: {short(c.target, 70)}  {c.state}")
    if tr.turns and not r.ended:  # the run stopped after its last reply
        last = tr.turns[-1]
        for c in last.reply.tool_calls[len(last.calls):]:
            click.echo(f"{'':6s}proposed: {c.name}  not-sent (the run did not get to it)")


def _turn_text(doc: dict[str, Any]) -> None:
    tape = doc["tape"]
    click.echo(f"turn {doc['turn']} of {doc['turns']}: model {doc['model']['asked']} "
               f"(served {doc['model']['served']}); tape: process {tape['proc']}, model "
               f"position {tape['pos']}, lsn {tape['lsn']}")
    ctx = doc["context"]
    click.echo(f"context {doc['context_hash'][:16]} ({ctx['api']}: {ctx['messages']} "
               f"message(s), {ctx['tools']} tool(s))")
    req = doc["request"]
    click.echo(f"-- request: {req['method']} {req['url']}")
    body = req["body"]
    click.echo(json.dumps(body, indent=2, ensure_ascii=False) if not isinstance(body, str)
               else body)
    r = doc["reply"]
    click.echo(f"-- reply: stop {r['stop_reason']}, {r['usage']['input_tokens']} in / "
               f"{r['usage']['output_tokens']} out" + (" (streamed)" if r["streamed"] else ""))
    if r["error"]:
        click.echo(f"-- the call failed: {r['error']} (the model did not answer this request)")
    if r["text"]:
        click.echo(r["text"])
    for c, res in zip(doc["tool_calls"], doc["tool_results"], strict=False):
        click.echo(f"tool call {c['id']}: {c['name']} "
                   f"{json.dumps(c['arguments'], ensure_ascii=False)}")
        if res["source"] is None:
            click.echo("  result: not in a later request (the run ended, or it was dropped)")
        else:
            click.echo(f"  result{' (error)' if res['is_error'] else ''}: "
                       f"{short(res['content'], 400)}")
    for c in doc["calls"]:
        click.echo(f"-- {'effect' if c['effect'] else 'call'}: {c['target']}  {c['state']}")
    for a in doc["approvals"]:
        click.echo(f"-- approval {a['call_id']}: {a.get('call') or a.get('decision')}")
    cp = doc["checkpoint"]
    if cp is not None:
        click.echo(f"-- nearest checkpoint: #{cp['index']} ({cp['at']}, turn {cp['turn']}); "
                   f"`stenograph checkpoint restore FILE --at {doc['turn']} -o DIR` gives "
                   "the files at this turn")
