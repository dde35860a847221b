"""An archive's commits: ``batches/<batch>.json``, one per batch ``archive`` wrote.

A batch's manifest is written last, once its files are read back and checked; it names
every file of the batch and every trajectory in it (its file, event count and digest).
What no committed manifest names does not exist for ``query`` or ``restore``.
"""

from __future__ import annotations

import json
from typing import Any

from stenograph.cold.location import Location


def committed(loc: Location) -> dict[str, dict[str, Any]]:
    """Every committed batch's manifest, by batch id."""
    out = {}
    for key in loc.keys("batches/"):
        if key.endswith(".json"):
            doc = json.loads(loc.get(key))
            out[str(doc["batch"])] = doc
    return out


def archived_trajectories(loc: Location) -> dict[str, dict[str, Any]]:
    """traj -> {batch, file, events, digest} over every committed batch (a later batch
    wins: the same trajectory archived again after it was resumed)."""
    out: dict[str, dict[str, Any]] = {}
    for bid, doc in sorted(committed(loc).items(), key=lambda kv: kv[1]["created"]):
        for traj, info in doc["trajectories"].items():
            out[traj] = {**info, "batch": bid}
    return out
