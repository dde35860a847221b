"""One host, many agents (issue "One host, hundreds of agents"): every ``record --store S``
on the host writes through the store's host recorder (``stenograph serve``), which a
recording starts when none serves the store.

Real processes and a real store: agents record at once into one new store and each
trajectory is whole and replays bit for bit; the host recorder killed with SIGKILL in
the middle loses no acknowledged event and every recording stops with one line, then
resumes; another user's process is refused by its peer credentials; what stenograph
writes is its owner's alone; a recording of thousands of short-lived processes leaks no
descriptor and grows no memory. ``STENO_HOST_AGENTS`` and ``STENO_HOST_EXECS`` set the
sizes (``make soak``: 64 and 10,000).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stenograph.recorder.hostwire import LOCK_NAME, address
from stenograph.recorder.reader import StoreReader
from stenograph.testing.effect_service import EffectService

CLI = [sys.executable, "-m", "stenograph"]
PY = os.path.realpath(sys.executable)
AGENTS = int(os.environ.get("STENO_HOST_AGENTS", "8"))
EXECS = int(os.environ.get("STENO_HOST_EXECS", "800"))

AGENT = """
import os, random, sys, time
import requests
url, name, rounds, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
for i in range(rounds):
    t, r, ls = time.time(), random.random(), sorted(os.listdir("."))
    with open(f"notes-{name}.txt", "a") as f:
        f.write(f"{i} {r:.6f}\\n")
    paid = requests.post(url + "/payments", json={"amount": i, "to": name}).json()
    print(name, i, round(r, 6), len(ls), paid["to"], paid["amount"], flush=True)
    time.sleep(pause)
print(name, "done", flush=True)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _host_pid(store: Path) -> int:
    return int((store / LOCK_NAME).read_text().split()[0])


