"""Crashes: power loss after the last completed fdatasync, and real SIGKILLs.

Power loss is simulated exactly: a writer runs with ``SegmentWriter.sync``
wrapped so that, each time an ``fdatasync`` returns, the synced bytes of the tail
segment are copied. A crash between sync ``i`` and sync ``i + 1`` leaves sync
``i``'s image plus any part of the bytes written after it (a prefix, a prefix
followed by garbage, or an arbitrary subset of 4 KiB pages), and possibly a
freshly created segment. Every event acknowledged by sync ``i`` must survive and
nothing that was not written may be served.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SEGMENT_BYTES, SMALL, Model, segments
from hypothesis import given, settings
from hypothesis import strategies as st
from scale import examples

from stenograph.recorder.errors import StoreLocked
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import HEADER_SIZE, SegmentWriter
from stenograph.recorder.store import Store

PAGE = 4096


@dataclass
class Snap:
    tail: str
    content: bytes
    acked: int  # highest LSN whose durable append may have returned by now


@dataclass
class Run:
    path: Path
    model: Model
    snaps: list[Snap]
    final: dict[str, bytes]

    def __repr__(self) -> str:
        return f"Run({len(self.model.events)} events, {len(self.snaps)} syncs)"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """One writer session with every completed sync recorded."""
    path = tmp_path_factory.mktemp("crash") / "store"
    snaps: list[Snap] = []
    acked = [0]
    orig_sync = SegmentWriter.sync
    orig_write_batch = Store._write_batch

    def sync(self: SegmentWriter) -> None:
        orig_sync(self)
        snaps.append(Snap(self.path.name, self.path.read_bytes(), acked[0]))

    def write_batch(self, frames, nbytes, first, last):
        orig_write_batch(self, frames, nbytes, first, last)
        # The batch's sync has returned: everything up to ``last`` may now be
        # acknowledged. The snapshot taken by that sync already holds it.
        acked[0] = last
        snaps[-1].acked = last

    rng = random.Random(7)
    model = Model()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SegmentWriter, "sync", sync)
        mp.setattr(Store, "_write_batch", write_batch)
        store = Store(path, settings=SMALL)
        (first,) = segments(path)
        snaps.append(Snap(first.name, first.read_bytes(), 0))  # before any append
        while len(segments(path)) < 4 or len(snaps) < 80:
            burst = rng.choice([0, 0, 1, 3])
            for k in range(burst + 1):
                traj = rng.choice(["t0", "t1", "t2"])
                body = {"n": len(model.events), "pad": "q" * rng.randint(0, 2500)}
                lsn = store.append(traj, "Note", body, durable=k == burst)
                model.add(lsn, traj, "Note", body)
            assert lsn <= acked[0], "append returned before a sync covered it"
        store.close()
    assert acked[0] == len(model.events)
    final = {p.name: p.read_bytes() for p in segments(path)}
    return Run(path, model, snaps, final)


def _crash_image(run: Run, i: int, mode: str, frac: float, rnd: random.Random) -> dict[str, bytes]:
    """Segment files as a power loss between sync ``i`` and sync ``i + 1`` leaves them."""
    now, nxt = run.snaps[i], run.snaps[i + 1]
    files = {name: data for name, data in run.final.items() if name < now.tail}
    files[now.tail] = now.content
    if nxt.tail == now.tail:
        base = now.content
    else:  # rotation: the new segment's header was synced before its first write
        if mode == "no-new-segment":
            return files
        base = nxt.content[:HEADER_SIZE] + bytes(len(nxt.content) - HEADER_SIZE)
    new = nxt.content
    lo = next(k for k in range(len(new)) if new[k] != base[k])
    hi = len(new.rstrip(b"\0"))
    assert lo < hi
    out = bytearray(base)
    cut = lo + int(frac * (hi - lo))
    if mode in ("prefix", "no-new-segment"):
        out[lo:cut] = new[lo:cut]
    elif mode == "garbage":
        out[lo:cut] = new[lo:cut]
        junk_end = min(len(out), hi + rnd.randint(0, 64))
        out[cut:junk_end] = rnd.randbytes(junk_end - cut)
    elif mode == "pages":
        for page in range(lo // PAGE * PAGE, hi, PAGE):
            if rnd.random() < frac:
                out[page : page + PAGE] = new[page : page + PAGE]
    else:  # pragma: no cover
        raise AssertionError(mode)
    files[nxt.tail] = bytes(out)
    return files


@settings(max_examples=examples(100), deadline=None)
@given(
    data=st.data(),
    mode=st.sampled_from(["prefix", "garbage", "pages", "no-new-segment"]),
    frac=st.floats(0, 1),
    seed=st.integers(0, 2**32),
    leftover_tmp=st.booleans(),
)
def test_power_loss_keeps_acknowledged_events(run, scratch, data, mode, frac, seed,
                                              leftover_tmp) -> None:
    i = data.draw(st.integers(0, len(run.snaps) - 2), label="crash after sync")
    rnd = random.Random(seed)
    files = _crash_image(run, i, mode, frac, rnd)
    path = scratch()
    (path / "wal").mkdir(parents=True)
    for sub in ("blobs", "checkpoints"):
        (path / sub).mkdir()
    (path / "STENOGRAPH-STORE").write_bytes((run.path / "STENOGRAPH-STORE").read_bytes())
    for name, content in files.items():
        (path / "wal" / name).write_bytes(content)
    if leftover_tmp:  # a spare segment that was being zero-filled
        (path / "wal" / "spare.tmp").write_bytes(rnd.randbytes(1000))

    acked = run.snaps[i].acked
    with Store(path, settings=SMALL) as s:
        got = s.events()
        assert got == run.model.events[: len(got)], "served an event that was never written"
        assert len(got) >= acked, f"lost acknowledged events {len(got) + 1}..{acked}"
        assert not (path / "wal" / "spare.tmp").exists()
        lsn = s.append("t0", "Note", {"after": "crash"})
        assert lsn == len(got) + 1
    expect = run.model.truncated(len(got))
    expect.add(lsn, "t0", "Note", {"after": "crash"})
    assert list(StoreReader(path).events()) == expect.events
    shutil.rmtree(path)


def test_crash_images_cover_rotation_and_batches(run) -> None:
    """The recorded run really exercises what the property test relies on."""
    tails = [s.tail for s in run.snaps]
    assert len(set(tails)) >= 4, "several segment rotations"
    acked = [s.acked for s in run.snaps]
    assert acked == sorted(acked)
    assert any(b - a > 1 for a, b in itertools.pairwise(acked)), "multi-event batch"
    assert all(len(s.content) >= SEGMENT_BYTES for s in run.snaps)


# -- real SIGKILL ---------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from stenograph.recorder.store import Store, StoreSettings

    path, rnd = sys.argv[1], int(sys.argv[2])
    store = Store(path, settings=StoreSettings(segment_bytes=64 * 1024))
    os.write(1, b"ready\\n")

    def producer(t):
        traj = f"r{rnd}-t{t}"
        i = 0
        while True:
            body = {"round": rnd, "thread": t, "i": i, "pad": "z" * ((i * 389 + t) % 1500)}
            lsn = store.append(traj, "Note", body)
            os.write(1, f"{lsn} {traj} {i}\\n".encode())  # one atomic pipe write
            i += 1

    for t in range(4):
        threading.Thread(target=producer, args=(t,), daemon=True).start()
    threading.Event().wait()
    """
)


