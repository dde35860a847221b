"""No payload can forge log structure; bad bodies and incomplete .steno files fail cleanly.

A torn final batch must always be told from damage to acknowledged data, whatever
the events' bodies hold. The adversary here writes bodies that embed exact
copies of the store's own batch markers and event frames (and legacy-format
markers with valid CRCs), then the final batch is torn at a random place: the
store must open, keep every acknowledged event, cut only the torn batch, and
take the next append.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from conftest import SMALL, Model, copy_store, dir_digest, segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder.codec import (
    MAX_DEPTH,
    Event,
    encode_event,
    envelope,
    frame,
    marker,
    salted_marker,
)
from stenograph.recorder.errors import BadInput, CorruptLog
from stenograph.recorder.reader import STORE_MARKER, StoreReader, read_salt
from stenograph.recorder.segment import HEADER_SIZE, TRAJ_MAGIC, SegmentHeader
from stenograph.recorder.store import Store
from stenograph.recorder.trajfile import read_trajectory, write_trajectory

GOLDEN = Path(__file__).resolve().parent.parent / "golden_logs"


@dataclass
class Scanned:
    off: int
    end: int
    item: Event | int


def scan_last(path: Path) -> list[Scanned]:
    last = segments(path)[-1]
    return [Scanned(off, off + size, item) for seg, off, size, item in StoreReader(path).frames()
            if seg == last]


def real_structure(path: Path) -> list[bytes]:
    """Exact bytes of real markers and event frames of the store, and legacy markers."""
    out: list[bytes] = []
    for seg, off, size, item in StoreReader(path).frames():
        data = seg.read_bytes()[off:off + size]
        out.append(data)
        if isinstance(item, int):
            out.append(marker(item))  # what a pre-salt writer put there
            out.append(marker(item + 1))
    return out


def adversarial_body(rng: random.Random, pieces: list[bytes]) -> dict[str, object]:
    """A body whose packed bytes hold copies of real frames, at varied alignments."""
    chosen = [rng.choice(pieces) for _ in range(rng.randint(1, 6))]
    blob = b"".join(bytes(rng.randint(0, 3)) + p for p in chosen)
    return {"copy": blob, "list": chosen, "pad": "z" * rng.randint(0, 300)}


def build(path: Path, seed: int) -> tuple[Model, int]:
    """A store whose acknowledged batches carry adversarial bodies; returns model, acked."""
    rng = random.Random(seed)
    model = Model()
    with Store(path, settings=SMALL) as s:
        for b in range(6):  # honest batches first: real structure to copy
            for j in range(rng.randint(1, 3)):
                body = {"b": b, "j": j}
                model.add(s.append("honest", "Note", body, durable=False), "honest", "Note", body)
            s.flush()
        for _ in range(rng.randint(2, 5)):  # acknowledged batches of hostile bodies
            pieces = real_structure(path)
            for _j in range(rng.randint(1, 3)):
                body = adversarial_body(rng, pieces)
                model.add(s.append("evil", "Note", body, durable=False), "evil", "Note", body)
            s.flush()
        acked = len(model.events)
        pieces = real_structure(path)
        for _j in range(rng.randint(1, 4)):  # the final batch, torn below
            body = adversarial_body(rng, pieces)
            model.add(s.append("evil", "Note", body, durable=False), "evil", "Note", body)
        s.flush()
        # Crash now: copy the directory while the writer is open (no seal on the copy).
        copy_store(path, path.with_name(path.name + "-crash"))
    return model, acked


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**32), data=st.data(),
       mode=st.sampled_from(["zero", "garbage", "flip", "truncate"]))
def test_hostile_bodies_cannot_turn_a_torn_tail_into_corruption(scratch, seed, data,
                                                               mode) -> None:
    base = scratch()
    model, acked = build(base, seed)
    path = base.with_name(base.name + "-crash")
    frames = scan_last(path)
    markers = [f for f in frames if isinstance(f.item, int)]
    final_marker = markers[-1]
    assert final_marker.item == acked + 1, "the copy ends with the final, unsealed batch"
    data_end = frames[-1].end
    cut = data.draw(st.integers(final_marker.off, data_end - 1), label="damage at")
    seg = segments(path)[-1]
    original = seg.read_bytes()
    raw = bytearray(original)
    rnd = random.Random(seed)
    if mode == "zero":
        raw[cut:data_end] = bytes(data_end - cut)
    elif mode == "garbage":
        end = data.draw(st.integers(cut + 1, data_end), label="garbage end")
        raw[cut:end] = rnd.randbytes(end - cut)
    elif mode == "flip":
        raw[cut] ^= 1 << rnd.randint(0, 7)
    else:
        del raw[cut:]
    seg.write_bytes(bytes(raw))
    first_diff = next((i for i in range(final_marker.off, data_end)
                       if i >= len(raw) or raw[i] != original[i]), None)

    if first_diff is None:  # random bytes that happen to equal the originals
        expect = model.events
    else:
        hit = next(f for f in frames if f.off <= first_diff < f.end)
        expect = model.events[:acked] + [f.item for f in frames if isinstance(f.item, Event)
                                         and f.off > final_marker.off and f.end <= hit.off]
    reader = StoreReader(path)
    got = list(reader.events())  # never CorruptLog: nothing after the damage is a batch
    assert got == expect, "lost an acknowledged event, or served a torn one"
    if reader.torn is not None:
        assert first_diff is not None and reader.torn.offset == hit.off
    with Store(path, settings=SMALL) as s:
        assert s.events() == got
        lsn = s.append("after", "Note", {"x": 1})
        assert lsn == len(got) + 1
    after = list(StoreReader(path).events())
    assert after[:-1] == got and after[-1].lsn == lsn
    with Store(path, settings=SMALL) as s:
        assert s.recovered is None
    shutil.rmtree(base)
    shutil.rmtree(path)


def test_copied_markers_inside_a_body_are_not_batches(tmp_path) -> None:
    """A body made only of the store's real markers, torn right after its header."""
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        for i in range(5):
            s.append("a", "Note", {"i": i})
        real = [p for p in real_structure(path) if len(p) < 40]
        s.append("a", "Note", {"copies": b"".join(real * 20)})
        copy_store(path, tmp_path / "crash")
    crash = tmp_path / "crash"
    frames = scan_last(crash)
    victim = frames[-1]
    assert isinstance(victim.item, Event) and victim.item.lsn == 6
    seg = segments(crash)[-1]
    raw = bytearray(seg.read_bytes())
    raw[victim.off + 8] ^= 0xFF  # first byte of its payload: a CRC mismatch
    seg.write_bytes(bytes(raw))
    reader = StoreReader(crash)
    assert [e.lsn for e in reader.events()] == [1, 2, 3, 4, 5]
    assert reader.torn is not None and reader.torn.offset == victim.off
    with Store(crash, settings=SMALL) as s:
        assert s.recovered is not None and s.recovered.offset == victim.off
        assert s.append("a", "Note", {}) == 6


