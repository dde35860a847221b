"""Recovery: damaged segments never serve a wrong event.

Two pristine stores are built once per module, each with several 64 KiB segments
and many batches (a batch is what one ``fdatasync`` covers, and starts with a
batch marker):

* ``closed``: the writer called ``Store.close``, which seals the tail with a final
  marker;
* ``unsealed``: a copy of the directory taken while the writer was still open
  after a flush, i.e. what a crash right after an acknowledged batch leaves.

Each test copies one, damages the copy and reads it.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SMALL, Model, copy_store, dir_digest, flip_bit, segments
from hypothesis import given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder.codec import Event
from stenograph.recorder.errors import BadInput, CorruptLog
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import HEADER_SIZE
from stenograph.recorder.store import Store

TRAJS = ["alpha", "beta", "gamma", "delta"]


@dataclass
class Frame:
    off: int
    end: int
    item: Event | int  # int: a batch marker


@dataclass(repr=False)
class Pristine:
    path: Path
    model: Model
    names: list[str]
    frames: dict[str, list[Frame]]
    sealed: bool

    def __repr__(self) -> str:
        return f"Pristine({self.path.name}, {len(self.model.events)} events, {self.names})"

    @property
    def last(self) -> str:
        return self.names[-1]

    def data_end(self, name: str) -> int:
        fr = self.frames[name]
        return fr[-1].end if fr else HEADER_SIZE

    def frame_at(self, name: str, offset: int) -> Frame | None:
        for f in self.frames[name]:
            if f.off <= offset < f.end:
                return f
        return None

    def events_before(self, name: str, offset: int) -> list[Event]:
        """Every event in segments before ``name``, and in ``name`` wholly before ``offset``."""
        out: list[Event] = []
        for n in self.names:
            for f in self.frames[n]:
                if isinstance(f.item, Event) and (n != name or f.end <= offset):
                    out.append(f.item)
            if n == name:
                return out
        raise AssertionError(name)

    def strict_limit(self) -> int:
        """Damage in the last segment before this offset is provably acknowledged data.

        Closed store: everything before the seal marker. Unsealed: everything before
        the final batch's marker (a later marker proves the earlier batches synced).
        """
        markers = [f.off for f in self.frames[self.last] if isinstance(f.item, int)]
        assert len(markers) >= 2
        return markers[-1]


def _build(path: Path, seed: int, *, close: bool, copy_to: Path | None = None) -> Pristine:
    rng = random.Random(seed)
    model = Model()
    store = Store(path, settings=SMALL)
    batch = 0
    while len(segments(path)) < 3 or batch < 60:
        for j in range(rng.randint(1, 5)):
            traj = rng.choice(TRAJS)
            body = {"batch": batch, "j": j, "pad": "p" * rng.randint(0, 1500),
                    "n": rng.randint(-(2**40), 2**40)}
            lsn = store.append(traj, "Note", body, durable=False)
            model.add(lsn, traj, "Note", body)
        store.flush()
        batch += 1
    if copy_to is not None:
        copy_store(path, copy_to)  # the writer is still open: no seal in the copy
        path = copy_to
    store.close()
    names = [p.name for p in segments(path)]
    frames: dict[str, list[Frame]] = {n: [] for n in names}
    for seg, off, size, item in StoreReader(path).frames():
        frames[seg.name].append(Frame(off, off + size, item))
    assert [f.item for n in names for f in frames[n] if isinstance(f.item, Event)] == model.events
    return Pristine(path, model, names, frames, sealed=close and copy_to is None)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Pristine]:
    base = tmp_path_factory.mktemp("pristine")
    closed = _build(base / "closed", 1, close=True)
    unsealed = _build(base / "writer", 2, close=True, copy_to=base / "unsealed")
    # The layout the tests rely on: a seal only in the closed store, several batches.
    assert isinstance(closed.frames[closed.last][-1].item, int)
    assert isinstance(unsealed.frames[unsealed.last][-1].item, Event)
    for p in (closed, unsealed):
        assert len(p.names) >= 3
        assert sum(isinstance(f.item, int) for f in p.frames[p.last]) >= 3
    return {"closed": closed, "unsealed": unsealed}


def read_all(path: Path) -> tuple[list[Event], StoreReader, BaseException | None]:
    """Read until the end or the first error; keep what was yielded before it."""
    reader = StoreReader(path)
    got: list[Event] = []
    try:
        for ev in reader.events():
            got.append(ev)
    except (CorruptLog, BadInput) as exc:
        return got, reader, exc
    return got, reader, None


def assert_no_wrong_event(got: list[Event], model: Model) -> None:
    assert got == model.events[: len(got)], "served an event that was never written"


def check_appendable(path: Path, survivors: list[Event], model: Model) -> None:
    """The store opens clean after recovery and continues the survivors' chains."""
    expect = model.truncated(len(survivors))
    with Store(path, settings=SMALL) as s:
        lsn = s.append("alpha", "Note", {"after": "recovery"})
        assert lsn == len(survivors) + 1
    expect.add(lsn, "alpha", "Note", {"after": "recovery"})
    assert list(StoreReader(path).events()) == expect.events
    with Store(path, settings=SMALL) as s:
        assert s.recovered is None


