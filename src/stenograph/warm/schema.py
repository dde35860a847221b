"""The warm tier's schema in PostgreSQL: every name and every statement ``ship`` uses.

One file holds it, as ``recorder/kinds.py`` holds the log's kinds: ``docs/fleet.md``
documents these tables, ``tests/test_ship.py`` reads them back.

* ``steno_trajectories``: one row per trajectory, the store that last shipped it, its
  host, labels, state and how far it has been shipped.
* ``steno_events``: every committed event, keyed ``(trajectory_id, seq)``; partitioned by
  the trajectory's start (a month a partition), so retention drops whole months of runs
  and a trajectory never straddles two partitions. The key includes ``started_at``
  (PostgreSQL wants the partition key in every unique key); it is a function of the
  trajectory, so ``(trajectory_id, seq)`` stays unique.
* ``steno_cursors``: per store, the last LSN shipped, written in the same transaction
  as the batch it covers: a shipper killed mid-batch ships that batch again, and the
  conflict rule drops what was already there.
* ``steno_approvals``: requests for a person and their answers, from the events.
* ``steno_settlements``: a person's word on an effect in doubt, given with ``settle
  --db`` from any machine, until the trajectory's worker writes it into its log
  (``warm/decisions.py``); ``approve``/``deny --db`` write ``steno_approvals``.
* ``steno_leases``: who runs each trajectory now (``--db``): its epoch, the worker's pid,
  host and token, the store it writes, and when its lease runs out (the database's
  clock). ``warm/leases.py`` takes and renews it; the shipper ships a trajectory only
  from the store that holds it. ``draining``: ``stenograph drain`` asked its worker to
  stop at its next turn and let the lease go, for ``resume --any`` elsewhere.
* ``steno_effects`` (a view): each effect's intent with what settled it, if anything: its
  own result (``ToolResult``, or the ``Exchange`` of the hooked call that made it) or a
  person's word (``Settled``); ``in-doubt`` otherwise, as ``status`` folds it.
"""

from __future__ import annotations

import datetime as dt

SCHEMA_VERSION = 2
"""1: events, trajectories, cursors, approvals, the effects view; 2: leases (with
``draining``), settlements, an approval's note."""

BODY_INLINE_MAX = 64 << 10
"""A body larger than this (msgpack bytes) is not copied into its row: the row keeps its
hash and size, and the bytes stay in the store (object storage is the next step)."""

DDL = """
CREATE TABLE IF NOT EXISTS steno_schema (
    version int NOT NULL
);
CREATE TABLE IF NOT EXISTS steno_trajectories (
    trajectory_id text PRIMARY KEY,
    store_id text NOT NULL,
    host text NOT NULL,
    started_at timestamptz NOT NULL,
    run_sha256 text NOT NULL,
    labels jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'running',
    last_seq bigint NOT NULL DEFAULT -1,
    last_kind text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS steno_events (
    trajectory_id text NOT NULL,
    seq bigint NOT NULL,
    started_at timestamptz NOT NULL,
    lsn bigint NOT NULL,
    store_id text NOT NULL,
    kind text NOT NULL,
    body jsonb,
    raw bytea,
    raw_sha256 text NOT NULL,
    raw_bytes int NOT NULL,
    shipped_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trajectory_id, seq, started_at)
) PARTITION BY RANGE (started_at);
CREATE INDEX IF NOT EXISTS steno_events_kind ON steno_events (kind, trajectory_id);
CREATE TABLE IF NOT EXISTS steno_cursors (
    store_id text PRIMARY KEY,
    host text NOT NULL,
    path text NOT NULL,
    lsn bigint NOT NULL,
    shipped bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS steno_approvals (
    trajectory_id text NOT NULL,
    call_id text NOT NULL,
    requested_at timestamptz,
    call text,
    summary text,
    decision text,
    decided_by text,
    decided_at timestamptz,
    PRIMARY KEY (trajectory_id, call_id)
);
ALTER TABLE steno_approvals ADD COLUMN IF NOT EXISTS note text;
CREATE TABLE IF NOT EXISTS steno_settlements (
    trajectory_id text NOT NULL,
    call_id text NOT NULL,
    decision text NOT NULL,
    result jsonb,
    output bytea,
    exit_status int,
    decided_by text,
    decided_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trajectory_id, call_id)
);
CREATE TABLE IF NOT EXISTS steno_leases (
    trajectory_id text PRIMARY KEY,
    epoch bigint NOT NULL,
    pid int NOT NULL,
    host text NOT NULL,
    token text NOT NULL,
    store_id text NOT NULL,
    expires_at timestamptz NOT NULL
);
ALTER TABLE steno_leases ADD COLUMN IF NOT EXISTS draining boolean NOT NULL DEFAULT false;
CREATE OR REPLACE VIEW steno_effects AS
SELECT i.trajectory_id, i.body->>'call_id' AS call_id, i.body->>'target' AS target,
       i.body->>'channel' AS channel, i.seq AS intent_seq, r.seq AS result_seq,
       CASE WHEN r.seq IS NULL THEN 'in-doubt' ELSE 'settled' END AS state,
       r.kind AS settled_by, r.body->>'as' AS decision
FROM steno_events i
LEFT JOIN LATERAL (
    SELECT e.seq, e.kind, e.body FROM steno_events e
    WHERE e.trajectory_id = i.trajectory_id AND e.seq > i.seq AND (
        (e.kind IN ('ToolResult', 'Settled') AND e.body->>'call_id' = i.body->>'call_id')
        OR (e.kind = 'Exchange' AND (e.body->>'proc') || '/' || (e.body->>'channel') || '/'
            || (e.body->>'pos') = i.body->>'call_id'))
    ORDER BY e.seq LIMIT 1) r ON true
WHERE i.kind = 'ToolIntent';
"""
"""Created by ``ship`` itself (idempotent); ``steno_schema`` says which version."""

STAGE = """
CREATE TEMP TABLE steno_stage (LIKE steno_events INCLUDING DEFAULTS) ON COMMIT DROP
"""
STAGE_COLUMNS = ("trajectory_id", "seq", "started_at", "lsn", "store_id", "kind", "body",
                 "raw", "raw_sha256", "raw_bytes")
COPY_STAGE = f"COPY steno_stage ({', '.join(STAGE_COLUMNS)}) FROM STDIN"
MOVE_STAGE = """
INSERT INTO steno_events SELECT * FROM steno_stage
ON CONFLICT (trajectory_id, seq, started_at) DO NOTHING
"""
"""The seed's rule: a batch shipped twice (a shipper killed after its COPY, before its
commit) is dropped where it is already there."""


def partition_name(month: dt.date) -> str:
    return f"steno_events_{month.year:04d}{month.month:02d}"


def partition_ddl(month: dt.date) -> str:
    """The partition of ``steno_events`` for the month ``month`` starts."""
    start = month.replace(day=1)
    end = (start + dt.timedelta(days=32)).replace(day=1)
    return (f"CREATE TABLE IF NOT EXISTS {partition_name(start)} PARTITION OF steno_events "
            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")
