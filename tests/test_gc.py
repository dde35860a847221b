"""``stenograph gc`` on real stores: real snapshots of a real tree (full and delta
manifests), Checkpoint events naming them, a plain blob an event names, orphans; the
real CLI in a subprocess. After gc every referenced snapshot still restores to the tree
it was taken of, byte for byte; orphans are gone; ``--dry-run`` changes no byte; a
store a writer holds is refused and left as it was."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from trees import tree

from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.snapshots import (
    MAX_DEPTH,
    Snapshotter,
    Taken,
    closure,
    load_manifest,
    restore_tree,
)
from stenograph.recorder.store import Store

CLI = [sys.executable, "-m", "stenograph"]


def gc(store: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "gc", str(store), *flags], capture_output=True, text=True,
                          timeout=60)


def gc_json(store: Path, *flags: str) -> dict:
    p = gc(store, "--json", *flags)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def digest(root: Path, *, lock: bool = True) -> dict[str, str]:
    """Every path under ``root`` with its type, mode, mtime and bytes: any change shows
    (but in ``LOCK``, which holds the pid of the last process to take it, if not ``lock``)."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if not lock and p.name == "LOCK":
            out["LOCK"] = "<lock>"
            continue
        st_ = p.lstat()
        what = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
        out[str(p.relative_to(root))] = f"{what} {st_.st_mode:o} {st_.st_mtime_ns}"
    return out


def restorable(root: Path) -> dict[str, tuple[object, ...]]:
    """What a restore gives back, directory mtimes aside (gc's concern is the bytes)."""
    return tree(root, dir_times=False, root_entry=False)


def blob_shas(store: Path) -> set[str]:
    return {p.parent.name + p.name for p in (store / "blobs").glob("??/*")
            if not p.name.startswith(".")}


def checkpoint_body(turn: int, t: Taken) -> dict:
    return {"turn": turn, "at": "turn" if turn else "start", "snapshot": t.ref.to_body(),
            "covers_lsn": 0, "proc": None, "pos": None, "files": t.files,
            "bytes_added": t.bytes_added, "full": t.full, "seconds": t.seconds}


@dataclass
class Built:
    store: Path
    work: Path
    referenced: list[tuple[Taken, dict]]
    """Snapshots a Checkpoint names, each with the tree state it was taken of."""
    unreferenced: list[Taken]
    plain: BlobRef
    orphans: set[str]
    """Every blob no event needs, as computed independently of gc."""
    stale_tmp: list[Path]
    young_tmp: Path
    other: Path


def edit(work: Path, turn: int) -> None:
    """One turn's changes: modify, create, delete, chmod, a link, a directory."""
    (work / "src" / f"m{turn % 3}.py").write_text(f"print({turn})\n" * (turn + 1))
    (work / "notes" / f"n{turn}.md").write_text(f"turn {turn}\n")
    if turn % 2:
        (work / "notes" / f"n{turn - 1}.md").unlink(missing_ok=True)
    (work / "run.sh").chmod(0o755 if turn % 2 else 0o644)
    (work / "link").unlink(missing_ok=True)
    (work / "link").symlink_to(f"src/m{turn % 3}.py")
    (work / f"d{turn}").mkdir()


