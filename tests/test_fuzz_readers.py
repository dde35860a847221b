"""Fuzz every reader: whatever the bytes, it returns or raises a ``StenographError``.

Targets: the codec (``decode_payload``), the frame scanner over one segment, a
whole store (``StoreReader`` and the writer's open), the ``.steno`` reader, and
``prepare_tape`` fed the events decoded from fuzzed files. A ``TypeError``,
``KeyError``, ``RecursionError`` or any other exception is a bug: the CLI would
print a traceback instead of one line.

Inputs start from real files (so mutations reach deep into valid structure) and
are damaged by byte overwrites, insertions, deletions, truncation and splices of
hostile msgpack (deep nesting, unhashable keys, extension types). The budget is
small by default; ``STENO_FUZZ_EXAMPLES=N`` (``make soak``) runs N per target.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgpack
import pytest
from conftest import SMALL, segments
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder import chunks, segment
from stenograph.recorder.blobs import BlobStore
from stenograph.recorder.codec import (
    Event,
    decode_payload,
    encode_event,
    envelope,
    frame,
    marker,
    pack_body,
    salted_marker,
)
from stenograph.recorder.errors import StenographError
from stenograph.recorder.kinds import FORMAT_VERSION
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import HEADER_SIZE, FrameScanner
from stenograph.recorder.store import Store
from stenograph.recorder.tape import RECORD, prepare_tape
from stenograph.recorder.trajfile import read_trajectory, write_trajectory

EXAMPLES = int(os.environ.get("STENO_FUZZ_EXAMPLES", "0")) or None
fuzz = settings(
    max_examples=EXAMPLES or examples(300), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)

HOSTILE = [
    b"\x91" * 100_000 + b"\x90",  # nested far past the unpacker's stack
    b"\x91" * 600 + b"\x90",  # deep enough to overflow a recursive walk
    b"\x81\x90\x01", b"\x81\x80\x01",  # unhashable map keys
    b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x01\x05a",  # timestamp, ext
    b"\xa2\xff\xfe", b"\xc1", b"\xdd\xff\xff\xff\xff",  # bad utf-8, never-used, huge array
    b"\x92\x01\xc4\x08" + bytes(8),  # a salted marker with a wrong tag
    b"\x91\xc3", b"\x96\xc3\xa1t\x00\xc0\xa4Note\x80",  # bools where ints belong
    msgpack.packb({"traj": ["not", "str"]}), msgpack.packb({"blob": "0" * 64, "data": 1}),
]
hostile_payload = st.sampled_from(HOSTILE) | st.builds(
    lambda body: envelope(1, "t", 0, None, "Note", body), st.sampled_from(HOSTILE))


def tape_bytes(n: int) -> bytes:
    """``n`` well-formed clock records, so mutations reach ``prepare_tape``'s parser."""
    return b"".join(RECORD.pack(1, 1, 0, 24) + bytes(range(i, i + 24)) for i in range(n))


def sample_events() -> list[Event]:
    ref = {"$blob": "a" * 64, "size": 3}
    return [
        Event(1, "t", 0, None, "RunStarted", {"argv": ["x"], "env": {}}),
        Event(2, "t", 1, 1, "TapeChunk", chunks.encode("0", 0, tape_bytes(3))),  # zstd
        Event(3, "t", 2, 2, "TapeChunk", {"proc": "0.1", "thread": 2, "data": tape_bytes(2)}),
        Event(4, "t", 3, 3, "ToolResult", {"out": ref, "n": [1, 2.5, None, b"\x00"]}),
        Event(5, "t", 4, 4, "RunEnded", {"status": 0}),
    ]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes | Path]:
    """Real inputs to mutate: a store (two segments) and a .steno with a blob."""
    base = tmp_path_factory.mktemp("fuzzseeds")
    store = base / "store"
    with Store(store, settings=SMALL) as s:
        for i in range(40):
            s.append("t" if i % 3 else "u", "TapeChunk",
                     {"proc": "0", "thread": i % 2, "data": tape_bytes(1 + i % 4),
                      "pad": b"p" * (i * 397 % 4000)}, durable=i % 4 == 0)
    assert len(segments(store)) >= 2
    blobs = BlobStore(base / "blobs")
    sha = blobs.put(b"abc").sha256
    evs = sample_events()
    evs[3] = Event(4, "t", 3, 3, "ToolResult", {"out": {"$blob": sha, "size": 3}})
    steno = base / "t.steno"
    write_trajectory(steno, "t", evs, blobs=blobs)
    return {"store": store, "steno": steno.read_bytes()}


