"""Options several commands share: the policy and budget a live run is held to (record,
resume), the worker's lease, and the one JSON convention (``--json``: one document;
``--jsonl``: a stream, one object per line)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import click

from stenograph.recorder.errors import BadInput


def json_stream_options(what: str) -> Any:
    """``--json`` (one document) and ``--jsonl`` (one object per line) for a command that
    lists ``what``; the command gets ``out`` = ``"text"``, ``"json"`` or ``"jsonl"``."""
    def deco(fn: Any) -> Any:
        fn = click.option("--jsonl", "out", flag_value="jsonl",
                          help=f"One JSON object per line, one per {what} (a stream).")(fn)
        fn = click.option("--json", "out", flag_value="json",
                          help="Print one JSON document.")(fn)
        return click.option("--text", "out", flag_value="text", default=True,
                            hidden=True)(fn)
    return deco


def emit_json(out: str, key: str, items: Iterable[dict[str, Any]],
              extra: dict[str, Any] | None = None) -> None:
    """Print ``items`` as ``out`` asks: one document ``{key: [...], **extra}`` or one
    line per item."""
    if out == "jsonl":
        for item in items:
            click.echo(json.dumps(item, sort_keys=True, ensure_ascii=False, default=str))
        return
    click.echo(json.dumps({key: list(items), **(extra or {})}, sort_keys=True,
                          ensure_ascii=False, default=str))


def policy_options(fn: Any) -> Any:
    """``--policy``, ``--budget-tokens``, ``--budget-usd``, ``--prices`` (record, resume)."""
    for opt in reversed([
        click.option("--policy", "policy_file", type=click.Path(dir_okay=False),
                     default=None, help="Rules (TOML or JSON) that allow, deny or hold for "
                     "approval each model call and effect by its target (`METHOD URL`, "
                     "`tool NAME`); see docs/crash-and-resume.md."),
        click.option("--budget-tokens", type=click.IntRange(min=1), default=None,
                     metavar="N", help="Stop the run (exit 6) before a model call or effect "
                     "once its model replies used N tokens."),
        click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True),
                     default=None, metavar="X", help="The same in dollars, by --prices."),
        click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
                     default=None, help="JSON {model: [usd per 1M input tokens, output]} "
                     "over the built-in table."),
    ]):
        fn = opt(fn)
    return fn


def lease_option(fn: Any) -> Any:
    """``--lease-ttl``, ``--db``, ``--blobs`` (record, resume): the worker's lease, and
    the fleet it may belong to."""
    for opt in reversed([
        click.option("--lease-ttl", type=click.FloatRange(min=0.1), default=30.0,
                     show_default=True, metavar="SECONDS",
                     help="How long the worker's lease on the store lasts unrenewed: "
                     "after that, a worker that stopped (killed, paused) can be taken "
                     "over by `stenograph resume`."),
        click.option("--db", "db", metavar="postgresql://...", default=None,
                     help="The fleet's warm tier: the trajectory's lease is its row there "
                     "(any host's `resume --db` can take it over once it runs out), and "
                     "the store ships its events there as they commit (docs/fleet.md)."),
        click.option("--blobs", "blobs", metavar="s3://BUCKET/PREFIX", default=None,
                     help="With --db: where blobs and snapshots go (record) and come from "
                     "(resume on another host); AWS_ENDPOINT_URL and the AWS_* keys reach "
                     "any S3-compatible server."),
    ]):
        fn = opt(fn)
    return fn


LABEL_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,62}")


def parse_labels(pairs: tuple[str, ...] | list[str], opt: str = "--label") -> dict[str, str]:
    """``k=v`` pairs as a dict: a key is a name (letters, digits, ``_.-``), a value any
    text of at most 200 characters. One clear line for anything else."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not LABEL_KEY.fullmatch(key):
            raise BadInput(f"{opt} wants KEY=VALUE, KEY a name (letters, digits, _.-): "
                           f"{pair!r}")
        if len(value) > 200 or any(ord(c) < 32 for c in value):
            raise BadInput(f"{opt} {key}: a value is at most 200 printable characters")
        out[key] = value
    return out


def label_filter(fn: Any) -> Any:
    """``--label k=v`` on a listing: only trajectories labelled so (repeatable: all)."""
    return click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
                        help="Only trajectories recorded with this label (repeatable: "
                        "every one must match).")(fn)


def labels_match(labels: Any, want: dict[str, str]) -> bool:
    have = labels if isinstance(labels, dict) else {}
    return all(have.get(k) == v for k, v in want.items())


def exit_code(status: int) -> int:
    """The exit status that passes the program's on: its code, or 128 + its signal."""
    return 128 - status if status < 0 else status


class RecordingArg(click.ParamType):
    """A recording: a ``.steno`` file, a store, or ``ARCHIVE#TRAJ`` (an archived
    trajectory, brought back as a ``.steno`` in the cache: ``cold/restore.py``)."""

    name = "recording"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = str(value)
        if "#" not in text:
            return text
        from stenograph.cold.restore import materialize

        return materialize(text)


RECORDING = RecordingArg()
