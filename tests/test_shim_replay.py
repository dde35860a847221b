"""Record a real process under the real shim, replay it, compare the bytes.

Every test runs ``stenograph record`` and ``stenograph replay`` as subprocesses (the
way a user does) on real programs: CPython (the real interpreter, not pyenv's shell
wrapper), coreutils and bash.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]


def record(tmp: Path, argv: list[str], name: str = "run") -> tuple[Path, bytes]:
    out = tmp / f"{name}.steno"
    p = subprocess.run([*CLI, "record", "-o", str(out), "--", *argv], cwd=tmp,
                       capture_output=True, timeout=120)
    assert out.exists(), p.stderr.decode()
    return out, p.stdout


def replay(tmp: Path, steno: Path, *extra: str) -> tuple[int, dict]:
    p = subprocess.Popen([*CLI, "replay", str(steno), "--json", *extra], cwd=tmp,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # what each process of the tree waits in, then stop
        where = _stuck(p.pid)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise AssertionError(f"the replay did not end in 120 s; its tree:\n{where}") from None
    assert out, err.decode()
    return p.returncode, json.loads(out.decode().splitlines()[-1])


def _stuck(root: int) -> str:
    """Each process of ``root``'s tree (orphans its subreaper adopted too): its command,
    and for each thread its state, kernel wait channel and system call."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    lines, todo = [], [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            tasks = []
            for t in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                base = f"/proc/{pid}/task/{t}"
                state = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()[0]
                tasks.append(f"{t}:{state}:{Path(f'{base}/wchan').read_text()}:"
                             f"{Path(f'{base}/syscall').read_text().split()[0]}")
        except OSError:
            continue
        lines.append(f"{'  ' * depth}{pid} {cmd.decode(errors='replace')} [{' '.join(tasks)}]")
        todo.extend((k, depth + 1) for k in kids.get(pid, []))
    return "\n".join(lines)


def roundtrip(tmp: Path, argv: list[str]) -> bytes:
    steno, out = record(tmp, argv)
    code, rep = replay(tmp, steno)
    assert rep["divergences"] == [], rep
    assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}, rep
    assert code == 0
    return out


def script(tmp: Path, body: str) -> str:
    path = tmp / "prog.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


NONDETERMINISTIC = """
    import datetime, os, random, secrets, shutil, socket, tempfile, time, uuid
    # libuuid keeps its clock sequence in /var/lib/libuuid/clock.txt (state that the
    # recorded run itself changes): use Python's own uuid1 (time + random) instead.
    uuid._generate_time_safe = None
    print(time.time(), datetime.datetime.now(), time.monotonic(), time.perf_counter_ns())
    print(uuid.uuid4(), uuid.uuid1(node=0x0242AC110002), random.random(), secrets.token_hex(16))
    print(os.urandom(16).hex())
    d = tempfile.mkdtemp()
    print(d)
    for n in ["q", "b", "zz", "a", "m", "k"]:
        open(os.path.join(d, n), "w").close()
    print(os.listdir(d), sorted(os.scandir(d), key=id)[0].name)
    shutil.rmtree(d)
    print(hash("x"), list({"alpha", "beta", "gamma", "delta", "eps"}))
    print(os.getpid(), os.getppid(), socket.gethostname(), os.uname().nodename)
    print(id(object()), object())
    with open("/dev/urandom", "rb") as f:
        print(f.read(8).hex())
"""


def test_python_program_replays_bit_identical(tmp_path: Path) -> None:
    out = roundtrip(tmp_path, [PY, script(tmp_path, NONDETERMINISTIC)])
    again = subprocess.run([PY, str(tmp_path / "prog.py")], capture_output=True).stdout
    assert out != again  # the program really is nondeterministic without the tape


def test_threads_reading_clocks(tmp_path: Path) -> None:
    roundtrip(tmp_path, [PY, script(tmp_path, """
        import threading, time
        out = {}
        def work(i):
            out[i] = [time.monotonic_ns() for _ in range(200)][-1], time.time()
        for i in range(4):
            t = threading.Thread(target=work, args=(i,))
            t.start()
            t.join()
        print(sorted(out.items()))
    """)])