def _start(store: Path, cwd: Path, name: str, url: str, rounds: int, pause: float,
           ) -> subprocess.Popen[str]:
    d = cwd / name
    d.mkdir(exist_ok=True)
    (d / "agent.py").write_text(AGENT)
    return subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", name,
                             "--workspace", "none", "-o", str(cwd / f"{name}.steno"), "--",
                             PY, "agent.py", url, name, str(rounds), str(pause)],
                            cwd=d, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_agents_record_at_once_into_one_new_store(tmp_path: Path) -> None:
    """``AGENTS`` first recordings into a directory that does not exist yet: all succeed
    into one store (made once), through one host recorder, each trajectory whole."""
    store = tmp_path / "store"
    with EffectService() as svc:
        procs = {f"a{i}": _start(store, tmp_path, f"a{i}", svc.url, 3, 0.0)
                 for i in range(AGENTS)}
        outs = {n: p.communicate(timeout=300) for n, p in procs.items()}
        for n, p in procs.items():
            assert p.returncode == 0, (n, outs[n][1][-2000:])
            assert outs[n][0].rstrip().endswith(f"{n} done"), outs[n][0]
        assert len(svc.payments) == 3 * AGENTS
    serves = subprocess.run(["pgrep", "-f", f"stenograph serve {store}"],
                            capture_output=True, text=True).stdout.split()
    assert len(serves) == 1, serves  # one host recorder took them all
    events = list(StoreReader(store).events())
    assert {e.traj for e in events} == set(procs)
    for n in procs:
        kinds = [e.kind for e in events if e.traj == n]
        assert kinds[0] == "RunStarted" and kinds[-1] == "RunEnded", (n, kinds)
        assert kinds.count("ToolIntent") == 3, (n, kinds)
    status = json.loads(subprocess.run([*CLI, "status", "--json", str(store)],
                                       capture_output=True, text=True, check=True).stdout)
    assert {t["traj"]: t["state"] for t in status["trajectories"]} == dict.fromkeys(
        procs, "ended")
    for n in sorted(procs)[:: max(1, AGENTS // 4)]:  # each replays bit for bit
        rep = subprocess.run([*CLI, "replay", str(tmp_path / f"{n}.steno")],
                             cwd=tmp_path / n, env=_env(), capture_output=True, text=True,
                             timeout=120)
        assert rep.returncode == 0 and "bit-identical" in rep.stderr, (n, rep.stderr[-2000:])


def test_a_killed_host_recorder_loses_no_acknowledged_event(tmp_path: Path) -> None:
    """SIGKILL to the host recorder while six agents pay through it: every payment the
    service received has its intent in the store (durable before it left), every
    recording stops with one line saying so, and each trajectory resumes to its end
    (a new host recorder), every payment made exactly once."""
    store = tmp_path / "store"
    with EffectService() as svc:
        procs = {f"k{i}": _start(store, tmp_path, f"k{i}", svc.url, 8, 0.15)
                 for i in range(6)}
        deadline = time.monotonic() + 120
        while len(svc.payments) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        host = _host_pid(store)
        os.kill(host, signal.SIGKILL)
        outs = {n: p.communicate(timeout=120) for n, p in procs.items()}
        received = [(p["to"], p["amount"]) for p in svc.payments]
        for n, p in procs.items():
            lines = [ln for ln in outs[n][1].splitlines() if ln.startswith("stenograph:")]
            if p.returncode == 0:  # (it was done before the kill)
                continue
            assert p.returncode == 7, (n, p.returncode, outs[n][1][-2000:])
            assert len(lines) == 1 and "host recorder" in lines[0], (n, outs[n][1][-3000:])
            assert f"stenograph resume {store} {n}" in lines[0], lines
            assert "Traceback" not in outs[n][1], (n, outs[n][1][-3000:])  # told nothing
        intents = {(e.traj, e.body.get("body")) for e in StoreReader(store).events()
                   if e.kind == "ToolIntent"}
        durable = {(t, json.loads(b)["amount"]) for t, b in intents if isinstance(b, bytes)}
        missing = [(to, n) for to, n in received if (to, n) not in durable]
        assert not missing, f"payments made whose intent was lost: {missing}"
        for n, p in procs.items():
            if p.returncode == 0:
                continue
            res = subprocess.run([*CLI, "resume", str(store), n], cwd=tmp_path / n,
                                 env=_env(), capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, (n, res.stderr[-2000:])
        made = sorted((p["to"], p["amount"]) for p in svc.payments)
        assert made == sorted((n, i) for n in procs for i in range(8)), made
    assert _host_pid(store) != host


def test_another_users_process_is_refused_by_the_host_recorder(tmp_path: Path) -> None:
    """A store deep enough that its host recorder listens on an abstract socket (no file
    permission keeps anyone out): a process of another user is refused by its peer
    credentials, in one answer; the owner's is served."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    store = deep / "store"
    subprocess.run([*CLI, "log", "append", str(store), "--traj", "t", "--kind", "Note",
                    "--body", "{}"], check=True, capture_output=True)
    where = address(store)
    assert isinstance(where, bytes), "the test wants an abstract socket"
    host = subprocess.Popen([*CLI, "serve", str(store)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            probe = subprocess.run([*CLI, "status", "--json", str(store)],
                                   capture_output=True, text=True)
            if (store / "serve.sock").exists() or _serving(where):
                break
            time.sleep(0.05)
        client = ("import socket, sys\n"
                  "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                  f"s.connect({where!r})\n"
                  "s.settimeout(10)\n"
                  "print(s.recv(4096))\n")
        nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                                 "--clear-groups", "/usr/bin/python3", "-c", client],
                                capture_output=True, text=True, timeout=60)
        assert nobody.returncode == 0, nobody.stderr
        assert "may not write this store" in nobody.stdout, nobody.stdout
        ok = subprocess.run([*CLI, "log", "append", str(store), "--traj", "t", "--kind",
                             "Note", "--body", '{"by": "owner"}'], capture_output=True,
                            text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        assert probe.returncode == 0
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=30)


def _serving(where: bytes) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(where)
        except OSError:
            return False
    return True


def test_what_stenograph_writes_is_its_owners_alone(tmp_path: Path) -> None:
    """The store 0700 and every file in it 0600 (segments, blobs, snapshots, leases), the
    .steno and a kept tape 0600 (the workspace restored in it keeps its recorded modes,
    behind the tape's 0700) -- while the recorded program's own files keep the umask it
    was started with."""
    (tmp_path / "p.py").write_text("open('mine.txt', 'w').write('x')\nprint('ok')\n")
    store = tmp_path / "store"
    old = os.umask(0o022)
    try:
        rec = subprocess.run([*CLI, "record", "--store", str(store), "--traj", "t", "-o",
                              str(tmp_path / "t.steno"), "--", PY, "p.py"], cwd=tmp_path,
                             env=_env(), capture_output=True, text=True, timeout=120)
        assert rec.returncode == 0, rec.stderr
        tape = tmp_path / "tape"
        rep = subprocess.run([*CLI, "replay", "--keep-tape", str(tape),
                              str(tmp_path / "t.steno")], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert rep.returncode == 0, rep.stderr
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "mine.txt").stat().st_mode) == 0o644
    for root in (store, tape):
        assert stat.S_IMODE(root.stat().st_mode) == 0o700, root
        for p in root.rglob("*"):
            mode = stat.S_IMODE(p.lstat().st_mode)
            if p.is_symlink() or (root / "ws") in p.parents:
                continue  # (the workspace restored for the replay: its own modes, behind
                # the tape's 0700)
            want = 0o700 if p.is_dir() else 0o600
            assert mode & 0o077 == 0, (p, oct(mode), oct(want))
    assert stat.S_IMODE((tmp_path / "t.steno").stat().st_mode) == 0o600


EXEC_LOOP = """
import subprocess, sys
n, mark = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    subprocess.run(["/bin/true"])
    if i == n // 10 or i == n - 1:
        open(mark + str(i), "w").close()
        while not __import__("os").path.exists(mark + "go" + str(i)):
            __import__("time").sleep(0.01)
print("ran", n)
"""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_thousands_of_short_lived_processes_leak_no_descriptor(tmp_path: Path) -> None:
    """``EXECS`` recorded execs of /bin/true: the recorder's and the host recorder's
    descriptors and memory, counted at a tenth of the way and at the end, do not grow
    with the processes that came and went."""
    (tmp_path / "loop.py").write_text(EXEC_LOOP)
    store, mark = tmp_path / "store", str(tmp_path / "m")
    p = subprocess.Popen([*CLI, "record", "--store", str(store), "--traj", "t",
                          "--workspace", "none", "-o", str(tmp_path / "t.steno"), "--", PY,
                          "loop.py", str(EXECS), mark], cwd=tmp_path, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[tuple[int, float, int, float]] = []
    try:
        for i in (EXECS // 10, EXECS - 1):
            deadline = time.monotonic() + 600
            while not Path(mark + str(i)).exists():
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                time.sleep(0.02)
            time.sleep(0.3)  # the recorder drains the last processes' connections
            host = _host_pid(store)
            seen.append((_fds(p.pid), _rss_mb(p.pid), _fds(host), _rss_mb(host)))
            Path(f"{mark}go{i}").touch()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and f"ran {EXECS}" in out, err[-2000:]
    (f0, m0, hf0, hm0), (f1, m1, hf1, hm1) = seen
    assert f1 <= f0 + 4 and hf1 <= hf0 + 4, seen  # no descriptor per process kept
    assert m1 <= m0 + 40 and hm1 <= hm0 + 40, seen  # (MB) no memory per process kept
