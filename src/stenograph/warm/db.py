"""The one way into the warm tier: a connection, with the schema made if it is missing."""

from __future__ import annotations

from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.warm import schema
from stenograph.warm.errors import WarmTierError, first_line, safe_url


def connect(url: str) -> Any:
    """An autocommit connection to the warm tier, its schema made if missing or older
    (under an advisory lock: two processes starting at once do not race on the DDL). A
    schema already at this version is only read: DDL takes exclusive locks, and run at
    every connect it deadlocked with the workers' own transactions (8 drained at once)."""
    try:
        import psycopg
    except ImportError:
        raise BadInput("the warm tier needs psycopg 3: pip install 'stenograph[fleet]'",
                       url) from None
    try:
        conn = psycopg.connect(url, connect_timeout=10, autocommit=True)
    except psycopg.Error as exc:
        raise WarmTierError(f"cannot reach the warm tier: {first_line(exc)}",
                            safe_url(url)) from None
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('steno_schema')")
        if cur.fetchone()[0] is not None:
            cur.execute("SELECT max(version) FROM steno_schema")
            have = cur.fetchone()[0]
            if have == schema.SCHEMA_VERSION:
                return conn
            if have is not None and have > schema.SCHEMA_VERSION:
                conn.close()
                raise WarmTierError(f"the warm tier's schema is version {have}; this "
                                    f"stenograph knows {schema.SCHEMA_VERSION}", safe_url(url))
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('stenograph schema'))")
        cur.execute(schema.DDL)
        cur.execute("SELECT version FROM steno_schema")
        row = cur.fetchone()
        if row is None:
            cur.execute("INSERT INTO steno_schema VALUES (%s)", (schema.SCHEMA_VERSION,))
        elif row[0] < schema.SCHEMA_VERSION:  # (the DDL above brought it up to date)
            cur.execute("UPDATE steno_schema SET version = %s", (schema.SCHEMA_VERSION,))
    return conn