def test_contending_threads_with_cpu_work_clocks_and_lock_handoff(tmp_path: Path) -> None:
    # Four threads run at once and fight for the GIL (take_gil reads CLOCK_MONOTONIC a
    # scheduler-dependent number of times): only the reads made with the GIL held are the
    # program's, and each thread's are served from its own stream.
    roundtrip(tmp_path, [PY, script(tmp_path, """
        import threading, time
        N = 4
        turn = [threading.Lock() for _ in range(N + 1)]
        for lk in turn[1:]:
            lk.acquire()
        shared = threading.Lock()
        out = {}
        def work(i):
            acc, stamps = 0, []
            for k in range(120):
                for j in range(400):  # pure-Python CPU work: holds the GIL, forces switches
                    acc = (acc * 31 + j + i) % 1000003
                stamps.append(time.monotonic_ns())
                if k % 40 == 0:
                    with shared:
                        stamps.append(time.time_ns())
                    time.sleep(0.001)
            turn[i].acquire()  # hand-off in a fixed order, no timeouts
            stamps.append(time.perf_counter_ns())
            out[i] = (acc, len(stamps), stamps[-1], sum(stamps) % 1000003)
            turn[i + 1].release()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(sorted(out.items()), time.monotonic())
    """)])

def test_asyncio_sleep_and_timeout_replay_without_waiting(tmp_path: Path) -> None:
    prog = script(tmp_path, """
        import asyncio, time
        async def slow():
            await asyncio.sleep(5)
        async def main():
            t0 = time.monotonic()
            await asyncio.sleep(0.4)
            try:
                await asyncio.wait_for(slow(), 0.3)
            except asyncio.TimeoutError:
                print("timed out")
            print(time.monotonic() - t0, time.time())
        asyncio.run(main())
    """)
    steno, _ = record(tmp_path, [PY, prog])
    import time

    t0 = time.monotonic()
    code, rep = replay(tmp_path, steno)
    assert code == 0 and all(rep["identical"].values()), rep
    assert time.monotonic() - t0 < 0.7 + 1.5  # the 0.7 s of waits are not slept again


@pytest.mark.parametrize("argv", [
    ["date", "+%s.%N %c"],
    ["ls", "-f", "/usr/bin"],
    ["od", "-N16", "-tx1", "/dev/urandom"],
    ["mktemp", "-u"],
])
def test_coreutils(tmp_path: Path, argv: list[str]) -> None:
    roundtrip(tmp_path, argv)


def test_bash_pipeline_with_children(tmp_path: Path) -> None:
    out = roundtrip(tmp_path, ["bash", "-c",
                               "date +%N | cat; echo $RANDOM $$; "
                               "od -An -N4 -tx1 /dev/urandom | tr a-f A-F; "
                               "(sleep 0.2; date +%N) | sed s/^/t:/; mktemp -u"])
    assert out.count(b"\n") == 5


