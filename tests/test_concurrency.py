"""Group commit under concurrency: durable means a completed fdatasync covered it.

The write path is instrumented at two points: ``os.fdatasync`` notes (per thread)
that a sync completed, and ``Store._write_batch`` (which receives
``frames, nbytes, first, last``) logs, once that sync has returned, the highest LSN
it covers. A producer reads the log right after its append returns; if its LSN is
not covered yet, the store acknowledged it too early.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import SMALL, Model, segments

from stenograph.recorder.errors import StorePoisoned
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.store import Store

N_THREADS = 64
N_TASKS = 64
PER_PRODUCER = 12


@dataclass
class SyncLog:
    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: list[tuple[int, int]] = field(default_factory=list)
    covered: int = 0
    unsynced_batches: list[tuple[int, int]] = field(default_factory=list)
    late: list[tuple[str, int, int]] = field(default_factory=list)

    def check_returned(self, who: str, lsn: int) -> None:
        with self.lock:
            covered = self.covered
        if lsn > covered:
            self.late.append((who, lsn, covered))


@pytest.fixture
def sync_log(monkeypatch) -> SyncLog:
    log = SyncLog()
    tls = threading.local()
    real_fdatasync = os.fdatasync
    real_write_batch = Store._write_batch

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        tls.syncs = getattr(tls, "syncs", 0) + 1

    def write_batch(self, frames, nbytes, first, last):
        tls.syncs = 0
        real_write_batch(self, frames, nbytes, first, last)
        with log.lock:
            if tls.syncs == 0:
                log.unsynced_batches.append((first, last))
            log.batches.append((first, last))
            log.covered = max(log.covered, last)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(Store, "_write_batch", write_batch)
    return log


@pytest.fixture
def thread_errors(monkeypatch) -> list[threading.ExceptHookArgs]:
    """Exceptions that escaped any thread (a traceback on stderr is a bug)."""
    seen: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


def _body(who: str, j: int) -> dict:
    return {"who": who, "j": j, "pad": "c" * (j * 37 % 300)}


def test_threads_and_tasks_are_acknowledged_only_after_their_sync(
        tmp_path, sync_log, thread_errors) -> None:
    path = tmp_path / "s"
    store = Store(path, settings=SMALL)
    appended: list[tuple[int, str, str, dict]] = []
    failures: list[BaseException] = []
    start = threading.Barrier(N_THREADS + 1)

    def producer(t: int) -> None:
        who = f"thread-{t}"
        try:
            start.wait()
            for j in range(PER_PRODUCER):
                body = _body(who, j)
                lsn = store.append(who, "Note", body)
                sync_log.check_returned(who, lsn)
                appended.append((lsn, who, "Note", body))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    async def task(t: int) -> None:
        who = f"task-{t}"
        for j in range(PER_PRODUCER):
            body = _body(who, j)
            lsn = await store.append_async(who, "Note", body)
            sync_log.check_returned(who, lsn)
            appended.append((lsn, who, "Note", body))

    async def main() -> None:
        tasks = [asyncio.create_task(task(t)) for t in range(N_TASKS)]
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        await asyncio.gather(*tasks)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(N_THREADS)]
    for th in threads:
        th.start()
    asyncio.run(main())
    for th in threads:
        th.join()
    syncs = store.syncs
    store.close()

    total = (N_THREADS + N_TASKS) * PER_PRODUCER
    assert not failures
    assert not thread_errors
    assert sync_log.late == [], "append returned before a completed sync covered it"
    assert sync_log.unsynced_batches == [], "a batch was written without fdatasync"
    assert sorted(a[0] for a in appended) == list(range(1, total + 1))
    # Batches are written one after another, in LSN order, without gaps.
    firsts = [b[0] for b in sync_log.batches]
    lasts = [b[1] for b in sync_log.batches]
    assert firsts == [1] + [last + 1 for last in lasts[:-1]]
    assert lasts[-1] == total
    assert syncs == len(sync_log.batches)
    assert syncs < total, "no group commit happened"
    assert max(last - first + 1 for first, last in sync_log.batches) > 1
    # Everything reads back, per-trajectory order is each producer's order.
    model = Model.from_appends(appended)
    assert list(StoreReader(path).events()) == model.events
    for ev in model.events:
        assert ev.seq == ev.body["j"]
    assert len(segments(path)) >= 2


def test_non_durable_appends_ride_the_next_sync(tmp_path, sync_log) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as store:
        syncs = store.syncs
        lazy = [store.append("lazy", "Note", {"i": i}, durable=False) for i in range(5)]
        assert lazy == [1, 2, 3, 4, 5]
        assert store.syncs == syncs, "a non-durable append must not sync"
        assert store.synced_lsn == 0
        assert list(StoreReader(path).events()) == [], "not written before a sync"

        got: list[int] = []
        th = threading.Thread(target=lambda: got.append(store.append("eager", "Note", {})))
        th.start()
        th.join()
        assert got == [6]
        assert store.syncs == syncs + 1, "the durable append's sync covered the lazy ones"
        assert sync_log.batches == [(1, 6)]
        assert store.synced_lsn == 6
        assert [e.lsn for e in StoreReader(path).events()] == [1, 2, 3, 4, 5, 6]

        more = [store.append("lazy", "Note", {"i": i}, durable=False) for i in range(5, 8)]
        assert store.synced_lsn == 6
        store.flush()
        assert store.synced_lsn == more[-1] == 9
        assert sync_log.batches == [(1, 6), (7, 9)]
        store.flush()  # nothing queued: no empty batch
        assert sync_log.batches == [(1, 6), (7, 9)]
        store.append("lazy", "Note", {"i": 8}, durable=False)
    # close() made the last one durable too.
    events = list(StoreReader(path).events())
    assert [e.body.get("i") for e in events if e.traj == "lazy"] == list(range(9))
    assert [e.seq for e in events if e.traj == "lazy"] == list(range(9))


def test_failed_fdatasync_poisons_the_store(tmp_path, monkeypatch, thread_errors) -> None:
    path = tmp_path / "s"
    store = Store(path, settings=SMALL)
    good = [store.append("good", "Note", {"i": i}) for i in range(3)]
    # Start the async flusher before the failure, so that it must survive it.
    assert asyncio.run(store.append_async("good", "Note", {"i": 3})) == 4

    real_fdatasync = os.fdatasync
    calls = []

    def failing(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.02)  # let the other producers queue behind this sync
        raise OSError(errno.EIO, "injected fdatasync failure")

    monkeypatch.setattr(os, "fdatasync", failing)
    outcomes: dict[str, BaseException | int] = {}
    start = threading.Barrier(32 + 1)

    def producer(t: int) -> None:
        who = f"thread-{t}"
        start.wait()
        try:
            outcomes[who] = store.append(who, "Note", {"who": who})
        except BaseException as exc:
            outcomes[who] = exc

    async def task(t: int) -> None:
        who = f"task-{t}"
        try:
            outcomes[who] = await store.append_async(who, "Note", {"who": who})
        except BaseException as exc:
            outcomes[who] = exc

    async def main() -> None:
        tasks = [asyncio.create_task(task(t)) for t in range(32)]
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        await asyncio.gather(*tasks)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(32)]
    for th in threads:
        th.start()
    asyncio.run(main())
    for th in threads:
        th.join()

    assert calls, "the failing fdatasync was never reached"
    assert len(outcomes) == 64
    for who, got in outcomes.items():
        assert isinstance(got, StorePoisoned), f"{who} got {got!r}"
        assert got.exit_code == 3
        assert isinstance(got.__cause__, OSError)

    # Later appends fail at once, durable or not, sync or async.
    n_calls = len(calls)
    with pytest.raises(StorePoisoned):
        store.append("late", "Note", {})
    with pytest.raises(StorePoisoned):
        store.append("late", "Note", {}, durable=False)
    with pytest.raises(StorePoisoned):
        asyncio.run(store.append_async("late", "Note", {}))
    with pytest.raises(StorePoisoned):
        store.flush()
    assert len(calls) == n_calls, "a poisoned store must not retry fdatasync"

    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    with contextlib.suppress(StorePoisoned):
        store.close()
    for th in threading.enumerate():
        if th.name.startswith("stenograph"):
            th.join(timeout=5)
            assert not th.is_alive(), f"{th.name} outlived close()"
    assert not thread_errors, [str(e.exc_value) for e in thread_errors]

    # The lock is free again and recovery serves the acknowledged events; anything
    # else it serves is one of the unacknowledged appends, intact.
    with Store(path, settings=SMALL) as s:
        events = s.events()
    assert [e.body for e in events[:4]] == [{"i": i} for i in range(4)]
    assert good == [1, 2, 3]
    for ev in events[4:]:
        assert ev.traj in outcomes and ev.body == {"who": ev.traj} and ev.seq == 0


def test_poisoned_store_reports_through_close_and_reopens(tmp_path, monkeypatch) -> None:
    path = Path(tmp_path / "s")
    store = Store(path, settings=SMALL)
    store.append("a", "Note", {})

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", failing)
    store.append("a", "Note", {"lost": True}, durable=False)
    with pytest.raises(StorePoisoned):
        store.close()  # the queued event could not be made durable: say so
    monkeypatch.undo()
    with Store(path, settings=SMALL) as s:
        assert s.events()[0].body == {}


def test_failed_sync_led_by_the_async_flusher(tmp_path, monkeypatch, thread_errors) -> None:
    """Only asyncio producers: the background flusher leads the failing batch.

    Its waiters get ``StorePoisoned``; the flusher itself must not die with a
    traceback, and ``close`` must still stop it.
    """
    path = tmp_path / "s"
    store = Store(path, settings=SMALL)

    async def append_many(n: int, tag: str) -> list:
        return await asyncio.gather(
            *(store.append_async("a", "Note", {"tag": tag, "k": k}) for k in range(n)),
            return_exceptions=True)

    assert asyncio.run(append_many(3, "ok")) == [1, 2, 3]

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", failing)
    results = asyncio.run(append_many(5, "doomed"))
    assert all(isinstance(r, StorePoisoned) for r in results), results
    with pytest.raises(StorePoisoned):
        asyncio.run(store.append_async("a", "Note", {}))
    monkeypatch.undo()
    with contextlib.suppress(StorePoisoned):
        store.close()
    for th in threading.enumerate():
        if th.name.startswith("stenograph"):
            th.join(timeout=5)
            assert not th.is_alive(), f"{th.name} outlived close()"
    assert not thread_errors, [str(e.exc_value) for e in thread_errors]
    with Store(path, settings=SMALL) as s:
        assert [e.body["tag"] for e in s.events()][:3] == ["ok"] * 3
