"""The one way into the warm tier: a connection, with the schema made if it is missing."""

from __future__ import annotations

from typing import Any

from stenograph.recorder.errors import BadInput
from stenograph.warm import schema
from stenograph.warm.errors import WarmTierError, first_line, safe_url


def connect(url: str) -> Any:
    """An autocommit connection to the warm tier, its schema made if missing (under an
    advisory lock: two processes starting at once do not race on the DDL)."""
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
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('stenograph schema'))")
        cur.execute(schema.DDL)
        cur.execute("SELECT version FROM steno_schema")
        row = cur.fetchone()
        if row is None:
            cur.execute("INSERT INTO steno_schema VALUES (%s)", (schema.SCHEMA_VERSION,))
        elif row[0] > schema.SCHEMA_VERSION:
            conn.close()
            raise WarmTierError(f"the warm tier's schema is version {row[0]}; this "
                                f"stenograph knows {schema.SCHEMA_VERSION}", safe_url(url))
    return conn
