"""``stenograph ship``: copy a store's committed events into the warm tier
(``warm/ship.py``)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import click


@click.command("ship")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--to", "url", metavar="URL", envvar="STENO_DB",
              help="The warm tier: a postgresql:// URL (default: $STENO_DB).")
@click.option("--once", is_flag=True,
              help="Ship what is committed now, then exit (default: keep following).")
@click.option("--every", type=click.FloatRange(0.05), default=0.5, show_default=True,
              metavar="SECONDS", help="How often a following shipper looks for more.")
@click.option("--batch", type=click.IntRange(1, 100_000), default=2000, show_default=True,
              help="Events per transaction.")
@click.option("--blobs", "blobs_url", metavar="s3://BUCKET/PREFIX", envvar="STENO_BLOBS",
              help="Also copy every blob the events need (workspace snapshots whole) and "
                   "each body over 64 KiB to this S3-compatible bucket, content-addressed "
                   "(AWS_ENDPOINT_URL and the AWS_* keys say where and who).")
@click.option("--json", "as_json", is_flag=True,
              help="With --once: one JSON document (events, cursor, committed, lag).")
def ship(store: Path, url: str | None, once: bool, every: float, batch: int,
         blobs_url: str | None, as_json: bool) -> None:
    """Copy STORE's committed events into PostgreSQL, where every host's runs meet.

    Only what the store has committed leaves it. Each batch is one transaction: COPY into
    a staging table, INSERT ... ON CONFLICT (trajectory_id, seq) DO NOTHING, and the
    store's cursor (the last LSN shipped, kept in PostgreSQL). A shipper killed anywhere
    ships its last batch again and nothing twice. The tables (steno_trajectories,
    steno_events partitioned by month, steno_cursors, steno_approvals, the steno_effects
    view) are made on first use; docs/fleet.md describes them.

    \b
      stenograph ship runs/ --to postgresql://steno@db.internal/steno
      stenograph ship runs/ --once --json       # with STENO_DB set
      stenograph ship runs/ --blobs s3://steno-fleet/runs   # snapshots too
    """
    from stenograph.recorder.errors import BadInput
    from stenograph.recorder.reader import check_store
    from stenograph.warm.ship import Shipped, Shipper

    if not url:
        raise BadInput("no warm tier: give --to postgresql://... (or set STENO_DB)", "ship")
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput("--to wants a postgresql:// URL", url)
    if as_json and not once:
        raise BadInput("--json goes with --once (a following shipper prints a line per "
                       "pass)", "ship")
    check_store(store)
    from stenograph.warm.objects import ObjectStore

    objects = ObjectStore(blobs_url) if blobs_url else None

    def say(s: Shipped) -> None:
        if not as_json:
            click.echo(f"stenograph: shipped {s.events} event(s) of "
                       f"{len(s.trajectories)} trajector(y/ies) up to lsn {s.cursor}; "
                       f"lag {s.lag}", err=True)

    with Shipper(store, url, batch=batch, objects=objects) as shipper:
        if once:
            got = shipper.ship()
            if as_json:
                click.echo(json.dumps({"store": str(store), **got.to_json()}))
            else:
                say(got)
            return
        done = threading.Event()

        def stop(*_: Any) -> None:
            done.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        click.echo(f"stenograph: shipping {store} (every {every} s; Ctrl-C stops)", err=True)
        total = shipper.follow(every=every, stop=done.is_set,
                               progress=lambda s: say(s) if s.events else None)
        click.echo(f"stenograph: stopped: {total.events} event(s) shipped, cursor at lsn "
                   f"{total.cursor}, lag {total.lag}", err=True)


@click.command("drain")
@click.option("--db", "url", metavar="URL", envvar="STENO_DB", required=True,
              help="The warm tier the workers hold their leases in (default: $STENO_DB).")
@click.option("--host", required=True, help="The host whose workers leave (its hostname, "
              "as `status --db` shows it).")
@click.option("--wait", type=click.FloatRange(0), default=300.0, show_default=True,
              metavar="SECONDS", help="How long to wait for every worker to let go (0: ask "
              "and return).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: asked, released, "
              "still held.")
def drain(url: str, host: str, wait: float, as_json: bool) -> None:
    """Hand HOST's runs over: each worker there (record/resume --db) stops at its next
    model turn -- the answer durable, the program not yet told -- ships, lets its lease
    go and exits 0. `stenograph resume STORE --any --db URL` on another host then takes
    every released trajectory, one worker each, and goes on from that turn.

    Exits 0 once every worker asked has let go; 1 if some still hold their lease when
    --wait runs out (a run that makes no model call never reaches a turn)."""
    import time

    from stenograph.recorder.errors import BadInput
    from stenograph.warm.leases import drain as ask
    from stenograph.warm.leases import still_held

    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput("--db wants a postgresql:// URL", url)
    asked = ask(url, host)
    held = list(asked)
    until = time.monotonic() + wait
    while held and wait and time.monotonic() < until:
        time.sleep(0.2)
        held = still_held(url, asked)
    doc = {"host": host, "asked": asked, "released": sorted(set(asked) - set(held)),
           "held": held}
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        click.echo(f"stenograph: {host}: {len(asked)} worker(s) asked, "
                   f"{len(doc['released'])} let go" + (
                       f", {len(held)} still running ({', '.join(held[:5])})" if held else ""),
                   err=True)
    if held and wait:
        raise SystemExit(1)