def test_a_marker_is_valid_only_where_the_writer_put_it(tmp_path) -> None:
    """Moving a real marker (or forging one without the salt) is damage, not a batch."""
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", {})
    salt = read_salt(path)
    assert salt is not None and len(salt) == 16
    seg = segments(path)[0]
    raw = seg.read_bytes()
    frames = scan_last(path)
    first = frames[0]
    assert raw[first.off:first.end] == salted_marker(1, salt, 1, first.off)
    assert salted_marker(1, salt, 1, first.off + 1) != raw[first.off:first.end]
    assert salted_marker(1, b"\0" * 16, 1, first.off) != raw[first.off:first.end]


def test_acknowledged_damage_is_still_corruption(tmp_path) -> None:
    """The salt changes nothing for damage that a later real batch proves acknowledged."""
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        for i in range(4):
            s.append("a", "Note", {"i": i})
    frames = scan_last(path)
    victim = frames[1]
    seg = segments(path)[0]
    raw = bytearray(seg.read_bytes())
    raw[victim.off + 9] ^= 1
    seg.write_bytes(bytes(raw))
    before = dir_digest(path)
    with pytest.raises(CorruptLog) as info:
        list(StoreReader(path).events())
    assert info.value.offset == victim.off and "acknowledged" in str(info.value)
    with pytest.raises(CorruptLog):
        Store(path, settings=SMALL)
    assert dir_digest(path) == before


# -- stores made before the salt ----------------------------------------------------