# -- truncation ----------------------------------------------------------------------


@settings(max_examples=examples(40), deadline=None)
@given(which=st.sampled_from(["closed", "unsealed"]), data=st.data())
def test_truncated_last_segment_keeps_every_whole_event(pristine, scratch, which, data) -> None:
    p = pristine[which]
    cut = data.draw(st.integers(HEADER_SIZE, p.data_end(p.last) + 40), label="cut")
    path = copy_store(p.path, scratch())
    seg = path / "wal" / p.last
    original = seg.read_bytes()
    with open(seg, "r+b") as f:
        f.truncate(cut)

    before = dir_digest(path)
    got, reader, exc = read_all(path)
    assert exc is None, f"a torn tail is not corruption: {exc}"
    assert dir_digest(path) == before, "readers never modify the store"
    survivors = p.events_before(p.last, cut)
    assert got == survivors

    boundary = max([f.end for f in p.frames[p.last] if f.end <= cut], default=HEADER_SIZE)
    garbage = original[boundary:cut].rstrip(b"\0")
    if garbage:
        assert reader.torn is not None
        assert (Path(reader.torn.segment).name, reader.torn.offset, reader.torn.dropped) == (
            p.last, boundary, len(garbage))
    else:
        assert reader.torn is None

    with Store(path, settings=SMALL) as s:
        if garbage:
            assert s.recovered is not None
            assert s.recovered.dropped == len(garbage) > 0
            assert s.recovered.offset == boundary
        else:
            assert s.recovered is None
        assert seg.read_bytes()[boundary:cut] == bytes(cut - boundary), "torn tail not cut"
    check_appendable(path, survivors, p.model)
    shutil.rmtree(path)


def test_truncated_header_is_refused_cleanly(pristine, tmp_path) -> None:
    """A last segment shorter than its header is not a torn frame: refuse, do not guess."""
    for cut in (0, 1, HEADER_SIZE - 1):
        path = copy_store(pristine["closed"].path, tmp_path / f"c{cut}")
        with open(path / "wal" / pristine["closed"].last, "r+b") as f:
            f.truncate(cut)
        before = dir_digest(path)
        with pytest.raises(BadInput):
            list(StoreReader(path).events())
        with pytest.raises(BadInput):
            Store(path, settings=SMALL)
        assert dir_digest(path) == before


# -- bit flips -----------------------------------------------------------------------


