"""The compact tape: ``TapeChunk`` records as zstd frames (``recorder/chunks.py``), split
back into streams by runs (``tape.iter_runs``), and a long run recorded and replayed in
bounded memory.

Property tests: any chunk round-trips through the encoding; the runs cover exactly the
records ``iter_records`` reads, each of one channel and size; ``prepare_tape`` writes the
same stream files from compressed chunks as from raw ones, and from a lazily read file
as from a wholly read one. Then a program that reads ``time.monotonic_ns()`` 20 million
times is recorded and replayed bit for bit under the real shim, the peak memory of the
recorder, of the replaying CLI and of the replayed program each polled from ``/proc``
and held to a stated bound (a bound on memory, not a timing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stenograph.recorder import chunks, segment, trajfile
from stenograph.recorder.codec import Event
from stenograph.recorder.tape import RECORD, iter_records, iter_runs, prepare_tape

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)

records = st.lists(st.tuples(st.integers(1, 10), st.integers(0, 20),
                             st.sampled_from([b"", b"ab", b"abcd", bytes(24), b"x" * 40])),
                   max_size=80)


def pack(recs: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(RECORD.pack(ch, op, 0, len(p)) + p for ch, op, p in recs)


@given(data=st.binary(max_size=5000) | records.map(pack))
def test_any_chunk_round_trips(data: bytes) -> None:
    body = chunks.encode("0.1", 3, data)
    assert ("zdata" in body) == (len(data) >= chunks.SMALL)
    assert chunks.chunk_data(body) == data


def test_threads_encoding_at_once_each_get_their_own_frames() -> None:
    """The recorder drains each process's rings on its own thread: chunks compressed at
    the same moment must not mix (a shared zstd compressor made frames that inflate to
    another thread's bytes)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    def work(seed: int) -> bool:
        rnd = random.Random(seed)
        for _ in range(200):
            data = pack([(1, 1, rnd.randbytes(24)) for _ in range(rnd.randint(3, 400))])
            if chunks.chunk_data(chunks.encode("0", seed, data)) != data:
                return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(16)))


@given(z=st.binary(max_size=200), size=st.integers(-5, 1 << 30))
def test_a_bad_chunk_is_a_value_error(z: bytes, size: int) -> None:
    try:
        out = chunks.chunk_data({"zdata": z, "size": size})
    except ValueError:
        return
    assert len(out) == size  # (a valid empty frame can inflate to nothing)


@given(recs=records)
def test_runs_are_the_records(recs: list[tuple[int, int, bytes]]) -> None:
    data = pack(recs)
    flat: list[tuple[int, int, bytes]] = []
    end = 0
    for ch, start, stop, ops in iter_runs(data):
        assert start == end
        run = list(iter_records(data[start:stop]))
        assert {r[0] for r in run} == {ch} and len({len(r[2]) for r in run}) == 1
        assert bytes(r[1] for r in run) == ops
        flat += run
        end = stop
    assert end == len(data) and flat == list(iter_records(data))


@settings(max_examples=60, deadline=None)
@given(chunks_=st.lists(st.tuples(st.sampled_from(["0", "0.1"]), st.integers(0, 2), records),
                        max_size=6))
def test_prepare_tape_reads_every_encoding_alike(
        tmp_path_factory: pytest.TempPathFactory,
        chunks_: list[tuple[str, int, list[tuple[int, int, bytes]]]]) -> None:
    raw = [Event(i + 1, "t", i, i or None, "TapeChunk",
                 {"proc": p, "thread": t, "data": pack(r)}) for i, (p, t, r) in
           enumerate(chunks_)]
    small = [Event(e.lsn, e.traj, e.seq, e.prev, e.kind,
                   chunks.encode(e.body["proc"], e.body["thread"], e.body["data"]))
             for e in raw]
    base = tmp_path_factory.mktemp("tape")
    steno = base / "t.steno"
    trajfile.write_trajectory(steno, "t", small)
    was, segment.LAZY_OVER = segment.LAZY_OVER, 0
    try:
        lazy = trajfile.read_trajectory(steno, lazy_tape=True).events
    finally:
        segment.LAZY_OVER = was
    assert all("$frame" in e.body for e in lazy)
    trees = []
    for name, events in (("raw", raw), ("small", small), ("lazy", lazy)):
        prepare_tape(events, base / name)
        trees.append({str(p.relative_to(base / name)): p.read_bytes()
                      for p in sorted((base / name).rglob("*")) if p.is_file()})
    assert trees[0] == trees[1] == trees[2]


# -- a long run in bounded memory ------------------------------------------------------

READS = int(os.environ.get("STENO_LONG_READS", "8000000"))
"""8 M in make test; make soak runs 100 M in the same bounds."""
BOUND_MB = {"recorder": 160, "replayer": 160, "program": 48}
"""Peak resident memory allowed at any length (measured at 20 M reads: recorder 76 MB,
replaying CLI 44 MB, replayed program 11 MB; at 100 M: 61, 59, 11). Before the compact
tape, 6 M reads took a 398 MB recorder and a 1.39 GB replay."""

CLOCKS = """
import sys, time
f, s = time.monotonic_ns, 0
for _ in range(int(sys.argv[1])):
    s ^= f()
print("reads", sys.argv[1], "parity", s & 1)
"""


class PeakRSS:
    """The peak resident memory (``VmHWM``) of a process and each of its descendants,
    polled from ``/proc`` while it runs: ``{"self": MB, "child": MB}``."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.peak = {"self": 0.0, "child": 0.0}
        self.t = threading.Thread(target=self._poll, daemon=True)
        self.t.start()

    def _tree(self, pid: int) -> list[int]:
        out = [pid]
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    for c in f.read().split():
                        out += self._tree(int(c))
        except OSError:
            pass
        return out

    def _poll(self) -> None:
        while self.proc.poll() is None:
            for pid in self._tree(self.proc.pid):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
                except (OSError, StopIteration, ValueError):
                    continue
                who = "self" if pid == self.proc.pid else "child"
                self.peak[who] = max(self.peak[who], hwm / 1024)
            time.sleep(0.05)

    def wait(self, timeout: float) -> tuple[int, str]:
        _out, err = self.proc.communicate(timeout=timeout)
        self.t.join()
        return self.proc.returncode, err.decode(errors="replace")


def _run(argv: list[str], cwd: Path) -> tuple[int, str, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO")}
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    rss = PeakRSS(p)
    rc, err = rss.wait(600)
    return rc, err, rss.peak


def test_millions_of_clock_reads_record_and_replay_in_bounded_memory(
        tmp_path: Path) -> None:
    (tmp_path / "clocks.py").write_text(CLOCKS)
    steno = tmp_path / "long.steno"
    rc, err, rec = _run([*CLI, "record", "--workspace", "none", "-o", str(steno), "--", PY,
                         "clocks.py", str(READS)], tmp_path)
    assert rc == 0, err[-2000:]
    per_record = steno.stat().st_size / READS
    assert per_record < 4, per_record  # a clock record on disk (it was 32 bytes)
    rc, err, rep = _run([*CLI, "replay", str(steno)], tmp_path)
    assert rc == 0 and "bit-identical" in err, err[-2000:]
    assert rec["self"] < BOUND_MB["recorder"], rec
    assert rep["self"] < BOUND_MB["replayer"], rep
    assert rep["child"] < BOUND_MB["program"], rep
