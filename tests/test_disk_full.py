"""Recording onto a full disk: one line, exit 7, no half store; the program unharmed.

A real tmpfs (mounted here: the suite runs as root, as `make test` does on this
machine; skipped where a mount cannot be made), filled with a real file, and real
`stenograph record` runs of a program that posts a 1 MiB body to a real server on
127.0.0.1 and exits 3. (`--workspace none`: the test's directory holds the filled disk
itself, which a workspace snapshot would try to copy onto it.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import sys, requests
size = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
r = requests.post(sys.argv[1] + "/up", data=b"x" * size)
print("status", r.status_code, r.text)
sys.exit(3)
"""




@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)],
                       capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave_kib: int) -> None:
    st = os.statvfs(disk)
    free_kib = st.f_bavail * st.f_frsize // 1024
    with open(disk / "pad", "wb") as f:
        f.truncate(0)
        left = (free_kib - leave_kib) * 1024
        chunk = b"\0" * (1 << 20)
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _record(tmp: Path, disk: Path, url: str, *args: str,
            program: str = PROGRAM) -> subprocess.CompletedProcess[str]:
    prog = tmp / "agent.py"
    prog.write_text(program)
    return subprocess.run([*CLI, "record", "--workspace", "none", "--store",
                           str(disk / "store"), "-o", str(tmp / "out.steno"), "--",
                           sys.executable, str(prog), url, *args],
                          cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)


def _replay(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "replay", str(tmp / "out.steno")], cwd=tmp, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _exchanges(steno: Path) -> list[dict]:
    from stenograph.recorder.trajfile import read_trajectory

    return [e.body for e in read_trajectory(steno).events if e.kind == "Exchange"]


def test_no_room_for_a_store_is_one_line_and_leaves_nothing(tmp_path: Path, small_disk: Path,
                                                            counting_server: str) -> None:
    _fill(small_disk, 1000)  # less than one preallocated segment
    p = _record(tmp_path, small_disk, counting_server)
    assert p.returncode == 7, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], p.stderr
    assert not (small_disk / "store").exists()
    assert not (tmp_path / "out.steno").exists()


def test_a_body_with_no_room_does_not_harm_the_program(tmp_path: Path, small_disk: Path,
                                                       counting_server: str) -> None:
    _fill(small_disk, 33000)  # a segment fits; the 1 MiB body's blob does not
    p = _record(tmp_path, small_disk, counting_server)
    assert "status 200 got 1048576" in p.stdout, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 3, p.stderr  # the program's own exit status, kept


