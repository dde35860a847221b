"""``stenograph query ARCHIVE "SQL"``: DuckDB over an archive's committed files.

Two views are made before the SQL runs: ``events`` (one row per event, with the
partition columns ``tenant``, ``date`` and ``model`` read from the file paths) and
``trajectories`` (one row per run). Only the files a committed batch names are in
them: a killed archive run's leftovers never show. The connection is DuckDB's own,
in memory; the archive is only read.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from stenograph.cold.batches import committed
from stenograph.cold.location import Location
from stenograph.recorder.errors import BadInput


@dataclass
class Answer:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def connect(loc: Location) -> Any:
    """A DuckDB connection with the archive's two views."""
    try:
        import duckdb
    except ImportError:
        raise BadInput("query needs duckdb: pip install 'stenograph[archive]'") from None
    events: list[str] = []
    runs: list[str] = []
    for doc in committed(loc).values():
        for f in doc["files"]:
            (events if f["key"].startswith("events/") else runs).append(
                str(loc.local_path(f["key"])))
    con = duckdb.connect(":memory:")
    if events:
        con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({_list(events)}, "
                    "hive_partitioning = true, hive_types_autocast = false)")
        con.execute(f"CREATE VIEW trajectories AS SELECT * FROM read_parquet({_list(runs)})")
    else:  # an empty archive still answers, with no rows
        con.execute("CREATE TABLE events (traj VARCHAR, seq BIGINT, kind VARCHAR)")
        con.execute("CREATE TABLE trajectories (traj VARCHAR)")
    return con


def _list(paths: list[str]) -> str:
    """A SQL list of string literals (a view's definition cannot take parameters)."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def run_query(loc: Location, sql: str) -> Answer:
    import duckdb

    con = connect(loc)
    try:
        cur = con.execute(sql)
        rows = cur.fetchall()
        cols = [d[0] for d in cur.description or []]
    except duckdb.Error as exc:
        raise BadInput(f"the query failed: {str(exc).splitlines()[0]}", loc.url) from None
    finally:
        con.close()
    return Answer(cols, rows)


def jsonable(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, bytes):
        return {"bytes": len(v)}
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v
