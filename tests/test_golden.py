"""Logs written by earlier builds (golden_logs/) must still read back exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store
from stenograph.recorder.trajfile import read_trajectory

GOLDEN = Path(__file__).resolve().parent.parent / "golden_logs"


def test_every_format_version_has_golden_files() -> None:
    versions = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
    assert "v1" in versions


def test_v1_store_reads_back_exactly() -> None:
    expected = json.loads((GOLDEN / "v1" / "expected-events.json").read_text())
    reader = StoreReader(GOLDEN / "v1" / "store")
    got = [e.to_json() for e in reader.events()]
    assert got == expected
    assert len(reader.segments) > 1, "the golden store should span several segments"
    assert reader.torn is None


def test_v1_trajectory_file_and_blob() -> None:
    expected = [e for e in json.loads((GOLDEN / "v1" / "expected-events.json").read_text())
                if e["traj"] == "run-a"]
    tf = read_trajectory(GOLDEN / "v1" / "run-a.steno")
    assert [e.to_json() for e in tf.events] == expected
    result = next(e for e in tf.events if e.kind == "ToolResult")
    ref = BlobRef.from_body(result.body["output"])
    assert tf.blobs[ref.sha256] == BlobStore(GOLDEN / "v1" / "store" / "blobs").get(ref)
    assert len(tf.blobs[ref.sha256]) == ref.size


def test_v1_store_is_appendable_by_this_build(tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN / "v1" / "store", copy)
    with Store(copy) as st:
        assert st.recovered is None
        assert st.next_seq("run-a") == 5
        lsn = st.append("run-a", "Note", {"after": "upgrade"})
    evs = list(StoreReader(copy).events(traj="run-a"))
    assert evs[-1].lsn == lsn == 19
    assert evs[-1].prev == evs[-2].lsn