def build(tmp: Path) -> Built:
    store, work = tmp / "store", tmp / "work"
    (work / "src").mkdir(parents=True)
    (work / "notes").mkdir()
    for i in range(3):
        (work / "src" / f"m{i}.py").write_text(f"# module {i}\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "shared.txt").write_text("the same bytes in every snapshot\n")
    referenced: list[tuple[Taken, dict]] = []
    with Store(store) as st:
        blobs = BlobStore(store / "blobs")
        snap = Snapshotter(blobs, [str(work)])
        st.append("run1", "RunStarted", {"argv": ["agent"]})
        # Turn 0 (full) and 2 get no Checkpoint: only the newest delta of a chain is
        # named, so its base and the deltas between must survive through the closure.
        takes = []
        for turn in range(5):
            if turn:
                edit(work, turn)
                time.sleep(0.002)
            takes.append((snap.take(), restorable(work)))
        assert takes[0][0].full and not any(t.full for t, _ in takes[1:])
        for turn in (1, 3, 4):
            t, state = takes[turn]
            st.append("run1", "Checkpoint", checkpoint_body(turn, t))
            referenced.append((t, state))
        plain = blobs.put(b"a tool's output, bulky enough for a blob\n" * 50)
        st.append("run1", "ToolResult", {"out": {"nested": [plain.to_body()]}})
        # A malformed reference names nothing and must not stop gc.
        st.append("run1", "Note", {"x": {"$blob": "not-a-hash", "size": -1}})

        # A second run whose snapshots are never named: a killed recording.
        other_work = tmp / "work2"
        other_work.mkdir()
        (other_work / "only-here.txt").write_text("in no referenced snapshot\n")
        (other_work / "shared.txt").write_text("the same bytes in every snapshot\n")
        lost = Snapshotter(blobs, [str(other_work)])
        unreferenced = [lost.take()]
        (other_work / "only-here.txt").write_text("changed, still unreferenced\n")
        unreferenced.append(lost.take())
        st.append("run2", "RunStarted", {"argv": ["agent"]})
        st.append("run2", "Note", {"text": "no checkpoint"})
        orphan_plain = blobs.put(b"a body whose event never became durable")

    needed: set[str] = {plain.sha256}
    for t, _ in referenced:
        needed |= {r.sha256 for r in closure(blobs, t.ref)}
    assert {t.ref.sha256 for t, _ in takes} <= needed  # the base and the skipped delta
    orphans = blob_shas(store) - needed
    assert orphan_plain.sha256 in orphans
    assert {t.ref.sha256 for t in unreferenced} <= orphans
    assert hashlib.sha256(b"the same bytes in every snapshot\n").hexdigest() not in orphans

    old = time.time() - 2 * 3600
    stale = [store / "blobs" / ".put.4242.1.tmp",
             store / "blobs" / "ab" / ".cdef0123.4242.tmp"]
    for p in stale:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"half a blob")
        os.utime(p, (old, old))
    young = store / "blobs" / ".put.4343.1.tmp"
    young.write_bytes(b"a blob being written right now")
    other = store / "blobs" / "README"
    other.write_text("not a blob: gc leaves it\n")
    return Built(store, work, referenced, unreferenced, plain, orphans, stale, young, other)


def assert_restores(b: Built, tmp: Path) -> None:
    blobs = BlobStore(b.store / "blobs")
    for i, (t, state) in enumerate(b.referenced):
        m = load_manifest(blobs, t.ref)
        dest = tmp / f"restored{i}"
        restore_tree(blobs, m.trees[str(b.work)], dest)
        assert restorable(dest) == state, f"snapshot {i} does not restore after gc"


def test_gc_removes_orphans_and_keeps_every_snapshot_closure(tmp_path: Path) -> None:
    b = build(tmp_path)
    wal = digest(b.store / "wal")
    before = blob_shas(b.store)
    r = gc_json(b.store)
    assert r["dry_run"] is False
    after = blob_shas(b.store)
    assert after == before - b.orphans
    assert not b.orphans & after
    assert r["removed"]["blobs"] == len(b.orphans)
    assert r["kept"]["blobs"] == len(after)
    assert r["snapshots"] == 3 and r["events"] == 8
    assert r["temp_removed"]["files"] == 2 and r["temp_kept"] == 1 and r["other_files"] == 1
    assert not any(p.exists() for p in b.stale_tmp)
    assert b.young_tmp.exists() and b.other.exists()
    assert r["missing"] == 0 and r["torn_tail"] is None
    assert digest(b.store / "wal") == wal, "gc never writes the log"
    assert BlobStore(b.store / "blobs").get(b.plain) == (
        b"a tool's output, bulky enough for a blob\n" * 50)
    assert_restores(b, tmp_path)
    # Nothing left to collect; a second run removes nothing.
    again = gc_json(b.store)
    assert again["removed"]["blobs"] == 0 and again["temp_removed"]["files"] == 0
    assert blob_shas(b.store) == after


def test_dry_run_changes_nothing_and_counts_what_gc_removes(tmp_path: Path) -> None:
    b = build(tmp_path)
    before = digest(b.store)
    p = gc(b.store, "--dry-run")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"would remove {len(b.orphans)} unreferenced blobs")
    dry = gc_json(b.store, "--dry-run")
    assert digest(b.store) == before, "--dry-run changed the store"
    real = gc_json(b.store)
    assert dry["removed"] == real["removed"]
    assert dry["temp_removed"] == real["temp_removed"]
    assert dry["kept"] == real["kept"]


