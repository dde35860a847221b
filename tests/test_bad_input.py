"""Bad input is refused with the right error and exit code, and changes nothing."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import SMALL, Model, dir_digest, flip_bit, segments

from stenograph.recorder.errors import (
    BadInput,
    CorruptLog,
    FormatVersionError,
    NotAStore,
    StenographError,
    StoreLocked,
    StorePoisoned,
    UnknownKind,
)
from stenograph.recorder.kinds import FORMAT_VERSION
from stenograph.recorder.reader import StoreReader
from stenograph.recorder.segment import HEADER, HEADER_SIZE, TRAJ_MAGIC, WAL_MAGIC
from stenograph.recorder.store import Store


@pytest.fixture
def store(tmp_path) -> tuple[Path, Model]:
    """A closed store with several segments (and a pre-filled spare segment)."""
    path = tmp_path / "store"
    model = Model()
    rng = random.Random(3)
    with Store(path, settings=SMALL) as s:
        # Stop once the tail is half full: then the writer has zero-filled a spare
        # segment (wal/spare.tmp), which a refused open must not touch either.
        while len(segments(path)) < 3 or not (path / "wal" / "spare.tmp").exists():
            traj = rng.choice(["a", "b"])
            body = {"pad": "x" * rng.randint(0, 3000)}
            model.add(s.append(traj, "Note", body, durable=rng.random() < 0.3),
                      traj, "Note", body)
    assert (path / "wal" / "spare.tmp").exists()
    return path, model


def _refused(path: Path, exc_type: type[StenographError]) -> StenographError:
    """Both the reader and the writer refuse ``path``; neither changes a byte."""
    before = dir_digest(path)
    with pytest.raises(exc_type) as by_reader:
        list(StoreReader(path).events())
    with pytest.raises(exc_type) as by_writer:
        Store(path, settings=SMALL)
    assert dir_digest(path) == before, "a refused open modified the store"
    assert type(by_reader.value) is type(by_writer.value)
    return by_reader.value


def _rewrite_header(seg: Path, **fields) -> None:
    magic, version, flags, res, number, first = HEADER.unpack_from(seg.read_bytes(), 0)
    values = {"magic": magic, "version": version, "flags": flags, "res": res,
              "number": number, "first": first, **fields}
    with open(seg, "r+b") as f:
        f.write(HEADER.pack(*values.values()))


def test_exit_codes() -> None:
    assert BadInput("x").exit_code == 2
    for sub in (NotAStore, StoreLocked, FormatVersionError, UnknownKind):
        assert issubclass(sub, BadInput) and sub("x").exit_code == 2
    assert CorruptLog("x", "seg", 7).exit_code == 3
    assert StorePoisoned("x").exit_code == 3
    assert str(CorruptLog("bad crc", "wal/1.seg", 7)) == "bad crc (wal/1.seg @ 7)"


@pytest.mark.parametrize("which", [0, -1])
def test_garbage_file_as_segment(store, which) -> None:
    path, _ = store
    seg = segments(path)[which]
    seg.write_bytes(random.Random(5).randbytes(seg.stat().st_size))
    err = _refused(path, BadInput)
    assert err.exit_code == 2
    assert err.where == str(seg)


def test_extra_garbage_segment(store) -> None:
    path, _ = store
    extra = path / "wal" / "0000000099.seg"
    extra.write_bytes(b"this is not a stenograph segment at all, just text\n" * 3)
    err = _refused(path, BadInput)
    assert err.where == str(extra)


def test_wrong_magic(store) -> None:
    path, _ = store
    seg = segments(path)[1]
    _rewrite_header(seg, magic=b"NOTSTENO")
    err = _refused(path, BadInput)
    assert "magic" in str(err) and err.where == str(seg)


def test_trajectory_file_magic_in_a_store(store) -> None:
    path, _ = store
    _rewrite_header(segments(path)[0], magic=TRAJ_MAGIC)
    err = _refused(path, BadInput)
    assert "trajectory file" in str(err)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, FORMAT_VERSION + 100, 0])
def test_newer_format_version(store, version) -> None:
    path, _ = store
    seg = segments(path)[-1]
    _rewrite_header(seg, version=version)
    err = _refused(path, FormatVersionError)
    assert err.exit_code == 2
    assert f"version {version}" in str(err)
    assert str(FORMAT_VERSION) in str(err)
    assert err.where == str(seg)


def test_empty_segment_file(store) -> None:
    path, _ = store
    seg = segments(path)[-1]
    seg.write_bytes(b"")
    err = _refused(path, BadInput)
    assert "empty" in str(err) and err.where == str(seg)


def test_segment_shorter_than_header(store) -> None:
    path, _ = store
    (path / "wal" / "0000000099.seg").write_bytes(WAL_MAGIC)
    assert "too short" in str(_refused(path, BadInput))


def test_corrupt_frame_exit_3_and_store_unchanged(store) -> None:
    path, _ = store
    first = segments(path)[0]
    flip_bit(first, HEADER_SIZE + 100, 0)
    err = _refused(path, CorruptLog)
    assert err.exit_code == 3
    assert err.segment == str(first) and err.offset >= HEADER_SIZE


def test_segment_numbering_gap_is_corrupt(store) -> None:
    path, _ = store
    segs = segments(path)
    segs[1].rename(path / "wal" / "0000000077.seg")  # a segment went missing
    assert isinstance(_refused(path, CorruptLog), CorruptLog)


def test_segment_first_lsn_mismatch_is_corrupt(store) -> None:
    path, _ = store
    seg = segments(path)[1]
    first = HEADER.unpack_from(seg.read_bytes(), 0)[5]
    _rewrite_header(seg, first=first + 1)
    err = _refused(path, CorruptLog)
    assert err.segment == str(seg)


# -- not a store ---------------------------------------------------------------------


def test_empty_directory_is_not_a_store(tmp_path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(NotAStore):
        StoreReader(d)
    with pytest.raises(NotAStore) as info:
        Store(d, create=False)
    assert info.value.exit_code == 2 and info.value.where == str(d)
    assert list(d.iterdir()) == []


def test_non_store_directory_is_left_alone(tmp_path) -> None:
    d = tmp_path / "project"
    (d / "src").mkdir(parents=True)
    (d / "README").write_text("not a store\n")
    (d / "src" / "main.py").write_text("print('hi')\n")
    (d / "wal").mkdir()  # even a wal/ directory does not make a store
    before = dir_digest(d, skip_lock_content=False)
    with pytest.raises(NotAStore):
        StoreReader(d)
    with pytest.raises(NotAStore):
        Store(d, create=False)
    with pytest.raises(NotAStore):
        Store(d, create=True)
    assert dir_digest(d, skip_lock_content=False) == before


def test_file_is_not_a_store(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"data")
    for call in (lambda: StoreReader(f), lambda: Store(f, create=False),
                 lambda: Store(f, create=True)):
        with pytest.raises(NotAStore):
            call()
    assert f.read_bytes() == b"data"


def test_missing_path(tmp_path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(BadInput):
        StoreReader(missing)
    with pytest.raises(NotAStore):
        Store(missing, create=False)
    assert not missing.exists()
    with Store(missing, create=True, settings=SMALL) as s:  # create=True makes one
        assert s.append("a", "Note", {}) == 1


# -- the writer lock -----------------------------------------------------------------


def test_second_writer_in_process_is_refused(store) -> None:
    path, model = store
    with Store(path, settings=SMALL) as first:
        before = dir_digest(path, skip_lock_content=False)
        with pytest.raises(StoreLocked) as info:
            Store(path, settings=SMALL)
        assert info.value.exit_code == 2
        assert str(os.getpid()) in str(info.value)
        assert dir_digest(path, skip_lock_content=False) == before
        # The holder is unaffected, and readers need no lock.
        lsn = first.append("a", "Note", {"still": "works"})
        assert lsn == len(model.events) + 1
        assert list(StoreReader(path).events())[-1].lsn == lsn
    with Store(path, settings=SMALL) as again:
        assert again.events()[-1].lsn == lsn


LOCKER = textwrap.dedent(
    """
    import sys
    from stenograph.recorder.errors import StoreLocked
    from stenograph.recorder.store import Store

    path, mode = sys.argv[1], sys.argv[2]
    if mode == "hold":
        s = Store(path)
        print("holding", flush=True)
        sys.stdin.read()
        s.append("child", "Note", {})
        s.close()
    else:
        try:
            Store(path).close()
        except StoreLocked as exc:
            print("StoreLocked", exc.exit_code, flush=True)
        else:
            print("opened", flush=True)
    """
)


def test_lock_is_held_against_another_process(store, tmp_path) -> None:
    path, _ = store
    script = tmp_path / "locker.py"
    script.write_text(LOCKER)
    with Store(path, settings=SMALL):
        out = subprocess.run([sys.executable, str(script), str(path), "try"],
                             capture_output=True, timeout=60)
        assert out.stdout.decode().split() == ["StoreLocked", "2"], out.stderr.decode()
    out = subprocess.run([sys.executable, str(script), str(path), "try"],
                         capture_output=True, timeout=60)
    assert out.stdout.decode().split() == ["opened"], out.stderr.decode()


def test_lock_held_by_another_process(store, tmp_path) -> None:
    path, model = store
    script = tmp_path / "locker.py"
    script.write_text(LOCKER)
    child = subprocess.Popen([sys.executable, str(script), str(path), "hold"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"holding\n"
        before = dir_digest(path, skip_lock_content=False)
        with pytest.raises(StoreLocked) as info:
            Store(path, settings=SMALL)
        assert str(child.pid) in str(info.value)
        assert dir_digest(path, skip_lock_content=False) == before
        assert list(StoreReader(path).events()) == model.events
    finally:
        _, err = child.communicate(b"", timeout=60)
    assert child.returncode == 0, err.decode()
    with Store(path, settings=SMALL) as s:
        assert s.events()[-1].traj == "child"


# -- trajectory ids ------------------------------------------------------------------

BAD_TRAJS = ["", " ", "-lead", ".dot", "_under", "a b", "a/b", "a\\b", "tab\t", "é",
             "new\nline", "x" * 201, 5, None, b"bytes", 1.5, ["list"], {"a": 1}]
GOOD_TRAJS = ["a", "0", "x" * 200, "A0._:@+-z", "run:1@host+2"]


@pytest.mark.parametrize("traj", BAD_TRAJS, ids=repr)
def test_bad_trajectory_id(tmp_path, traj) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        s.append("ok", "Note", {})
        before = dir_digest(path)
        for durable in (True, False):
            with pytest.raises(BadInput) as info:
                s.append(traj, "Note", {}, durable=durable)
            assert info.value.exit_code == 2
            assert "trajectory" in str(info.value)
        assert dir_digest(path) == before
        assert s.append("ok", "Note", {}) == 2, "a refused append consumed an LSN"
        assert all(t != traj for t in s.trajectories())
    assert [e.lsn for e in StoreReader(path).events()] == [1, 2]


def test_good_trajectory_ids(tmp_path) -> None:
    path = tmp_path / "s"
    with Store(path, settings=SMALL) as s:
        for traj in GOOD_TRAJS:
            s.append(traj, "Note", {})
    assert [e.traj for e in StoreReader(path).events()] == GOOD_TRAJS


def test_closed_store_refuses_appends(tmp_path) -> None:
    path = tmp_path / "s"
    s = Store(path, settings=SMALL)
    s.append("a", "Note", {})
    s.close()
    s.close()  # idempotent
    before = dir_digest(path)
    with pytest.raises(StenographError):
        s.append("a", "Note", {})
    assert dir_digest(path) == before


CLI = [sys.executable, "-m", "stenograph"]


@pytest.mark.parametrize("body", [
    '{"a": 18446744073709551616}',           # an integer msgpack cannot hold
    '{"a": "\\ud800"}',                       # a lone surrogate: no UTF-8 for it
    '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}",   # deeper than JSON can be read
    '{"a": ' + "[" * 600 + "]" * 600 + "}",  # deeper than the log keeps
])
def test_log_append_of_a_body_the_log_cannot_hold_changes_nothing(
        tmp_path: Path, body: str) -> None:
    """One line, exit 2, and the store byte for byte as it was (its lock and writer
    stamps included): the body is refused before the store is opened."""
    store = tmp_path / "s"
    ok = subprocess.run([*CLI, "log", "append", str(store), "--traj", "t", "--kind", "Note",
                         "--body", '{"a": 1}'], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    before = dir_digest(store, skip_lock_content=False)
    p = subprocess.run([*CLI, "log", "append", str(store), "--traj", "t", "--kind", "Note",
                        "--body", body], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr[-500:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-500:]
    assert p.stderr.startswith("stenograph: error: ")
    assert "Traceback" not in p.stderr
    assert dir_digest(store, skip_lock_content=False) == before


def test_replay_keep_tape_into_a_directory_holding_files_is_refused(tmp_path: Path) -> None:
    """The tape is prepared in --keep-tape and overlaid; a directory with a person's files
    in it is refused in one line, and left as it was."""
    steno = tmp_path / "r.steno"
    rec = subprocess.run([*CLI, "record", "--workspace", "none", "-o", str(steno), "--",
                          "true"], capture_output=True, text=True, cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    before = dir_digest(mine)
    p = subprocess.run([*CLI, "replay", "--keep-tape", str(mine), str(steno)],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "--keep-tape" in p.stderr
    assert dir_digest(mine) == before
    empty = tmp_path / "empty"
    ok = subprocess.run([*CLI, "replay", "--keep-tape", str(empty), str(steno)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (empty / "py").is_dir()
