"""``stenograph archive`` and ``stenograph query``: the cold tier (``cold/``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from stenograph.recorder.errors import BadInput

_SPAN = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``7d``, ``12h``, ``90m``, ``30s``, ``2w`` as seconds."""
    m = _SPAN.fullmatch(text.strip())
    if m is None:
        raise BadInput(f"--older-than wants a span like 7d, 12h, 30m or 0s, not {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


@click.command("archive")
@click.argument("store", type=click.Path(path_type=Path), required=False)
@click.option("--db", "db_url", metavar="postgresql://...",
              help="Archive from the fleet's warm tier instead of a store.")
@click.option("--blobs", "blobs_url", metavar="s3://BUCKET/PREFIX",
              help="With --db: where the warm tier's blobs are.")
@click.option("--older-than", "older", default="7d", show_default=True, metavar="SPAN",
              help="Only runs that ended at least this long ago (7d, 12h, 30m, 0s).")
@click.option("--to", "to", required=True, metavar="DIR|s3://BUCKET/PREFIX",
              help="The archive (made if new: an empty or new directory, or a prefix).")
@click.option("--batch", "batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Trajectories per committed batch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def archive(store: Path | None, db_url: str | None, blobs_url: str | None, older: str,
            to: str, batch: int, as_json: bool) -> None:
    """Move finished trajectories to Parquet files (the cold tier), then out of STORE.

    A trajectory is finished when its run ended with no effect in doubt and no approval
    waiting. Its events go to events/tenant=T/date=D/model=M/<batch>.parquet (tenant
    from `record --label tenant=...`, date the run's start, model the first it was
    served), the run's summary to trajectories/<batch>.parquet, the blobs it needs beside
    them, content-addressed. Each batch is read back and checked before it is
    committed, and only then are the live copies removed (the store's segments
    compacted, or the warm tier's rows deleted). Killed anywhere, running it again
    loses nothing and writes nothing twice.

    \b
    Examples:
      stenograph archive runs/ --older-than 7d --to /srv/steno-archive
      stenograph archive --db postgresql://... --blobs s3://fleet/blobs --to s3://cold/steno
      stenograph query /srv/steno-archive "SELECT tenant, count(*) FROM trajectories GROUP BY 1"
      stenograph replay '/srv/steno-archive#run-42'
    """
    from stenograph.cold.archive import StoreSource, WarmSource
    from stenograph.cold.archive import archive as run_archive
    from stenograph.cold.location import open_location

    age = parse_age(older)
    if (store is None) == (db_url is None):
        raise BadInput("archive takes a STORE or --db URL (one of them)")
    if blobs_url and db_url is None:
        raise BadInput("--blobs goes with --db (a store's blobs are in the store)")
    if store is not None:
        from stenograph.recorder.reader import check_store
        from stenograph.runner.hostrecorder import alone

        check_store(store)
        if not to.startswith("s3://") and Path(to).resolve().is_relative_to(store.resolve()):
            raise BadInput("the archive cannot be inside the store", to)
        alone(store, "archive")
        source = StoreSource(store)
    else:
        assert db_url is not None
        if not db_url.startswith(("postgresql://", "postgres://")):
            raise BadInput("--db wants a postgresql:// URL", db_url)
        source = WarmSource(db_url, blobs_url)
    try:
        loc = open_location(to, create=True)

        def progress(done: int, already: int) -> None:
            if not as_json and sys.stderr.isatty():
                click.echo(f"\rarchived {done} trajectories", err=True, nl=False)

        r = run_archive(source, loc, older_than=age, batch_size=batch, progress=progress)
    finally:
        source.close()
    if as_json:
        click.echo(json.dumps(r.to_json(), sort_keys=True))
        return
    if sys.stderr.isatty():
        click.echo("", err=True)
    per = r.parquet_bytes / r.events if r.events else 0.0
    click.echo(f"archived {len(r.archived)} trajectories ({r.events} events, "
               f"{r.parquet_bytes} Parquet bytes, {per:.1f} a event) in "
               f"{len(r.batches)} batch(es) to {loc.url}; removed {r.removed_events} live "
               f"events; {r.already} already archived; {len(r.skipped)} not finished or "
               f"too young ({r.seconds:.2f} s)")
    reasons: dict[str, int] = {}
    for why in r.skipped.values():
        reasons[why] = reasons.get(why, 0) + 1
    for why, n in sorted(reasons.items()):
        click.echo(f"    kept {n}: {why}")


@click.command("query")
@click.argument("where", metavar="ARCHIVE")
@click.argument("sql")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: columns and rows (a row a list).")
def query(where: str, sql: str, as_json: bool) -> None:
    """Run SQL (DuckDB) over an archive: the views `events` and `trajectories`.

    \b
    events: traj, seq, lsn, kind, time, turn, served_model, input_tokens,
            output_tokens, tool_names, target, ok, effect, body, and the
            partitions tenant, date, model
    trajectories: traj, tenant, labels, started, ended, date, model, exit_status,
            turns, events, input_tokens, output_tokens, tools, tool_failures,
            effects, digest, file, batch, source, archived_at
    (docs/archive.md has the schema and examples)

    \b
    Example: every run of the last week where the model called `deploy` and a
    tool failed:
      stenograph query /srv/steno-archive "SELECT traj FROM trajectories
        WHERE started > now() - INTERVAL 7 DAY
          AND list_contains(tools, 'deploy') AND tool_failures > 0"
    """
    from stenograph.cold.location import open_location
    from stenograph.cold.query import jsonable, run_query

    ans = run_query(open_location(where), sql)
    if as_json:
        click.echo(json.dumps({"columns": ans.columns,
                               "rows": [[jsonable(v) for v in r] for r in ans.rows]}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(box=None, pad_edge=False)
    for c in ans.columns:
        t.add_column(c)
    for r in ans.rows:
        t.add_row(*("" if v is None else str(jsonable(v)) for v in r))
    Console(width=200, highlight=False).print(t)
    click.echo(f"({len(ans.rows)} row{'s' * (len(ans.rows) != 1)})", err=True)