def test_old_store_reads_and_is_upgraded_by_its_first_writer(tmp_path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN / "v1" / "store", copy)
    assert read_salt(copy) is None
    old = {p.name: p.read_bytes() for p in segments(copy)}
    expected = list(StoreReader(copy).events())
    with Store(copy, settings=SMALL) as st:
        assert st.recovered is None
        lsn = st.append("run-a", "Note", {"after": "upgrade"})
    assert read_salt(copy) is not None
    assert (copy / STORE_MARKER).read_text().startswith("stenograph store\nformat 1\n")
    names = [p.name for p in segments(copy)]
    assert names[:-1] == sorted(old) and names[-1] not in old, "a fresh salted tail segment"
    assert {n: (copy / "wal" / n).read_bytes() for n in old} == old, "old segments untouched"
    got = list(StoreReader(copy).events())
    assert got[:-1] == expected and got[-1].lsn == lsn == len(expected) + 1
    with Store(copy, settings=SMALL) as st:
        assert st.recovered is None and len(segments(copy)) == len(names)


def test_replaced_salt_is_corruption_not_a_torn_tail(tmp_path) -> None:
    """A one-segment store with another salt must not be cut away as a torn tail."""
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", {})
    (path / STORE_MARKER).write_text(f"stenograph store\nformat 1\nsalt {'ab' * 16}\n")
    before = dir_digest(path)
    with pytest.raises(CorruptLog) as info:
        list(StoreReader(path).events())
    assert info.value.offset == HEADER_SIZE and "salt" in str(info.value)
    with pytest.raises(CorruptLog):
        Store(path, settings=SMALL)
    assert dir_digest(path) == before


def test_malformed_salt_is_refused_with_one_line(tmp_path) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", {})
    (path / STORE_MARKER).write_text("stenograph store\nformat 1\nsalt nothex\n")
    before = dir_digest(path)
    with pytest.raises(BadInput) as info:
        StoreReader(path)
    assert "salt" in str(info.value) and info.value.exit_code == 2
    with pytest.raises(BadInput):
        Store(path, settings=SMALL)
    assert dir_digest(path) == before


# -- bodies the reader would refuse are refused on append ---------------------------


@pytest.mark.parametrize("body", [
    "deep", {"e": msgpack.ExtType(5, b"x")}, {(1, 2): "tuple key"}, {"k": {(1,): 2}},
], ids=["deep", "ext", "tuple-key", "nested-tuple-key"])
def test_unreadable_body_is_refused_on_append(tmp_path, body) -> None:
    if body == "deep":
        body = {}
        for _ in range(MAX_DEPTH):
            body = {"a": body}
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        with pytest.raises(BadInput):
            s.append("a", "Note", body)
        assert s.append("a", "Note", {"ok": 1}) == 1
    assert [e.body for e in StoreReader(path).events()] == [{"ok": 1}]


def test_timestamp_reads_back_as_nanoseconds(tmp_path) -> None:
    """msgpack's timestamp extension is the one extension read: as an int, safe anywhere."""
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", {"t": msgpack.Timestamp(1, 5)})
    (ev,) = StoreReader(path).events()
    assert ev.body == {"t": 1_000_000_005}


def test_deepest_writable_body_reads_back(tmp_path) -> None:
    body: dict[str, object] = {}
    for _ in range(MAX_DEPTH - 1):
        body = {"a": body}
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", body)
    (ev,) = StoreReader(path).events()
    json.dumps(ev.to_json())


# -- .steno files: blobs, and bodies no writer makes --------------------------------


def steno(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stenograph", *args],
                          capture_output=True, text=True, timeout=60)


def _steno_file(path: Path, header: dict[str, object], payloads: list[bytes]) -> Path:
    path.write_bytes(SegmentHeader(TRAJ_MAGIC, 1, 0, 0).pack()
                     + frame(msgpack.packb(header, use_bin_type=True))
                     + b"".join(frame(p) for p in payloads))
    return path


HEADER = {"format": 1, "stenograph": "test", "traj": "t", "events": 1, "first_lsn": 1,
          "last_lsn": 1, "blobs": 0}
SHA = hashlib.sha256(b"tool output").hexdigest()
WITH_REF = Event(1, "t", 0, None, "ToolResult", {"out": {"$blob": SHA, "size": 11}})


def _one_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stenograph: error: "), r.stderr
    return lines[0]