def _expected_body(traj: str, i: int) -> dict:
    rnd, t = (int(x[1:]) for x in traj.split("-"))
    return {"round": rnd, "thread": t, "i": i, "pad": "z" * ((i * 389 + t) % 1500)}


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_event(tmp_path) -> None:
    path = tmp_path / "store"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    printed: dict[int, tuple[str, int]] = {}
    for rnd in range(5):
        child = subprocess.Popen([sys.executable, str(script), str(path), str(rnd)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert ready == b"ready\n", child.stderr.read() if child.stderr else ready
            time.sleep(rng.uniform(0.01, 0.25))
            os.kill(child.pid, signal.SIGKILL)
            out, err = child.communicate(timeout=30)
        finally:
            if child.poll() is None:  # pragma: no cover - only if an assertion fired
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL, err.decode()
        for line in out.decode().splitlines():
            lsn, traj, i = line.split()
            assert int(lsn) not in printed, f"LSN {lsn} returned twice (seed {seed})"
            printed[int(lsn)] = (traj, int(i))

        # The kernel dropped the dead writer's flock: the store opens for writing
        # at once, and is usable.
        try:
            store = Store(path, settings=SMALL)
        except StoreLocked:  # pragma: no cover
            pytest.fail(f"lock not released after SIGKILL (seed {seed})")
        with store:
            by_lsn = {ev.lsn: ev for ev in store.events()}
            lsn = store.append("parent", "Note", {"round": rnd})
            assert lsn == max(by_lsn, default=0) + 1
        for lsn, (traj, i) in printed.items():
            ev = by_lsn.get(lsn)
            assert ev is not None, f"acknowledged LSN {lsn} lost in round {rnd} (seed {seed})"
            assert (ev.traj, ev.seq, ev.body) == (traj, i, _expected_body(traj, i))
        for ev in by_lsn.values():  # events synced but never printed are right too
            if ev.traj != "parent":
                assert ev.body == _expected_body(ev.traj, ev.seq)
    assert len(printed) > 20, f"the children hardly wrote anything (seed {seed})"
    assert len(segments(path)) >= 2
