"""The content-addressed blob store."""

from __future__ import annotations

import hashlib
import pathlib

import pytest
from conftest import SMALL, flip_bit
from hypothesis import given, settings
from hypothesis import strategies as st

from stenograph.recorder import trajfile
from stenograph.recorder.blobs import BlobRef, BlobStore
from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput, CorruptLog
from stenograph.recorder.store import Store


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> BlobStore:
    return BlobStore(tmp_path_factory.mktemp("blobs"))


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000) | st.integers(0, 200_000).map(lambda n: b"\xa5" * n))
def test_put_get_round_trip(blobs, data) -> None:
    ref = blobs.put(data)
    assert ref == BlobRef(hashlib.sha256(data).hexdigest(), len(data))
    assert blobs.has(ref.sha256)
    assert blobs.get(ref) == data
    assert blobs.get(ref.sha256) == data
    assert blobs.path_of(ref.sha256).read_bytes() == data
    assert BlobRef.from_body(ref.to_body()) == ref


def test_put_is_idempotent(tmp_path) -> None:
    blobs = BlobStore(tmp_path / "b")
    ref = blobs.put(b"same bytes")
    path = blobs.path_of(ref.sha256)
    st1 = path.stat()
    assert blobs.put(b"same bytes") == ref
    st2 = path.stat()
    assert (st1.st_ino, st1.st_mtime_ns) == (st2.st_ino, st2.st_mtime_ns), "rewritten"
    files = sorted(p.relative_to(blobs.root) for p in blobs.root.rglob("*") if p.is_file())
    assert files == [path.relative_to(blobs.root)], "left temp files or duplicates"
    other = blobs.put(b"other bytes")
    assert other != ref and blobs.get(other) == b"other bytes" and blobs.get(ref) == b"same bytes"


def test_corrupted_blob_is_corrupt_log(tmp_path) -> None:
    blobs = BlobStore(tmp_path / "b")
    ref = blobs.put(b"precious payload" * 100)
    path = blobs.path_of(ref.sha256)
    flip_bit(path, 700, 4)
    with pytest.raises(CorruptLog) as info:
        blobs.get(ref)
    assert info.value.exit_code == 3
    assert info.value.segment == str(path)


def test_truncated_blob_is_corrupt_and_put_repairs_it(tmp_path) -> None:
    blobs = BlobStore(tmp_path / "b")
    data = b"0123456789" * 50
    ref = blobs.put(data)
    path = blobs.path_of(ref.sha256)
    path.write_bytes(data[:123])
    with pytest.raises(CorruptLog):
        blobs.get(ref)
    assert blobs.put(data) == ref
    assert blobs.get(ref) == data


def test_missing_blob_is_bad_input(tmp_path) -> None:
    blobs = BlobStore(tmp_path / "b")
    missing = hashlib.sha256(b"never stored").hexdigest()
    assert not blobs.has(missing)
    with pytest.raises(BadInput) as info:
        blobs.get(missing)
    assert info.value.exit_code == 2
    with pytest.raises(BadInput):
        blobs.get(BlobRef(missing, 12))


@pytest.mark.parametrize(
    "body",
    [{}, {"size": 1}, {"sha256": "ab", "$blob": "ab", "size": 1},
     {"sha256": "g" * 64, "$blob": "g" * 64, "size": 1},
     {"sha256": "a" * 64, "$blob": "a" * 64, "size": -1},
     {"sha256": "a" * 64, "$blob": "a" * 64, "size": "1"}],
)
def test_bad_blob_reference(body) -> None:
    with pytest.raises(BadInput):
        BlobRef.from_body(body)


def test_store_blobs_live_in_the_store(tmp_path) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        ref = s.blobs.put(b"bulky tool output")
        s.append("a", "ToolResult", {"output": ref.to_body()})
    with Store(path, settings=SMALL) as s:
        (ev,) = s.events()
        assert s.blobs.get(BlobRef.from_body(ev.body["output"])) == b"bulky tool output"
    assert (path / "blobs" / ref.sha256[:2] / ref.sha256[2:]).is_file()


def test_bad_hash_is_bad_input_not_a_path(tmp_path: pathlib.Path) -> None:

    bs = BlobStore(tmp_path / "blobs")
    with pytest.raises(BadInput):
        bs.get("../" + "a" * 61)


def test_put_repairs_a_damaged_copy(tmp_path: pathlib.Path) -> None:
    bs = BlobStore(tmp_path / "blobs")
    ref = bs.put(b"payload" * 100)
    path = bs.path_of(ref.sha256)
    path.write_bytes(b"X" * ref.size)  # same size, wrong bytes
    assert bs.put(b"payload" * 100) == ref
    assert bs.get(ref) == b"payload" * 100


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=4),
       part=st.integers(min_value=1, max_value=1500))
def test_embedded_blobs_of_any_size_round_trip_in_parts(
        tmp_path_factory: pytest.TempPathFactory, sizes: list[int], part: int) -> None:
    """A blob larger than a frame may carry (a workspace with a 300 MB file) is embedded
    in parts: the file reads back whole, and a file cut inside the parts is corrupt."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trajfile, "BLOB_PART", part)
        d = tmp_path_factory.mktemp("parts")
        blobs = BlobStore(d / "blobs")
        datas = [bytes([i % 251]) * n + hashlib.sha256(bytes([i, n % 256])).digest()
                 for i, n in enumerate(sizes)]
        refs = [blobs.put(x) for x in datas]
        evs = [Event(1, "t", 0, None, "Note", {"refs": [r.to_body() for r in refs]})]
        out = d / "t.steno"
        trajfile.write_trajectory(out, "t", evs, blobs=blobs)
        assert sorted(trajfile.read_trajectory(out).blobs.values()) == sorted(datas)
        big = [x for x in datas if len(x) > part]
        if big:
            raw = out.read_bytes()
            out.write_bytes(raw[:raw.rfind(hashlib.sha256(big[0]).hexdigest().encode())])
            with pytest.raises(CorruptLog):
                trajfile.read_trajectory(out)
