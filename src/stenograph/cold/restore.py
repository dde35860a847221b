"""An archived trajectory as a ``.steno`` file again: ``ARCHIVE#TRAJ`` wherever a
recording is taken (``replay``, ``replay --build``, ``regress``, ``show``, ``view``,
``diff``, ``checkpoint``, ``fork``).

The events come back from their Parquet file with the bodies the log packed, in seq
order, each with its LSN and ``prev`` as the store had them; the blobs they need from
the archive's blob store. The file is written once into the cache
(``~/.cache/stenograph/archive/<archive id>/<traj>.steno``) and reused: an archived
trajectory never changes.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from stenograph.cold.batches import archived_trajectories
from stenograph.cold.location import Location, cache_root, open_location
from stenograph.cold.rows import events_of_table
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.errors import BadInput


def split_ref(arg: str) -> tuple[str, str] | None:
    """``ARCHIVE#TRAJ`` as (archive, traj), or None for anything else (a file name may
    hold a ``#``: it is an archive reference only when the left side is one)."""
    where, sep, traj = arg.rpartition("#")
    if not sep or not where or not traj:
        return None
    if where.startswith("s3://") or (Path(where) / "STENOGRAPH-ARCHIVE").is_file():
        return where, traj
    return None


def restore(loc: Location, traj: str, out: Path) -> Path:
    """Write ``traj`` from ``loc`` to ``out`` (a ``.steno``)."""
    import pyarrow.parquet as pq

    from stenograph.recorder.gc import needed
    from stenograph.recorder.trajfile import write_trajectory

    info = archived_trajectories(loc).get(traj)
    if info is None:
        raise BadInput(f"the archive holds no trajectory {traj!r} (`stenograph query "
                       f"{loc.url} \"SELECT traj FROM trajectories\"` lists them)", loc.url)
    table = pq.read_table(io.BytesIO(loc.get(info["file"])),
                          filters=[("traj", "=", traj)])
    events = events_of_table(table).get(traj, [])
    if len(events) != info["events"]:
        raise BadInput(f"{traj}: {len(events)} events in {info['file']}, the batch says "
                       f"{info['events']}", loc.url)
    blobs = BlobStore(out.parent / "blobs")
    walked: set[str] = set()
    pulled = _Pull(loc, blobs)
    for ev in events:
        for sha in sorted(needed(pulled, ev, walked)):  # type: ignore[arg-type]
            pulled.get(sha)
    write_trajectory(out, traj, events, blobs=blobs,
                     extra={"archive": loc.url, "batch": info["batch"]})
    return out


class _Pull:
    """The archive's blobs, copied into a local blob store as they are read."""

    def __init__(self, loc: Location, local: BlobStore) -> None:
        self.loc, self.local = loc, local

    def get(self, ref: Any) -> bytes:
        sha = getattr(ref, "sha256", ref)
        if self.local.has(sha):
            return self.local.get(sha)
        data = self.loc.get_blob(sha)
        self.local.put(data)
        return data

    def has(self, sha: str) -> bool:
        return True


def is_archive(where: str) -> bool:
    return where.startswith("s3://") or (Path(where) / "STENOGRAPH-ARCHIVE").is_file()


def restore_where(where: str, sql: str | None) -> Path:
    """The archive's runs (those ``SELECT traj FROM trajectories WHERE sql`` names) as
    ``.steno`` files in a directory of the cache made for this selection."""
    import hashlib

    from stenograph.cold.query import run_query

    loc = open_location(where)
    ans = run_query(loc, "SELECT traj FROM trajectories" + (f" WHERE {sql}" if sql else "")
                    + " ORDER BY traj")
    trajs = [str(r[0]) for r in ans.rows]
    if not trajs:
        raise BadInput("no archived run matches" + (f" --where {sql}" if sql else ""), where)
    runs = cache_root() / loc.archive_id / "runs"
    pick = cache_root() / loc.archive_id / "selections" / hashlib.sha256(
        "\n".join(trajs).encode()).hexdigest()[:16]
    pick.mkdir(parents=True, exist_ok=True)
    for traj in trajs:
        path = runs / f"{traj}.steno"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            restore(loc, traj, path)
        link = pick / path.name
        if not link.exists():
            link.symlink_to(path)
    return pick


def materialize(arg: str) -> str:
    """``arg`` itself, or for ``ARCHIVE#TRAJ`` the path of its ``.steno`` in the cache."""
    ref = split_ref(arg)
    if ref is None:
        return arg
    where, traj = ref
    loc = open_location(where)
    path = cache_root() / loc.archive_id / "runs" / f"{traj}.steno"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        restore(loc, traj, path)
    return str(path)
