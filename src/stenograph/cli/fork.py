"""``stenograph fork FILE --at N -o NEW``: what would the run have done if turn N went
otherwise? (``runner/fork.py``)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from stenograph.cli.options import RECORDING, exit_code
from stenograph.harness import fork as forking
from stenograph.recorder.errors import BadInput, ReplayDiverged
from stenograph.recorder.inputs import input_file, output_file
from stenograph.runner.fork import ForkRequest
from stenograph.runner.fork import fork as fork_run


def _url(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    u = urlsplit(value)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise BadInput(f"{name}: an http(s) URL, e.g. http://127.0.0.1:8000/v1", value)
    return value


@click.command("fork")
@click.argument("file", type=RECORDING)
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
    doc = fork_run(ForkRequest(
        file, at, out, reply=reply, reply_name=Path(reply_file).name if reply_file else None,
        model_url=model_url, effects_url=effects_url, cmd=list(cmd) or None,
        passthrough=not as_json))
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True, default=str))
    if "divergences" in doc:
        for d in doc["divergences"][:5]:
            what = {k: d[k] for k in ("turn", "channel", "call", "kind", "proc", "thread",
                                      "position", "recorded", "asked") if k in d}
            click.echo(f"stenograph: divergence: {json.dumps(what, default=str)[:400]}",
                       err=True)
        raise ReplayDiverged(f"the prefix before turn {at} did not replay (the recording "
                             "and this machine disagree); no fork was written", file)
    click.echo(f"stenograph: forked {file} at turn {at} ({doc['change']}): {out}, "
               f"{doc['turns']} turn(s), {doc['live_turns']} of them live; "
               f"exit {doc['status']}", err=True)
    sys.exit(exit_code(doc["status"]))
