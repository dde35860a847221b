"""Codec and envelope: what goes in through Store.append comes out of StoreReader."""

from __future__ import annotations

import json
import math
import shutil

import msgpack
import pytest
from conftest import SMALL, Model, dir_digest, segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stenograph.recorder.codec import (
    Event,
    decode_payload,
    encode_event,
    envelope,
    frame,
    marker,
    pack_body,
)
from stenograph.recorder.errors import BadInput, UnknownKind
from stenograph.recorder.kinds import FORMAT_VERSION, KINDS
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import HEADER_SIZE, WAL_MAGIC, SegmentHeader
from stenograph.recorder.store import Store

TRAJS = ["a", "b-1", "run:42@host", "x" * 200, "T.0+1_2"]
KIND_LIST = sorted(KINDS)
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1

scalars = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, UINT64_MAX)
    | st.sampled_from([INT64_MIN, -1, 0, 2**31, 2**32, 2**63, UINT64_MAX])
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
keys = st.text(max_size=8) | st.integers(INT64_MIN, UINT64_MAX) | st.binary(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
# Some bodies carry a few KB, so that 64 KiB segments rotate within one example.
padding = st.integers(0, 9000).map(lambda n: bytes(i % 251 for i in range(n)))
bodies = st.builds(
    lambda fields, pad: {**fields, "pad": pad} if pad else fields,
    st.dictionaries(st.text(max_size=10), values, max_size=5),
    st.none() | padding,
)
appends = st.lists(
    st.tuples(st.sampled_from(TRAJS), st.sampled_from(KIND_LIST), bodies, st.booleans()),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(appends=appends, reopen_at=st.none() | st.integers(0, 30))
def test_round_trip_through_store(scratch, appends, reopen_at) -> None:
    """Random events (some durable, some not) read back exactly, with a consistent envelope.

    A close and reopen in the middle checks that the store rebuilds each
    trajectory's ``seq``/``prev`` from disk.
    """
    path = scratch()
    model = Model()
    store = Store(path, settings=SMALL)
    try:
        for i, (traj, kind, body, durable) in enumerate(appends):
            if i == reopen_at:
                store.close()
                store = Store(path, settings=SMALL)
            lsn = store.append(traj, kind, body, durable=durable)
            assert lsn == i + 1, "LSNs are consecutive from 1"
            model.add(lsn, traj, kind, body)
            assert store.next_seq(traj) == model.events[-1].seq + 1
    finally:
        store.close()

    got = list(StoreReader(path).events())
    assert got == model.events
    # The envelope, checked from first principles rather than through the model.
    last_of: dict[str, Event] = {}
    for n, ev in enumerate(got, start=1):
        assert ev.lsn == n
        before = last_of.get(ev.traj)
        assert ev.seq == (0 if before is None else before.seq + 1)
        assert ev.prev == (None if before is None else before.lsn)
        last_of[ev.traj] = ev
    for traj in TRAJS:
        assert list(StoreReader(path).events(traj=traj)) == [
            e for e in model.events if e.traj == traj
        ]
    mid = len(model.events) // 2 + 1
    assert list(StoreReader(path).events(from_lsn=mid)) == model.events[mid - 1 :]
    # Every body is printable as JSON (bytes tagged), whatever it contains.
    for ev in got:
        json.dumps(ev.to_json())

    reopened = Store(path, settings=SMALL)
    try:
        assert reopened.recovered is None
        counts = {t: sum(1 for e in model.events if e.traj == t) for t in TRAJS}
        assert reopened.trajectories() == {t: c for t, c in counts.items() if c}
        assert reopened.events() == model.events
    finally:
        reopened.close()
    shutil.rmtree(path)


@settings(max_examples=150, deadline=None)
@given(
    lsn=st.integers(1, UINT64_MAX),
    traj=st.sampled_from(TRAJS),
    seq=st.integers(0, 2**40),
    prev=st.none() | st.integers(1, UINT64_MAX),
    kind=st.sampled_from(KIND_LIST),
    body=st.dictionaries(keys, values, max_size=6),
)
def test_frame_round_trip(lsn, traj, seq, prev, kind, body) -> None:
    ev = Event(lsn, traj, seq, prev, kind, body)
    framed = encode_event(ev)
    length = int.from_bytes(framed[:4], "little")
    assert length == len(framed) - 8
    assert decode_payload(framed[8:], FORMAT_VERSION) == ev
    # envelope() splices an already packed body: same bytes as packing the whole array.
    whole = msgpack.packb([lsn, traj, seq, prev, kind, body], use_bin_type=True)
    assert envelope(lsn, traj, seq, prev, kind, pack_body(body)) == whole


@given(first=st.integers(0, UINT64_MAX))
@settings(max_examples=50, deadline=None)
def test_marker_round_trip(first) -> None:
    m = marker(first)
    assert decode_payload(m[8:], FORMAT_VERSION) == first


def test_floats_keep_their_bits(tmp_path) -> None:
    special = [0.1, -0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308]
    with Store(tmp_path / "s", settings=SMALL) as s:
        s.append("a", "Note", {"f": special})
    (ev,) = StoreReader(tmp_path / "s").events()
    assert [math.copysign(1, x) for x in ev.body["f"]] == [math.copysign(1, x) for x in special]
    assert ev.body["f"] == special


@pytest.mark.parametrize("kind", ["", "note", "FutureKind", "TaskStarted ", "Note\x00"])
def test_unknown_kind_is_refused_on_append(tmp_path, kind) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("a", "Note", {})
        before = dir_digest(path)
        with pytest.raises(UnknownKind) as info:
            s.append("a", kind, {"x": 1})
        assert isinstance(info.value, BadInput)
        assert info.value.exit_code == 2
        assert "format version" in str(info.value)
        assert str(FORMAT_VERSION) in str(info.value)
        assert dir_digest(path) == before
        # No LSN was consumed and the trajectory's seq did not move.
        assert s.append("a", "Note", {}) == 2
    assert [(e.lsn, e.seq, e.prev) for e in StoreReader(path).events()] == [
        (1, 0, None), (2, 1, 1)]


def _store_with_payloads(path, payloads: list[bytes]) -> None:
    """A store whose only segment holds ``payloads`` framed (written by hand)."""
    Store(path, settings=SMALL).close()
    (seg,) = segments(path)
    data = SegmentHeader(WAL_MAGIC, FORMAT_VERSION, 1, 1).pack()
    assert len(data) == HEADER_SIZE
    for p in payloads:
        data += frame(p)
    seg.write_bytes(data + bytes(SMALL.segment_bytes - len(data)))


def test_unknown_kind_in_log_names_format_version(tmp_path) -> None:
    """A kind outside the closed set is an error naming the version, never a skip."""
    path = tmp_path / "s"
    good = envelope(1, "a", 0, None, "Note", pack_body({}))
    bad = envelope(2, "a", 1, 1, "FromTheFuture", pack_body({"x": 1}))
    _store_with_payloads(path, [msgpack.packb((1,)), good, bad])
    got = []
    with pytest.raises(UnknownKind) as info:
        got.extend(StoreReader(path).events())
    assert got == [Event(1, "a", 0, None, "Note", {})]
    assert "FromTheFuture" in str(info.value)
    assert f"format version {FORMAT_VERSION}" in str(info.value)
    before = dir_digest(path)
    with pytest.raises(UnknownKind):
        Store(path, settings=SMALL)
    assert dir_digest(path) == before


def test_unknown_kind_from_newer_version_names_both_versions() -> None:
    payload = envelope(1, "a", 0, None, "FromTheFuture", pack_body({}))
    with pytest.raises(UnknownKind) as info:
        decode_payload(payload, FORMAT_VERSION + 6)
    assert str(FORMAT_VERSION + 6) in str(info.value)
    assert str(FORMAT_VERSION) in str(info.value)


@pytest.mark.parametrize(
    "body", [[], ["a"], "text", b"bytes", 1, None, 2.5, ("tuple",), {"a"}],
    ids=lambda b: type(b).__name__,
)
def test_non_map_body_is_bad_input(tmp_path, body) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        before = dir_digest(path)
        for call in (
            lambda: s.append("a", "Note", body),
            lambda: s.append("a", "Note", body, durable=False),
        ):
            with pytest.raises(BadInput) as info:
                call()
            assert info.value.exit_code == 2
            assert "map" in str(info.value)
        assert dir_digest(path) == before
        assert s.append("a", "Note", {"ok": True}) == 1


@pytest.mark.parametrize(
    "body",
    [{"big": 2**64}, {"small": -(2**63) - 1}, {"obj": object()}, {"set": {1, 2}},
     {"nested": [{"deep": 2**70}]}, {"surrogate": "\ud800"}],
    ids=["big", "small", "object", "set", "nested-big", "surrogate"],
)
def test_unencodable_body_is_bad_input(tmp_path, body) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        with pytest.raises(BadInput) as info:
            s.append("a", "Note", body)
        assert info.value.exit_code == 2
        assert s.append("a", "Note", {}) == 1
    assert [e.lsn for e in StoreReader(path).events()] == [1]


async def _append_async(s, body):
    return await s.append_async("a", "Note", body)


def test_async_append_checks_input_too(tmp_path) -> None:
    import asyncio

    with Store(tmp_path / "s", settings=SMALL) as s:
        with pytest.raises(BadInput):
            asyncio.run(_append_async(s, ["not", "a", "map"]))
        assert asyncio.run(_append_async(s, {"k": "v"})) == 1
    assert list(StoreReader(tmp_path / "s").events()) == [Event(1, "a", 0, None, "Note",
                                                                {"k": "v"})]
