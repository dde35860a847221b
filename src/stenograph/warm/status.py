"""Every host's trajectories as the warm tier holds them: what ``status --db`` prints.

One query over ``steno_trajectories``, ``steno_effects``, ``steno_approvals`` and
``steno_cursors``. A trajectory's state is what its shipped events say: ``ended`` (its
``RunEnded`` arrived), ``needs-attention`` (an effect in doubt or an approval waiting),
else ``running``; ``shipped_ago`` is how long since its store's shipper last moved its
cursor (a host that stopped shipping shows here first); ``epoch`` and ``lease`` are its
row in ``steno_leases`` (run with ``--db``): the epoch, the holder's host, whether it is
live.
"""

from __future__ import annotations

from typing import Any

from stenograph.warm.errors import WarmTierError, first_line, safe_url

QUERY = """
SELECT t.trajectory_id, t.host, t.store_id, t.started_at, t.labels, t.state, t.last_seq,
       t.last_kind, t.updated_at,
       (SELECT count(*) FROM steno_effects e
         WHERE e.trajectory_id = t.trajectory_id) AS effects,
       (SELECT count(*) FROM steno_effects e
         WHERE e.trajectory_id = t.trajectory_id AND e.state = 'in-doubt') AS in_doubt,
       (SELECT count(*) FROM steno_approvals a
         WHERE a.trajectory_id = t.trajectory_id AND a.decision IS NULL) AS waiting,
       extract(epoch FROM now() - c.updated_at) AS shipped_ago,
       {lease}
FROM steno_trajectories t LEFT JOIN steno_cursors c ON c.store_id = t.store_id
{join}
WHERE (%(traj)s::text IS NULL OR t.trajectory_id = %(traj)s)
ORDER BY t.updated_at DESC, t.trajectory_id
"""


def fleet_status(url: str, traj: str | None = None) -> list[dict[str, Any]]:
    """Every trajectory the warm tier at ``url`` holds (or ``traj``), newest first."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass('steno_trajectories'), "
                                  "to_regclass('steno_leases')").fetchone()
            if not exists or exists[0] is None:
                return []
            query = QUERY.format(  # (a warm tier made before leases has no such table)
                lease="l.epoch, l.host, l.expires_at > now()" if exists[1] else
                "NULL, NULL, NULL",
                join="LEFT JOIN steno_leases l ON l.trajectory_id = t.trajectory_id"
                if exists[1] else "")
            rows = conn.execute(query, {"traj": traj}).fetchall()
    except psycopg.Error as exc:
        raise WarmTierError(f"cannot read the warm tier: {first_line(exc)}",
                            safe_url(url)) from None
    out = []
    for (tid, host, store, started, labels, state, last_seq, last_kind, updated, effects,
         in_doubt, waiting, ago, epoch, holder, held) in rows:
        if state != "ended" and (in_doubt or waiting):
            state = "needs-attention"
        out.append({"traj": tid, "host": host, "store": store,
                    "started": started.isoformat(), "labels": labels or {}, "state": state,
                    "last_seq": int(last_seq), "last_kind": last_kind,
                    "updated": updated.isoformat(), "effects": int(effects),
                    "in_doubt": int(in_doubt), "approvals_waiting": int(waiting),
                    "shipped_ago": round(float(ago), 1) if ago is not None else None,
                    "epoch": int(epoch) if epoch is not None else None,
                    "lease": None if holder is None else {"host": holder, "live": bool(held)}})
    return out