def test_locked_store_is_refused_and_unchanged(tmp_path: Path) -> None:
    b = build(tmp_path)
    with Store(b.store):  # a live writer
        before = digest(b.store)
        for flags in ((), ("--dry-run",), ("--json",)):
            p = gc(b.store, *flags)
            assert p.returncode == 2, p.stderr
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("stenograph: error: store is "
                                                           "locked by a writer (pid ")
            assert str(os.getpid()) in lines[0] and p.stdout == ""
            assert digest(b.store) == before
    assert gc_json(b.store)["removed"]["blobs"] == len(b.orphans)  # once it has ended


def test_torn_tail_keeps_what_durable_events_reference(tmp_path: Path) -> None:
    b = build(tmp_path)
    seg = sorted((b.store / "wal").glob("*.seg"))[-1]
    # where the last frame ends (not where the zeros start: a frame may end in zeros)
    end = max(off + size for s, off, size, _item in StoreReader(b.store).frames()
              if s == seg)
    with open(seg, "r+b") as f:  # half a frame after the seal: what a crash leaves
        f.seek(end)
        f.write(b"\x40\x00\x00\x00\xde\xad\xbe\xef\x96\x01")
    before = blob_shas(b.store)
    r = gc_json(b.store)
    assert r["torn_tail"] is not None and r["torn_tail"]["offset"] == end
    assert blob_shas(b.store) == before - b.orphans
    assert r["removed"]["blobs"] == len(b.orphans)
    assert_restores(b, tmp_path)
    p = gc(b.store)
    assert p.returncode == 0 and "note: torn tail" in p.stderr


def test_missing_manifest_stops_gc_before_it_removes_anything(tmp_path: Path) -> None:
    b = build(tmp_path)
    base = b.referenced[0][0].ref  # a delta the later ones chain through
    BlobStore(b.store / "blobs").path_of(base.sha256).unlink()
    before = digest(b.store, lock=False)  # gc held the lock: its pid is in LOCK
    for flags in ((), ("--dry-run",)):
        p = gc(b.store, *flags)
        assert p.returncode == 3, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot be read" in lines[0]
        assert "removed nothing" in lines[0]
        assert digest(b.store, lock=False) == before


def test_chain_cut_at_max_depth_keeps_only_what_the_newest_needs(tmp_path: Path) -> None:
    """Past MAX_DEPTH the snapshotter writes a full manifest: a Checkpoint naming only
    a snapshot after the cut needs nothing from before it."""
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    with Store(store) as st:
        snap = Snapshotter(BlobStore(store / "blobs"), [str(work)])
        takes = []
        for i in range(MAX_DEPTH + 3):
            (work / f"f{i}").write_text(f"file {i}\n")
            takes.append(snap.take())
        cut = next(i for i, t in enumerate(takes) if i and t.full)
        assert cut == MAX_DEPTH + 1
        last = takes[-1]
        st.append("r", "Checkpoint", checkpoint_body(len(takes), last))
        state = restorable(work)
    r = gc_json(store)
    assert r["removed"]["blobs"] == cut  # the manifests before the cut: no file blob
    left = blob_shas(store)
    assert {t.ref.sha256 for t in takes[:cut]}.isdisjoint(left)
    assert {t.ref.sha256 for t in takes[cut:]} <= left
    blobs = BlobStore(store / "blobs")
    restore_tree(blobs, load_manifest(blobs, last.ref).trees[str(work)], tmp_path / "out")
    assert restorable(tmp_path / "out") == state


@pytest.mark.parametrize("what", ["missing", "not a store", "a file"])
def test_not_a_store_is_one_line_and_exit_2(tmp_path: Path, what: str) -> None:
    path = tmp_path / "x"
    if what == "not a store":
        path.mkdir()
        (path / "data").write_text("mine")
    elif what == "a file":
        path.write_text("mine")
    before = digest(tmp_path)
    p = gc(path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stenograph: error: "), p.stderr
    assert digest(tmp_path) == before