# -- log append / import / export onto a full disk ---------------------------------------


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def _one_line(p: subprocess.CompletedProcess[str]) -> str:
    """A full disk: exit 7 and one line naming it, no traceback."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 7, p.stderr
    assert len(lines) == 1 and "No space left on device" in lines[0], p.stderr
    assert lines[0].startswith("stenograph: error: "), p.stderr
    return lines[0]


def _nearly_full_store(path: Path) -> None:
    """A store whose tail segment (64 KiB, made with small segments) has ~14 KiB left, so
    the next event of 20 KiB needs a new (32 MiB, preallocated) segment."""
    from stenograph.recorder.store import Store, StoreSettings

    with Store(path, settings=StoreSettings(segment_bytes=64 << 10)) as st:
        for i in range(50):
            st.append("a", "Note", {"i": i, "pad": "p" * 1000})


def _cat(store: Path) -> list[str]:
    p = _cli("log", "cat", store, "--jsonl")
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def _verified(store: Path) -> None:
    p = _cli("log", "verify", store)
    assert p.returncode == 0 and p.stdout.startswith("ok: "), (p.stdout, p.stderr)


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_append_onto_a_full_disk_is_one_line_and_keeps_the_store(small_disk: Path) -> None:
    store = small_disk / "store"
    _nearly_full_store(store)
    before = _cat(store)
    _fill(small_disk, 1000)
    line = _one_line(_cli("log", "append", store, "--traj", "a", "--kind", "Note",
                          "--body", '{"big": "%s"}' % ("b" * 20000)))
    assert "the event was not appended" in line and str(store) in line, line
    _verified(store)
    assert _cat(store) == before
    assert not _leftovers(store)  # the half-made segment gave its space back
    # the store takes the next command: a small event still fits the tail segment
    p = _cli("log", "append", store, "--traj", "a", "--kind", "Note", "--body", '{"n": 1}')
    assert p.returncode == 0, p.stderr
    assert _cat(store)[:-1] == before


def test_append_to_a_new_store_on_a_full_disk_leaves_none(small_disk: Path) -> None:
    _fill(small_disk, 1000)  # less than one preallocated segment
    line = _one_line(_cli("log", "append", small_disk / "new", "--traj", "a", "--kind", "Note"))
    assert "no store was made" in line, line
    assert not (small_disk / "new").exists()


def _steno(tmp: Path, *, events: int, blob: int) -> Path:
    """A trajectory file ``b`` of ``events`` 1 KiB events, the first holding a ``blob``-byte
    blob (0: none), made off the small disk."""
    from stenograph.recorder.store import Store
    from stenograph.recorder.trajfile import export_trajectory

    with Store(tmp / "src") as st:
        for i in range(events):
            body: dict[str, object] = {"i": i, "pad": "q" * 1000}
            if i == 0 and blob:
                body["data"] = st.blobs.put(os.urandom(blob)).to_body()
            st.append("b", "Note", body, durable=False)
    out = tmp / "b.steno"
    export_trajectory(tmp / "src", "b", out)
    return out


@pytest.mark.parametrize("short_of", ["blob", "events"])
def test_import_onto_a_full_disk_is_all_or_nothing(tmp_path: Path, small_disk: Path,
                                                   short_of: str) -> None:
    store = small_disk / "store"
    _nearly_full_store(store)
    before = _cat(store)
    blobs_before = sorted(p.name for p in (store / "blobs").rglob("*") if p.is_file())
    # "blob": its 2 MiB blob finds no room; "events": 30 KiB of events need a new segment
    f = _steno(tmp_path, events=1 if short_of == "blob" else 30,
               blob=(2 << 20) if short_of == "blob" else 0)
    _fill(small_disk, 1000)
    line = _one_line(_cli("log", "import", f, store))
    assert "nothing was imported; the store is as it was" in line, line
    _verified(store)
    assert _cat(store) == before
    assert sorted(p.name for p in (store / "blobs").rglob("*") if p.is_file()) == blobs_before
    assert not _leftovers(store)
    (small_disk / "pad").unlink()  # room again: the same import now goes through whole
    p = _cli("log", "import", f, store)
    assert p.returncode == 0, p.stderr
    _verified(store)
    assert _cat(store)[: len(before)] == before


def test_import_to_a_new_store_on_a_full_disk_leaves_none(tmp_path: Path,
                                                          small_disk: Path) -> None:
    f = _steno(tmp_path, events=1, blob=0)
    _fill(small_disk, 1000)
    line = _one_line(_cli("log", "import", f, small_disk / "new"))
    assert "no store was made" in line, line
    assert not (small_disk / "new").exists()


def test_export_onto_a_full_disk_leaves_no_partial_file(tmp_path: Path,
                                                        small_disk: Path) -> None:
    from stenograph.recorder.store import Store

    with Store(tmp_path / "src") as st:  # off the small disk: only the output is short
        st.append("t", "Note", {"data": st.blobs.put(os.urandom(2 << 20)).to_body()})
    out = small_disk / "t.steno"
    _fill(small_disk, 1000)
    line = _one_line(_cli("log", "export", tmp_path / "src", "t", "-o", out))
    assert "nothing was written" in line and str(out) in line, line
    assert sorted(p.name for p in small_disk.iterdir()) == ["pad"]  # no OUT, no temp file
    # an OUT that was there stays as it was
    (small_disk / "pad").unlink()
    assert _cli("log", "append", tmp_path / "old", "--traj", "t", "--kind", "Note").returncode == 0
    assert _cli("log", "export", tmp_path / "old", "t", "-o", out).returncode == 0
    old = out.read_bytes()
    _fill(small_disk, 1000)
    line = _one_line(_cli("log", "export", tmp_path / "src", "t", "-o", out))
    assert f"{out} is as it was" in line, line
    assert out.read_bytes() == old
    assert sorted(p.name for p in small_disk.iterdir()) == ["pad", "t.steno"]


# -- the Python tape on a full disk: bodies inline, too large, or exchanges refused -------


def test_a_body_the_blob_store_cannot_take_is_recorded_inline(tmp_path: Path, small_disk: Path,
                                                               counting_server: str) -> None:
    size = 400 << 10  # over SPILL, more than the disk has left, under MAX_MESSAGE
    _fill(small_disk, 33000)  # a segment fits (~230 KiB left); the body's blob does not
    p = _record(tmp_path, small_disk, counting_server, str(size))
    assert p.returncode == 3, p.stderr
    assert f"status 200 got {size}" in p.stdout, (p.stdout, p.stderr)
    [ex] = _exchanges(tmp_path / "out.steno")
    assert ex["request"]["body"] == b"x" * size
    assert not list((small_disk / "store" / "blobs").rglob("*.tmp"))
    r = _replay(tmp_path)
    assert r.returncode == 0 and "replay bit-identical" in r.stderr, (r.stdout, r.stderr)
    assert f"status 200 got {size}" in r.stdout


def test_a_body_too_large_to_keep_is_marked_and_the_replay_still_serves(
        tmp_path: Path, small_disk: Path, counting_server: str) -> None:
    import hashlib

    _fill(small_disk, 33000)  # no room for the 1 MiB blob; inline it is over MAX_MESSAGE
    p = _record(tmp_path, small_disk, counting_server)
    assert p.returncode == 3, p.stderr
    assert "status 200 got 1048576" in p.stdout, (p.stdout, p.stderr)
    [ex] = _exchanges(tmp_path / "out.steno")
    assert ex["request"]["body"] == {"lost": "body", "bytes": 1 << 20, "channel": "http",
                                     "pos": 0,
                                     "sha256": hashlib.sha256(b"x" * (1 << 20)).hexdigest()}
    assert ex["response"]["body"] == b"got 1048576"  # the response was kept
    r = _replay(tmp_path)  # matched on the fingerprint, served the recorded response
    assert r.returncode == 0 and "replay bit-identical" in r.stderr, (r.stdout, r.stderr)
    assert "status 200 got 1048576" in r.stdout


BIG_GET = """
import sys, requests
r = requests.get(sys.argv[1] + "/big")
print("status", r.status_code, len(r.content))
sys.exit(3)
"""


class _BigHandler(BaseHTTPRequestHandler):
    """Answers every GET with 1.5 MiB."""

    def do_GET(self) -> None:
        body = b"y" * (3 << 19)
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_lost_response_body_makes_the_replay_say_so(tmp_path: Path, small_disk: Path) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _BigHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _fill(small_disk, 33000)
        p = _record(tmp_path, small_disk, f"http://127.0.0.1:{srv.server_address[1]}",
                    program=BIG_GET)
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == 3 and f"status 200 {3 << 19}" in p.stdout, (p.stdout, p.stderr)
    [ex] = _exchanges(tmp_path / "out.steno")
    assert ex["response"]["body"]["lost"] == "body", ex["response"]
    assert ex["response"]["body"]["bytes"] == 3 << 19
    r = _replay(tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert f"its body ({3 << 19} bytes" in r.stderr and "was not recorded" in r.stderr, r.stderr


class _FullStore:
    """A store whose every append the system refuses."""

    def append(self, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", "/full/store")


def _entry(body: bytes) -> dict:
    return {"fingerprint": "f", "request": {"method": "POST", "url": "http://h/x",
                                            "headers": [], "body": body},
            "response": {"status": 200, "headers": [], "body": b"ok", "chunks": [2]},
            "error": None}


def test_an_exchange_the_store_refuses_is_counted_not_raised(tmp_path: Path) -> None:
    from stenograph.interpose.pytape import PyTape
    from stenograph.recorder.exchanges import ExchangeServer

    srv = ExchangeServer(_FullStore(), "run", tmp_path / "x.sock")
    try:
        tape = PyTape("record", "0", sock_path=srv.path)
        for pos in range(3):
            tape.commit("http", pos, _entry(b"hello"))  # never raises into the program
        assert tape.lost == 3
        assert (srv.lost, srv.count) == (3, 0)
        assert srv.loss_note() == ("3 exchange(s) could not be recorded (replay stops at "
                                   "the first)")
        assert srv.errors and "No space left on device" in srv.errors[0]
        tape._sock.close()  # as the program's exit does, so close() need not wait
    finally:
        srv.close()


def test_an_oversized_body_is_replaced_by_a_marker_and_counted(tmp_path: Path) -> None:
    from stenograph.interpose import pytape
    from stenograph.recorder import exchanges
    from stenograph.recorder.store import Store

    assert pytape.MAX_MESSAGE == exchanges.MAX_MESSAGE
    with Store(tmp_path / "s") as st:
        srv = exchanges.ExchangeServer(st, "run", tmp_path / "x.sock")
        try:
            tape = pytape.PyTape("record", "0", sock_path=srv.path)  # no blob store
            small = b"s" * (100 << 10)
            tape.commit("http", 0, _entry(b"b" * (2 << 20)))
            tape.commit("http", 1, _entry(small))  # over SPILL but fits: kept inline
            assert tape.lost == 0 and (srv.count, srv.lost, srv.bodies_lost) == (2, 0, 1)
            assert "1 exchange(s) recorded without a body" in (srv.loss_note() or "")
            tape._sock.close()
        finally:
            srv.close()
        bodies = [e.body["request"]["body"] for e in st.events() if e.kind == "Exchange"]
    assert bodies[0]["lost"] == "body" and bodies[0]["bytes"] == 2 << 20
    assert bodies[1] == small


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (a hung recording's program too)."""
    import signal

    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    for kid in kids.split():
        _kill_tree(int(kid))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _record_on_a_full_disk(tmp_path: Path, small_disk: Path, counting_server: str,
                           extra_env: dict[str, str], before: str = "",
                           ) -> subprocess.Popen[str]:
    from stenograph.recorder.store import Store, StoreSettings

    # the store's tail segment (256 KiB) takes the run's start and its tape, not the
    # 400 KiB exchange; the disk has no room for its blob nor for the next segment
    with Store(small_disk / "store", settings=StoreSettings(segment_bytes=256 << 10)) as st:
        st.append("before", "Note", {})
    _fill(small_disk, 200)
    prog = tmp_path / "agent.py"
    prog.write_text(before + PROGRAM)
    p = subprocess.Popen([*CLI, "record", "--workspace", "none", "--store",
                          str(small_disk / "store"), "-o", str(tmp_path / "out.steno"),
                          "--", sys.executable, str(prog), counting_server, str(400 << 10)],
                         cwd=tmp_path, env={**_env(), **extra_env}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    return p


def test_an_exchange_the_store_cannot_take_leaves_the_program_unharmed(
        tmp_path: Path, small_disk: Path, counting_server: str) -> None:
    # the upload is declared read-only: no intent is needed before it is sent
    p = _record_on_a_full_disk(tmp_path, small_disk, counting_server,
                               {"STENO_READONLY_URLS": "/up$"})
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        _kill_tree(p.pid)
        out, err = p.communicate()
        pytest.fail(f"the recording hung: {out!r} {err[-2000:]!r}")
    assert f"status 200 got {400 << 10}" in out, (out, err)  # the program got its answer
    assert p.returncode == 7, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "the program exited 3" in lines[0], err
    assert "1 exchange(s) could not be recorded" in lines[0], err
    # what was durable went to the output, which is on a disk with room
    assert f"the run up to the last durable event is in {tmp_path / 'out.steno'}" in lines[0]
    cat = subprocess.run([*CLI, "log", "cat", str(tmp_path / "out.steno")], capture_output=True,
                         text=True, env=_env())
    assert cat.returncode == 0, cat.stderr
    assert "RunStarted" in cat.stdout and "TapeChunk" in cat.stdout


def test_an_effect_whose_intent_cannot_be_kept_is_not_sent(
        tmp_path: Path, small_disk: Path, counting_server: str) -> None:
    """Intent before effect: with no room for the intent, the POST never leaves; the
    program is told so by the transport, and the recording says why in one line. The
    program first reads 256 KiB of entropy: tape no compression shrinks, which fills the
    store's tail segment before the POST (the disk has no room for another)."""
    p = _record_on_a_full_disk(tmp_path, small_disk, counting_server, {},
                               before="import os\nfor _ in range(64):\n    os.urandom(4096)\n")
    out, err = p.communicate(timeout=30)
    assert "status 200" not in out, out  # the effect was not made
    assert "could not make the intent of POST" in err and "was not sent" in err, err
    assert p.returncode == 7, err
    assert err.strip().splitlines()[-1].startswith("stenograph: error: "), err
