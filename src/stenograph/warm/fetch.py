"""Bring a trajectory from the warm tier into a store on this host, so it resumes here.

The events come from ``steno_events`` in ``seq`` order, each the exact bytes the host
that recorded it wrote (``raw``; a body too large for its row from the object store, by
its hash), and are checked: ``0..n-1`` with no gap, every body its recorded hash. The
blobs they name, and a checkpoint's snapshot whole, come from the object store
(``--blobs``), each checked against its name. Nothing is written before all of it is
here (``Fetched.write``, by the caller's writer): a fetch that fails leaves the store as
it was.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import Event, unpack
from stenograph.recorder.errors import BadInput
from stenograph.recorder.gc import needed
from stenograph.warm.db import connect
from stenograph.warm.errors import WarmTierError, safe_url
from stenograph.warm.objects import ObjectStore


@dataclass
class Fetched:
    """A trajectory as the warm tier and the bucket hold it, checked, not yet written."""

    events: list[tuple[str, bytes]]
    """(kind, packed body) in ``seq`` order."""
    blobs: dict[str, bytes]
    """What the events need that the store does not have, by hash."""

    def write(self, writer: Any, traj: str, blob_store: BlobStore) -> None:
        """Into a store (``writer``: a ``Store`` or ``RemoteStore``): the blobs first, then
        the events, flushed."""
        if writer.next_seq(traj) > 0:
            raise BadInput(f"this store already has {traj}: resume it here without --db, "
                           "or give another store", str(blob_store.root.parent))
        for data in self.blobs.values():
            blob_store.put(data)
        for kind, data in self.events:
            writer.append_packed(traj, kind, data, durable=False)
        writer.flush()


class _Blobs:
    """Blobs read as ``gc.needed`` reads a store's: from memory, else fetched."""

    def __init__(self, local: BlobStore, objects: ObjectStore | None, where: str) -> None:
        self.local, self.objects, self.where = local, objects, where
        self.got: dict[str, bytes] = {}

    def get(self, sha: Any) -> bytes:
        sha = getattr(sha, "sha256", sha)
        if sha in self.got:
            return self.got[sha]
        if self.local.has(sha):
            return self.local.get(sha)
        if self.objects is None:
            raise BadInput(f"the trajectory needs blob {sha[:16]}..., which this store does "
                           "not have: give --blobs s3://BUCKET/PREFIX, where its host "
                           "shipped them", self.where)
        self.got[sha] = self.objects.get(sha)
        return self.got[sha]


def fetch_trajectory(url: str, traj: str, local: BlobStore,
                     objects: ObjectStore | None = None) -> Fetched:
    """``traj`` from the warm tier at ``url``, with what it needs that ``local`` lacks."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT seq, kind, raw, raw_sha256 FROM steno_events "
                        "WHERE trajectory_id = %s ORDER BY seq", (traj,))
            rows = cur.fetchall()
    finally:
        conn.close()
    if not rows:
        raise BadInput(f"the warm tier has no trajectory {traj!r} (see `stenograph status "
                       "--db`)", safe_url(url))
    blobs = _Blobs(local, objects, str(local.root.parent))
    events: list[tuple[str, bytes]] = []
    walked: set[str] = set()
    for i, (seq, kind, raw, sha) in enumerate(rows):
        if seq != i:
            raise WarmTierError(f"{traj} in the warm tier has a gap: event {i} is missing "
                                "(its host has not shipped it yet?)", safe_url(url))
        data = bytes(raw) if raw is not None else blobs.get(sha)
        if hashlib.sha256(data).hexdigest() != sha:
            raise WarmTierError(f"{traj} event {seq} in the warm tier is not what its hash "
                                "says", safe_url(url))
        ev = Event(lsn=0, traj=traj, seq=seq, prev=None, kind=kind, body=unpack(data))
        for need in sorted(needed(blobs, ev, walked)):  # type: ignore[arg-type]
            blobs.get(need)
        events.append((kind, data))
    return Fetched(events, blobs.got)