def test_changed_program_diverges_with_a_precise_report(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import time\nprint(time.time())\n")
    steno, _ = record(tmp_path, [PY, str(prog)])
    prog.write_text("import time, os\nprint(time.time(), os.urandom(4))\n"
                    "print(time.process_time())\n")
    code, rep = replay(tmp_path, steno, "--live", str(prog))  # not the recorded copy
    assert code == 1
    d = rep["divergences"][0]
    assert d["proc"] == "0" and d["thread"] == 0
    assert (d["channel"], d["recorded"]) in {("entropy", "end-of-stream"),
                                             ("clock", "end-of-stream")}
    assert d["asked"].startswith(("getrandom(size=4", "clock_gettime(clock=2)"))


def test_lenient_lists_divergences_and_finishes(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("import time\nprint(time.time())\n")
    steno, _ = record(tmp_path, [PY, str(prog)])
    prog.write_text("import os, time\nprint(time.time(), os.urandom(2)); print('done')\n")
    code, rep = replay(tmp_path, steno, "--lenient", "--live", str(prog))
    assert code == 1 and rep["divergences"]
    assert rep["exit_status"]["replayed"] == 0


@pytest.mark.parametrize("content,code", [
    (b"", 2),
    (b"garbage that is not a trajectory file at all" * 3, 2),
])
def test_garbage_steno_is_one_line(tmp_path: Path, content: bytes, code: int) -> None:
    bad = tmp_path / "bad.steno"
    bad.write_bytes(content)
    p = subprocess.run([*CLI, "replay", str(bad)], capture_output=True, timeout=60)
    lines = p.stderr.decode().strip().splitlines()
    assert p.returncode in (2, 3), p.stderr
    assert len(lines) == 1 and lines[0].startswith("stenograph: error: "), lines


def test_truncated_steno_is_corrupt(tmp_path: Path) -> None:
    steno, _ = record(tmp_path, ["date"])
    data = steno.read_bytes()
    cut = tmp_path / "cut.steno"
    cut.write_bytes(data[: len(data) * 2 // 3])
    p = subprocess.run([*CLI, "replay", str(cut)], capture_output=True, timeout=60)
    lines = p.stderr.decode().strip().splitlines()
    assert p.returncode in (2, 3) and len(lines) == 1, p.stderr
    assert lines[0].startswith("stenograph: error: ")


def test_changed_directory_is_reported_as_drift_and_served_as_recorded(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    for n in ["c", "a", "b"]:
        (d / n).touch()
    prog = script(tmp_path, f"""
        import os
        print(os.listdir({str(d)!r}))
    """)
    steno, out = record(tmp_path, [PY, prog])
    assert out == b"['a', 'b', 'c']\n"
    code, rep = replay(tmp_path, steno)
    assert code == 0 and rep["drift"] == [], rep
    (d / "b").unlink()
    (d / "z").touch()  # same count, other names: the digest sees it
    code, rep = replay(tmp_path, steno, "--live", str(d))  # sealed, it would see the old
    assert code == 0 and rep["identical"]["stdout"], rep
    assert len(rep["drift"]) == 1 and str(d) in json.dumps(rep["drift"]), rep


def test_pid_is_the_recorded_one_even_while_the_tape_is_paused(tmp_path: Path) -> None:
    """Python hooks pause the tape; code they run (asyncio compares its loop's pid with
    os.getpid()) must still see the pid the program saw, not the live one."""
    prog = script(tmp_path, """
        import asyncio, ctypes, os
        shim = ctypes.CDLL(None)
        before = os.getpid()
        shim.steno_pause()
        paused = os.getpid(), os.getppid()
        shim.steno_resume()
        async def main():
            shim.steno_pause()
            try:
                return asyncio.get_running_loop() is not None
            finally:
                shim.steno_resume()
        print(before, paused, before == paused[0], asyncio.run(main()))
    """)
    out = roundtrip(tmp_path, [PY, prog])
    assert out.split()[-2:] == [b"True", b"True"], out


CLOCK_SITES = r"""
#include <stdio.h>
#include <time.h>
/* Two readers of the same clock; the order comes from a file the tape does not hold. */
__attribute__((noinline)) static long started(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_nsec;
}
__attribute__((noinline)) static long finished(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_nsec + 1;
}
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "r");
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (c == 'a') printf("started %ld\n", started());
        if (c == 'b') printf("finished %ld\n", finished());
    }
    return 0;
}
"""


def test_a_clock_record_asked_for_at_another_call_site_is_a_divergence(tmp_path: Path) -> None:
    """Same clock, same arguments, another reader: caught where it happens, not served."""
    src = tmp_path / "sites.c"
    src.write_text(CLOCK_SITES)
    exe = tmp_path / "sites"
    subprocess.run([shutil.which("gcc") or "gcc", "-O1", "-o", str(exe), str(src)], check=True)
    order = tmp_path / "order"
    order.write_text("ab")
    steno, _ = record(tmp_path, [str(exe), str(order)])
    code, rep = replay(tmp_path, steno)
    assert code == 0 and rep["divergences"] == [], rep
    order.write_text("ba")
    code, rep = replay(tmp_path, steno, "--live", str(order))
    assert code == 1, rep
    d = rep["divergences"][0]
    assert d["channel"] == "clock" and d["position"] == 0, d
    assert "from site" in d["recorded"] and "from site" in d["asked"], d


GLIBC_TEMPNAMES = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    for fn, args in [("mkstemp", ()), ("mkostemp", (os.O_CLOEXEC,)), ("mkstemps", (4,))]:
        t = ctypes.create_string_buffer(b"/tmp/steno-t-XXXXXX" + (b".txt" if args == (4,) else b""))
        fd = getattr(libc, fn)(t, *args)
        print(fn, t.value.decode(), fd >= 0)
        os.close(fd); os.unlink(t.value)
    d = ctypes.create_string_buffer(b"/tmp/steno-d-XXXXXX")
    libc.mkdtemp.restype = ctypes.c_char_p
    print("mkdtemp", libc.mkdtemp(d).decode()); os.rmdir(d.value)
    bad = ctypes.create_string_buffer(b"/tmp/no-x")
    print("bad", libc.mkstemp(bad), ctypes.get_errno())
    with open("/proc/sys/kernel/random/uuid") as f:
        print("kernel uuid", f.read().strip())
"""


def test_glibc_temp_names_and_the_kernel_uuid_file(tmp_path: Path) -> None:
    """glibc's mkstemp family draws from a getrandom inside libc; the shim's own names come
    from the taped entropy. /proc/sys/kernel/random/uuid is entropy too."""
    out = roundtrip(tmp_path, [PY, script(tmp_path, GLIBC_TEMPNAMES)])
    assert out.count(b"/tmp/steno-") == 4 and b"bad -1 22" in out, out
    assert out.splitlines()[2].endswith(b".txt True")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_init_and_commit(tmp_path: Path) -> None:
    """git probes the file system with mkstemp names (git init) and stamps commits."""
    out = roundtrip(tmp_path, ["bash", "-c",
                               "d=$(mktemp -d) && cd $d && git init -q && "
                               "git -c user.email=a@b -c user.name=a commit -q --allow-empty "
                               "-m one && echo hi > f && git add f && "
                               "git -c user.email=a@b -c user.name=a commit -qm two && "
                               "git log --format='%H %ad' && cd / && rm -rf $d"])
    assert len(out.splitlines()) == 2, out


POOLS = {
    "multiprocessing": """
        import multiprocessing as mp, os
        if __name__ == "__main__":
            with mp.Pool(2) as p:
                print(sorted(p.map(abs, range(-6, 6))), os.getpid())
    """,
    "concurrent.futures": """
        import concurrent.futures as cf, os
        if __name__ == "__main__":
            with cf.ProcessPoolExecutor(2) as ex:
                print(sorted(ex.map(abs, range(-6, 6))), os.getpid())
    """,
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a_process_pool_records_and_a_diverged_replay_ends(tmp_path: Path, pool: str) -> None:
    """multiprocessing's locks are semaphores shared between processes: a recorded wait on
    one is woken by another process (it hung under record). Which worker takes which task
    is not ordered across processes, so a replay may diverge; it must then end with the
    report (exit 1), not wait for the dead worker for ever (nor for a worker orphaned
    when the main process diverged, which holds the output pipes open)."""
    steno, out = record(tmp_path, [PY, script(tmp_path, POOLS[pool])])
    assert out.startswith(b"[0, 1, 1, 2, 2, 3"), out
    code, rep = replay(tmp_path, steno)
    assert code in (0, 1), rep
    assert (code == 0) == (rep["divergences"] == [] and all(rep["identical"].values())), rep


def test_timeout_kills_its_command_where_the_recording_did(tmp_path: Path) -> None:
    """coreutils `timeout` kills its command's process group from a timer signal. At
    replay the killer's handler runs at its recorded point at once, long before the
    command has replayed its part (and before some of its processes exist): each victim
    dies of the signal where its own tape ends, and a process that exited when recorded
    outlives it.

    The loop prints with the shell's own `echo`: had `date` printed, a `date` the kill
    caught mid-run (sh killed while waiting for it) would be an orphan racing bash's
    `rc=124` to the shared stdout, an order no tape holds (docs/determinism.md, "the
    order of concurrent processes"): 1 recording in 40 beside three busy loops had the
    orphan's line first, and every replay of it printed `rc=124` first (CI failed so).
    With `echo`, each write comes before sh's death, which timeout waits for before it
    exits, which bash waits for before it prints: an order replay keeps."""
    steno, out = record(tmp_path, ["bash", "-c", "timeout 0.35 sh -c 'while :; do "
                                   "echo $(date +%N); sleep 0.1; done'; echo rc=$?"])
    assert out.endswith(b"rc=124\n") and out.count(b"\n") >= 3, out
    for _ in range(3):
        code, rep = replay(tmp_path, steno)
        assert code == 0 and rep["divergences"] == [] and all(rep["identical"].values()), rep
