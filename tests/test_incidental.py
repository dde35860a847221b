"""Incidental values in requests (``interpose.incidental``): masked only when they came
from the run's own clocks and entropy, so build replay neither fails on a new build's
timestamps and ids nor hides a real change. Property tests over times and bytes."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from email.utils import format_datetime

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stenograph.interpose.incidental import Incidentals, differences, incidental_only, mask

T0 = 1_796_000_000.0  # late 2026
times = st.floats(min_value=T0, max_value=T0 + 30 * 86400, allow_nan=False)
RENDER = [
    lambda t: datetime.fromtimestamp(t, UTC).isoformat(),
    lambda t: datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds"),
    lambda t: datetime.fromtimestamp(t).isoformat(timespec="minutes"),  # naive local
    lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S"),
    lambda t: time.ctime(t),
    lambda t: format_datetime(datetime.fromtimestamp(t, UTC)),
    lambda t: str(int(t)),
    lambda t: str(int(t * 1000)),
    lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d"),
    lambda t: datetime.fromtimestamp(t, UTC).strftime("observed %H:%M:%S UTC"),
    lambda t: datetime.fromtimestamp(t).strftime("%H:%M:%S"),
]
formats = st.sampled_from(range(len(RENDER)))
prose = st.text(alphabet="abcdefghij ,.:;!?()[]{}\"'\n", max_size=60)


@settings(max_examples=200, deadline=None)
@given(t=times, later=st.floats(min_value=0.0, max_value=3600.0), f=formats,
       before=prose, after=prose)
def test_a_time_the_run_read_is_masked_and_the_new_builds_own_matches_it(
        t: float, later: float, f: int, before: str, after: str) -> None:
    inc = Incidentals([t - 5, t, t + 5], b"")
    # (glued to letters a-f, digits read as hex: "a1796000000000aa" is an id, not a time)
    rec = f"{before} {RENDER[f](t)} {after}"
    new = f"{before} {RENDER[f](t + later)} {after}"
    mr, n = mask(rec, inc, recorded=True)
    assert n >= 1 and RENDER[f](t) not in mr
    assert differences(rec, new, inc) in ((0,) if rec == new else (1,))
    assert incidental_only(rec, new, inc) or rec == new


@settings(max_examples=100, deadline=None)
@given(t=times, f=formats, mid=prose)
def test_values_shifted_by_one_read_match_in_place(t: float, f: int, mid: str) -> None:
    """An extra clock read before the prompt is made: each timestamp the prompt holds is
    the next recorded one, and one of them equals another's recorded value."""
    reads = [t, t + 1, t + 2]
    inc = Incidentals(reads, b"")
    rec = f"start {RENDER[f](reads[0])} {mid} end {RENDER[f](reads[1])}"
    new = f"start {RENDER[f](reads[1])} {mid} end {RENDER[f](reads[2])}"
    assert differences(rec, new, inc) in ((0,) if rec == new else (1, 2))
    assert differences(rec, new.replace(" end ", " END "), inc) is None


def test_an_id_the_model_handed_back_is_compared_as_it_is() -> None:
    """A tool-call id from the recorded reply is in both requests: left alone, and a
    time beside it still matches in place."""
    inc = Incidentals([T0], b"")
    rec = f'{{"id": "call_670e1401f0da91194a46f715", "at": "{RENDER[0](T0)}"}}'
    new = f'{{"id": "call_670e1401f0da91194a46f715", "at": "{RENDER[0](T0 + 3)}"}}'
    assert differences(rec, new, inc) == 1
    other = new.replace("670e1401f0da91194a46f715", "123456789abcdef012345678")
    assert differences(rec, other, inc) is None  # the recorded id is no value the run read


@settings(max_examples=100, deadline=None)
@given(t=times, f=formats, before=prose)
def test_a_time_the_run_never_read_is_compared_as_it_is(t: float, f: int, before: str) -> None:
    inc = Incidentals([t], b"")
    fixed = T0 - 400 * 86400 - 3 * 3600 - 17  # a date in a template, a year before the run
    text = f"{before}{RENDER[f](fixed)}"
    assert mask(text, inc, recorded=True) == (text, 0)
    # and a changed constant beside a masked time is still a change
    assert not incidental_only(f"{RENDER[f](t)} budget 10", f"{RENDER[f](t)} budget 20", inc)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(min_size=16, max_size=16), other=st.binary(min_size=16, max_size=16),
       pad=st.binary(max_size=64))
@example(raw=b"\x10\x00\x00\x00\x00\x00\n" + bytes(9), other=bytes(16), pad=b"")  # hex
# whose first 13 digits look like epoch milliseconds
def test_a_uuid_or_hex_from_the_runs_entropy_is_masked_and_no_other(
        raw: bytes, other: bytes, pad: bytes) -> None:
    inc = Incidentals([T0], pad + raw + pad)
    u = str(uuid.UUID(bytes=raw, version=4))
    assert mask(f"run {u} ok", inc, recorded=True)[0] == "run «uuid» ok"
    assert mask(f"id {raw.hex()}", inc, recorded=True)[0] == "id «hex»"
    if other[:6] not in inc.entropy:
        v = str(uuid.UUID(bytes=other, version=4))
        assert mask(f"run {v} ok", inc, recorded=True)[0] == f"run {v} ok"
    new = str(uuid.uuid4())
    assert mask(f"run {new} ok", inc, recorded=False)[0] == "run «uuid» ok"


@given(text=prose)
def test_text_without_tokens_is_left_alone(text: str) -> None:
    inc = Incidentals([T0], b"\x00" * 32)
    assert mask(text, inc, recorded=True) == (text, 0)
    assert mask(text, inc, recorded=False) == (text, 0)


def test_uuid1_is_judged_by_its_time() -> None:
    now = time.time()
    u1 = uuid.uuid1()
    inc = Incidentals([now], b"")
    assert mask(str(u1), inc, recorded=True)[0] == "«uuid»"
    assert mask(str(u1), Incidentals([now - 10 * 86400], b""), recorded=True)[1] == 0
