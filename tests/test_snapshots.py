"""Workspace snapshots on real trees: random edit sequences, a snapshot between edits,
and every snapshot restored gives the tree at that point, byte for byte (types, bytes,
modes, link targets, empty directories, mtimes)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trees import tree

from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.errors import BadInput
from stenograph.recorder.snapshots import (
    IgnoreRules,
    Limits,
    Snapshotter,
    WorkspaceTooBig,
    closure,
    daly_interval,
    load_manifest,
    restore_tree,
)

NAMES = ["a", "b", "c.txt", "d", "sub"]


edit = st.tuples(
    st.sampled_from(["create", "modify", "chmod", "rename", "delete", "symlink", "mkdir",
                     "touch"]),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join),
    st.binary(max_size=64),
    st.sampled_from([0o644, 0o600, 0o755, 0o444]),
)


def apply(root: Path, op: str, a: str, b: str, data: bytes, mode: int) -> None:
    pa, pb = root / a, root / b
    try:
        if op == "create":
            pa.parent.mkdir(parents=True, exist_ok=True)
            pa.write_bytes(data)
        elif op == "modify" and pa.is_file() and not pa.is_symlink():
            with open(pa, "ab") as f:
                f.write(data or b"x")
        elif op == "chmod" and pa.exists() and not pa.is_symlink():
            os.chmod(pa, mode | (0o700 if pa.is_dir() else 0))
        elif op == "rename" and pa.exists() and not str(pb).startswith(str(pa) + "/"):
            pb.parent.mkdir(parents=True, exist_ok=True)
            os.replace(pa, pb)
        elif op == "delete" and (pa.exists() or pa.is_symlink()):
            if pa.is_dir() and not pa.is_symlink():
                for dirpath, dirs, files in os.walk(pa, topdown=False):
                    for f in files:
                        os.unlink(os.path.join(dirpath, f))
                    for d in dirs:
                        p = os.path.join(dirpath, d)
                        os.unlink(p) if os.path.islink(p) else os.rmdir(p)
                pa.rmdir()
            else:
                pa.unlink()
        elif op == "symlink" and not pa.exists() and not pa.is_symlink():
            pa.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(b or "nowhere", pa)
        elif op == "mkdir":
            pa.mkdir(parents=True, exist_ok=True)
        elif op == "touch" and pa.exists() and not pa.is_symlink():
            os.utime(pa, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    except (NotADirectoryError, FileExistsError, IsADirectoryError, OSError):
        pass  # an edit that makes no sense on this tree: the tree stays as it is


@settings(max_examples=int(os.environ.get("STENO_SNAPSHOT_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(edit, max_size=6), min_size=1, max_size=6))
def test_every_snapshot_restores_the_tree_it_saw(rounds: list[list[tuple]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work, blobs = Path(tmp, "work"), BlobStore(Path(tmp, "blobs"))
        work.mkdir()
        snap = Snapshotter(blobs, [str(work)], IgnoreRules(patterns=()))
        taken = []
        for edits in rounds:
            for e in edits:
                apply(work, *e)
            os.utime(work, ns=(1_600_000_000_000_000_001, 1_600_000_000_000_000_001))
            t = snap.take()
            taken.append((t.ref, tree(work), t.full))
        assert taken[0][2] and (len(taken) == 1 or not taken[1][2])  # then deltas
        for i, (ref, expected, _full) in enumerate(taken):
            m = load_manifest(blobs, ref)
            dest = Path(tmp, f"restored{i}")
            restore_tree(blobs, m.trees[str(work)], dest)
            assert tree(dest) == expected, f"snapshot {i}"
            # everything the snapshot needs is in its closure
            names = {r.sha256 for r in closure(blobs, ref)}
            files = {e.sha256 for e in m.trees[str(work)].values() if e.kind == "f"}
            assert files <= names and ref.sha256 in names


def test_unchanged_files_are_not_read_again_and_not_stored_twice(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    for i in range(50):
        (work / f"f{i}").write_bytes(os.urandom(1000))
    blobs = BlobStore(tmp_path / "blobs")
    snap = Snapshotter(blobs, [str(work)], IgnoreRules(patterns=()))
    first = snap.take()
    assert first.full and first.bytes_added == 50_000
    (work / "f3").write_bytes(b"changed")
    second = snap.take()
    assert not second.full and second.bytes_added == len(b"changed")
    assert second.manifest_bytes < first.manifest_bytes / 5  # a delta: one entry
    other = Snapshotter(blobs, [str(work)], IgnoreRules(patterns=()))
    assert other.take().bytes_added == 0  # another run: the same bytes are stored once


def test_ignore_rules_limits_and_exclusions(tmp_path: Path) -> None:
    work = tmp_path / "w"
    (work / ".git" / "objects").mkdir(parents=True)
    (work / ".git" / "objects" / "ab").write_bytes(b"obj")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    (work / "build").mkdir()
    (work / "build" / "out.o").write_bytes(b"o")
    (work / "keep.log").write_text("k")
    (work / "drop.log").write_text("d")
    (work / ".stenoignore").write_text("# comment\nbuild/\ndrop.*\n")
    (work / "store").mkdir()
    (work / "store" / "seg").write_bytes(b"s")
    blobs = BlobStore(tmp_path / "blobs")
    rules = IgnoreRules(exclude=(str(work / "store"),))
    t = Snapshotter(blobs, [str(work)], rules).take()
    paths = set(t.manifest.trees[str(work)])
    assert ".git/objects/ab" in paths and "keep.log" in paths and ".stenoignore" in paths
    assert not paths & {"__pycache__", "build", "build/out.o", "drop.log", "store"}
    with pytest.raises(WorkspaceTooBig, match="--workspace-max"):
        Snapshotter(blobs, [str(work)], rules, Limits(files=3)).take()
    assert Limits.parse("10:5M") == Limits(10, 5 << 20)
    assert Limits.parse("1G").bytes == 1 << 30 and Limits.parse("7").files == 7
    with pytest.raises(BadInput):
        Limits.parse("lots")


def test_daly_interval_is_youngs_for_cheap_checkpoints() -> None:
    young = (2 * 0.1 * 14400) ** 0.5
    assert abs(daly_interval(0.1, 14400) - young) / young < 0.01
    assert daly_interval(0, 14400) == 0
    assert daly_interval(10, 4) == 4  # a checkpoint dearer than the failures it guards