@st.composite
def mutated(draw: st.DrawFn, data: bytes, keep_header: int = 0) -> bytes:
    """``data`` with a few random edits (after the first ``keep_header`` bytes, mostly)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        lo = keep_header if draw(st.integers(0, 9)) else 0
        at = draw(st.integers(lo, max(lo, len(out))))
        how = draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate", "splice"]))
        if how == "set":
            chunk = draw(st.binary(min_size=1, max_size=16))
            out[at:at + len(chunk)] = chunk
        elif how == "flip" and at < len(out):
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif how == "delete":
            del out[at:at + draw(st.integers(1, 64))]
        elif how == "truncate":
            del out[at:]
        else:
            out[at:at] = frame(draw(hostile_payload))
    return bytes(out)


def _total(call, *args, **kwargs):  # type: ignore[no-untyped-def]
    """Run a reader; only a StenographError may escape it."""
    try:
        return call(*args, **kwargs)
    except StenographError as exc:
        assert str(exc).strip() and "\n" not in exc.what, "an error is one line"
        return None


def _consume(events: list[Event], tape: Path) -> None:
    """What ``log cat`` and ``replay`` do with decoded events."""
    for ev in events:
        json.dumps(ev.to_json(), ensure_ascii=False)
    _total(prepare_tape, events, tape)
    shutil.rmtree(tape, ignore_errors=True)


# -- the codec ------------------------------------------------------------------------


@fuzz
@given(payload=st.binary(max_size=200) | hostile_payload
       | st.builds(lambda ev: encode_event(ev)[8:], st.sampled_from(sample_events()))
       .flatmap(lambda p: mutated(p)),
       version=st.sampled_from([FORMAT_VERSION, FORMAT_VERSION + 1]))
def test_fuzz_decode_payload(payload: bytes, version: int) -> None:
    try:
        item = decode_payload(payload, version)
    except StenographError:
        return
    if isinstance(item, Event):
        json.dumps(item.to_json())
        pack_body(item.body)  # what decodes can be written again


# -- one segment, through the frame scanner ---------------------------------------------


@fuzz
@given(data=st.data(), torn_ok=st.booleans(), salted=st.booleans())
def test_fuzz_frame_scanner(data: st.DataObject, torn_ok: bool, salted: bool) -> None:
    salt = bytes(range(16)) if salted else None
    parts = [b"\0" * HEADER_SIZE]
    for i, ev in enumerate(sample_events()):
        at = sum(map(len, parts))
        parts.append(salted_marker(ev.lsn, salt, 1, at) if salt else marker(ev.lsn))
        parts.append(encode_event(ev) if i % 2 else frame(data.draw(hostile_payload)))
    buf = data.draw(mutated(b"".join(parts) + bytes(200), HEADER_SIZE), label="segment")
    scanner = FrameScanner(buf, "seg", torn_ok=torn_ok, salt=salt, number=1)
    _total(lambda: [x for x in scanner])


# -- a whole store: reader, then the writer's open --------------------------------------


@fuzz
@given(data=st.data())
def test_fuzz_store(seeds, scratch, data: st.DataObject) -> None:
    path = scratch()
    shutil.copytree(seeds["store"], path)
    segs = segments(path)
    for seg in data.draw(st.lists(st.sampled_from(segs), min_size=1, max_size=2, unique=True)):
        original = seg.read_bytes()
        end = len(original.rstrip(b"\0")) + 64
        seg.write_bytes(data.draw(mutated(original[:end], 8), label=seg.name) + original[end:])
    got = _total(lambda: list(StoreReader(path).events()))
    if got is not None:
        _consume(got, path / "tape")
    store = _total(Store, path, settings=SMALL)
    if store is not None:
        with store:
            store.append("after", "Note", {})
    shutil.rmtree(path)


# -- .steno files, and the tape made from them ------------------------------------------


@fuzz
@given(data=st.data())
def test_fuzz_trajectory_file(seeds, scratch, data: st.DataObject) -> None:
    path = scratch()
    path.mkdir()
    f = path / "x.steno"
    f.write_bytes(data.draw(mutated(seeds["steno"], 8), label="file"))
    tf = _total(read_trajectory, f)
    if tf is not None:
        _consume(tf.events, path / "tape")
        was, segment.LAZY_OVER = segment.LAZY_OVER, 0  # every chunk read when used
        try:
            lazy = _total(read_trajectory, f, lazy_tape=True)
        finally:
            segment.LAZY_OVER = was
        assert lazy is not None and len(lazy.events) == len(tf.events)
        _total(prepare_tape, lazy.events, path / "tape-lazy")
        for sha in tf.header.get("external_blobs", []):
            _total(tf.blobs.__getitem__, sha)
    shutil.rmtree(path)


@fuzz
@given(bodies=st.lists(st.fixed_dictionaries(
    {"proc": st.sampled_from(["0", "0.1", "1", "../x", 7, None]),
     "thread": st.integers(-1, 2**40) | st.none() | st.text(max_size=3),
     "data": st.binary(max_size=40) | st.builds(tape_bytes, st.integers(0, 3))},
), max_size=4), zstd=st.lists(st.tuples(st.binary(max_size=40) | st.builds(
    lambda n: chunks.encode("0", 0, tape_bytes(n))["zdata"], st.integers(3, 9)),
    st.integers(-1, 1 << 27)), max_size=3))
def test_fuzz_prepare_tape(scratch, bodies: list[dict[str, object]],
                           zstd: list[tuple[bytes, int]]) -> None:
    bodies = bodies + [{"proc": "0", "thread": 0, "zdata": z, "size": n} for z, n in zstd]
    events = [Event(i + 1, "t", i, i or None, "TapeChunk", b) for i, b in enumerate(bodies)]
    tape = scratch()
    _total(prepare_tape, events, tape)
    shutil.rmtree(tape, ignore_errors=True)


def test_prepare_tape_longest_process_path(tmp_path) -> None:
    proc = "0" + ".123456789" * 64
    ev = Event(1, "t", 0, None, "TapeChunk", {"proc": proc, "thread": 0, "data": tape_bytes(1)})
    _total(prepare_tape, [ev], tmp_path / "tape")


def test_seeds_are_valid(seeds, tmp_path) -> None:
    """The unmutated inputs read back, so mutations start from real structure."""
    assert len(list(StoreReader(seeds["store"]).events())) == 40
    f = tmp_path / "x.steno"
    f.write_bytes(seeds["steno"])
    tf = read_trajectory(f)
    assert len(tf.events) == 5 and len(tf.blobs) == 1
    assert prepare_tape(tf.events, tmp_path / "tape").records == 5