def test_verify_names_a_missing_blob_exit_3(tmp_path) -> None:
    f = _steno_file(tmp_path / "m.steno", HEADER, [encode_event(WITH_REF)[8:]])
    line = _one_line(steno("log", "verify", str(f)), 3)
    assert SHA in line and "missing blob" in line
    line = _one_line(steno("replay", str(f)), 3)
    assert SHA in line
    with pytest.raises(CorruptLog):
        read_trajectory(f)


def test_header_blob_count_must_match(tmp_path) -> None:
    f = _steno_file(tmp_path / "c.steno", {**HEADER, "blobs": 2}, [encode_event(WITH_REF)[8:]])
    assert "blobs" in _one_line(steno("log", "verify", str(f)), 3)


def test_embedded_and_external_blobs_verify(tmp_path) -> None:
    from stenograph.recorder.blobs import BlobStore

    store = BlobStore(tmp_path / "blobs")
    store.put(b"tool output")
    whole = write_trajectory(tmp_path / "w.steno", "t", [WITH_REF], blobs=store)
    assert whole.blobs == 1
    assert read_trajectory(tmp_path / "w.steno").blobs == {SHA: b"tool output"}
    r = steno("log", "verify", str(tmp_path / "w.steno"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["blobs"] == 1
    thin = write_trajectory(tmp_path / "n.steno", "t", [WITH_REF])
    assert thin.header["external_blobs"] == [SHA]
    r = steno("log", "verify", str(tmp_path / "n.steno"))
    assert r.returncode == 0 and "1 external" in r.stdout, r.stderr
    tf = read_trajectory(tmp_path / "n.steno")
    with pytest.raises(CorruptLog) as info:
        tf.blobs[SHA]  # what a replay does: a clean error, not a KeyError
    assert SHA in str(info.value)


def _nested(depth: int) -> bytes:
    return b"\x81\xa1a" + b"\x91" * (depth - 1) + b"\x90"


@pytest.mark.parametrize(("what", "body"), [
    ("deep-100000", _nested(100_000)),
    ("deep-1000", _nested(1000)),
    ("unhashable-key", b"\x81\x90\x01"),
    ("map-key", b"\x81\x80\x01"),
    ("ext", b"\x81\xa1e\xc7\x01\x05a"),
    ("bad-utf8", b"\x81\xa2\xff\xfe\x01"),
])
@pytest.mark.parametrize("where", ["steno", "store"])
def test_cat_and_verify_refuse_unreadable_bodies_cleanly(tmp_path, what, body, where) -> None:
    payload = envelope(1, "t", 0, None, "Note", body)
    if where == "steno":
        target = _steno_file(tmp_path / "x.steno", HEADER, [payload])
    else:
        target = tmp_path / "s"
        Store(target, settings=SMALL).close()
        (seg,) = segments(target)
        salt = read_salt(target)
        assert salt is not None
        data = SegmentHeader(b"STENOWAL", 1, 1, 1).pack()
        data += salted_marker(1, salt, 1, HEADER_SIZE)
        data += frame(payload)
        seg.write_bytes(data + salted_marker(2, salt, 1, len(data))
                        + bytes(SMALL.segment_bytes))
    for cmd in (["log", "cat", str(target), "--json"], ["log", "cat", str(target)],
                ["log", "verify", str(target)]):
        r = steno(*cmd)
        line = _one_line(r, 3)
        assert "Traceback" not in r.stderr and "frame payload" in line, line


def test_a_store_whose_making_was_cut_short_is_finished_not_refused(tmp_path: Path) -> None:
    """A recorder killed between making the store's directories and writing its marker
    left a skeleton; the next writer completes it. Anything else in a directory without
    a marker is still refused."""
    from stenograph.recorder.errors import NotAStore
    from stenograph.recorder.store import Store

    half = tmp_path / "half"
    for sub in ("wal", "blobs", "checkpoints"):
        (half / sub).mkdir(parents=True)
    (half / "STENOGRAPH-STORE.tmp").write_text("stenograph st")
    with Store(half) as s:
        s.append("t", "Note", {"text": "hello"})
    with Store(half, create=False) as again:
        assert [e.kind for e in again.events()] == ["Note"]
    other = tmp_path / "other"
    (other / "wal").mkdir(parents=True)
    (other / "wal" / "notes.txt").write_text("mine")
    try:
        Store(other)
    except NotAStore:
        pass
    else:
        raise AssertionError("a directory holding someone's files was taken for a store")
    assert (other / "wal" / "notes.txt").read_text() == "mine"