@settings(max_examples=examples(120), deadline=None)
@given(which=st.sampled_from(["closed", "unsealed"]), data=st.data())
def test_bit_flip_never_serves_a_wrong_event(pristine, scratch, which, data) -> None:
    p = pristine[which]
    name = data.draw(st.sampled_from(p.names), label="segment")
    size = SMALL.segment_bytes
    offset = data.draw(
        st.integers(0, p.data_end(name) + 64) | st.integers(0, size - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    path = copy_store(p.path, scratch())
    seg = path / "wal" / name
    flip_bit(seg, offset, bit)

    got, reader, exc = read_all(path)
    assert_no_wrong_event(got, p.model)
    before = dir_digest(path)

    if offset < HEADER_SIZE:
        # The header has no checksum: damage is refused (as corruption or as a file
        # that is not what it claims), or is in a field that does not change the events.
        if exc is None:
            assert got == p.model.events
    else:
        hit = p.frame_at(name, offset)
        damage_at = hit.off if hit is not None else p.data_end(name)
        strict = name != p.last or damage_at < p.strict_limit()
        assert got == p.events_before(name, damage_at)
        if strict:
            assert isinstance(exc, CorruptLog), f"flip at {name}@{offset} not detected: {exc}"
            assert Path(exc.segment).name == name
            assert exc.offset == damage_at
            assert exc.exit_code == 3
        else:
            assert exc is None
            assert reader.torn is not None
            assert reader.torn.offset == damage_at
            assert reader.torn.dropped == len(seg.read_bytes()[damage_at:].rstrip(b"\0"))

    if exc is not None:
        with pytest.raises(type(exc)):
            Store(path, settings=SMALL)
        assert dir_digest(path) == before, "a refused open must not touch the store"
    else:
        with Store(path, settings=SMALL) as s:
            if reader.torn is None:
                assert s.recovered is None
            else:
                assert s.recovered is not None
                assert (s.recovered.offset, s.recovered.dropped) == (
                    reader.torn.offset, reader.torn.dropped)
        check_appendable(path, got, p.model)
    shutil.rmtree(path)


def _flip_mid_frame(path: Path, name: str, f: Frame) -> int:
    offset = (f.off + f.end) // 2
    flip_bit(path / "wal" / name, offset, 3)
    return offset


def test_flip_in_non_last_segment_is_corrupt(pristine, tmp_path) -> None:
    for which, p in pristine.items():
        for name in p.names[:-1]:
            for f in (p.frames[name][1], p.frames[name][-1]):
                path = copy_store(p.path, tmp_path / f"{which}-{name}-{f.off}")
                _flip_mid_frame(path, name, f)
                with pytest.raises(CorruptLog) as info:
                    list(StoreReader(path).events())
                assert Path(info.value.segment).name == name
                assert info.value.offset == f.off
                assert f"@ {f.off}" in str(info.value)
                before = dir_digest(path)
                with pytest.raises(CorruptLog):
                    Store(path, settings=SMALL)
                assert dir_digest(path) == before


def test_flip_in_earlier_batch_of_last_segment_is_corrupt(pristine, tmp_path) -> None:
    """A later batch marker proves the damaged batch was acknowledged: refuse it."""
    p = pristine["unsealed"]
    final_marker = p.strict_limit()
    earlier = [f for f in p.frames[p.last] if f.end <= final_marker]
    for f in (earlier[0], earlier[len(earlier) // 2], earlier[-1]):
        path = copy_store(p.path, tmp_path / f"f{f.off}")
        _flip_mid_frame(path, p.last, f)
        got, _reader, exc = read_all(path)
        assert isinstance(exc, CorruptLog)
        assert (Path(exc.segment).name, exc.offset) == (p.last, f.off)
        assert got == p.events_before(p.last, f.off)


def test_flip_in_final_batch_is_cut_as_torn_write(pristine, tmp_path) -> None:
    """Damage in the final batch of an unsealed log cannot be told from a torn write.

    Nothing on disk follows the final batch, so nothing proves its ``fdatasync``
    returned: a crash in the middle of writing it leaves exactly this picture.
    Recovery therefore cuts the log at the damaged frame and reports the cut in
    ``Store.recovered`` instead of refusing the store. (Once the store is closed
    cleanly, the seal marker proves the final batch too; see the next test.)
    """
    p = pristine["unsealed"]
    final = [f for f in p.frames[p.last] if f.off >= p.strict_limit()]
    assert isinstance(final[0].item, int) and len(final) >= 2
    for f in final:
        path = copy_store(p.path, tmp_path / f"f{f.off}")
        _flip_mid_frame(path, p.last, f)
        got, reader, exc = read_all(path)
        assert exc is None
        assert got == p.events_before(p.last, f.off)
        assert reader.torn is not None and reader.torn.offset == f.off
        with Store(path, settings=SMALL) as s:
            assert s.recovered is not None
            assert s.recovered.offset == f.off
            assert s.recovered.dropped == p.data_end(p.last) - f.off > 0
        check_appendable(path, got, p.model)


def test_seal_makes_final_batch_strict_after_clean_close(pristine, tmp_path) -> None:
    p = pristine["closed"]
    seal = p.frames[p.last][-1]
    assert isinstance(seal.item, int)
    final = [f for f in p.frames[p.last] if f.off >= p.frames[p.last][-2].off
             or f.off >= [g.off for g in p.frames[p.last] if isinstance(g.item, int)][-2]]
    final = [f for f in final if f is not seal]
    assert final and any(isinstance(f.item, Event) for f in final)
    for f in final:
        path = copy_store(p.path, tmp_path / f"f{f.off}")
        _flip_mid_frame(path, p.last, f)
        with pytest.raises(CorruptLog) as info:
            list(StoreReader(path).events())
        assert (Path(info.value.segment).name, info.value.offset) == (p.last, f.off)
        before = dir_digest(path)
        with pytest.raises(CorruptLog):
            Store(path, settings=SMALL)
        assert dir_digest(path) == before


def test_damaged_seal_is_only_a_torn_tail(pristine, tmp_path) -> None:
    p = pristine["closed"]
    seal = p.frames[p.last][-1]
    path = copy_store(p.path, tmp_path / "s")
    _flip_mid_frame(path, p.last, seal)
    got, reader, exc = read_all(path)
    assert exc is None and got == p.model.events
    assert reader.torn is not None and reader.torn.offset == seal.off
    check_appendable(path, got, p.model)


def test_reopen_after_clean_close_reports_nothing(pristine, tmp_path) -> None:
    path = copy_store(pristine["closed"].path, tmp_path / "s")
    with Store(path, settings=SMALL) as s:
        assert s.recovered is None
        assert s.events() == pristine["closed"].model.events
