"""stenograph as the user people are: record, replay, build replay and resume run as an
ordinary user (``nobody``, through ``setpriv``), with stenograph installed in a venv of
the system Python (``make test`` makes ``.venv-user``). Where the kernel allows user
namespaces the replay is sealed in one of the user's own (``"sealed": "user-namespace"``);
where it allows none (a seccomp filter on ``unshare``/``clone``, as containers have:
``programs/nouserns.c``) by the shim's path mapping (``"sealed": "path-map"``). Either
way each replay is bit-identical and the real workspace is left as it was, the tools the
program runs (bash, coreutils, git) included; a static program, which the mapping cannot
follow, is served whole (recorded whole, not run at replay).

Needs root to become another user; run as that user already, the rest of the suite is
this test.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from crashes import Run, go, service

ROOT = Path(__file__).resolve().parents[1]
USER_VENV = Path(os.environ.get("STENO_USER_VENV", ROOT / ".venv-user"))
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="becoming another user needs root and setpriv")

AGENT = """
import os, sys, tempfile, time, uuid
import requests
notes = open("notes.txt").read()
fd, name = tempfile.mkstemp(prefix="agent-")
os.write(fd, b"scratch")
os.close(fd)
with open("out.txt", "a") as f:
    f.write(f"run {uuid.uuid4()} at {time.time()}\\n")
print("uid", os.getuid(), "notes", len(notes), "files", sorted(os.listdir(".")))
print("tmp", os.path.basename(name))
if len(sys.argv) > 1:
    r = requests.post(sys.argv[1] + "/payments", json={"amount": 5, "to": "alice"})
    print("paid", r.status_code, r.json()["id"])
print("done", uuid.uuid4())
"""


def _user_python() -> str:
    py = USER_VENV / "bin" / "python"
    if not py.exists():  # make test builds it; a bare pytest run builds it here
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(USER_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True)
    return str(py)


@pytest.fixture(scope="module")
def user() -> Iterator[tuple[str, Path]]:
    """``(python, base)``: the user venv's interpreter and a directory of nobody's."""
    py = _user_python()
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="steno-user-", dir="/tmp"))
    base.chmod(0o755)
    os.chown(base, nobody.pw_uid, nobody.pw_gid)
    yield py, base
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(argv: list[str], base: Path) -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv]


def _env(base: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(base), "LANG": "C.UTF-8"}


def _run(argv: list[str], base: Path, cwd: Path, *, wrap: list[str] = (),
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*wrap, *_as_nobody(argv, base)], cwd=cwd, env=_env(base),
                          capture_output=True, text=True, timeout=180)


def _workspace(base: Path, name: str) -> Path:
    ws = base / name
    subprocess.run(_as_nobody(["mkdir", str(ws)], base), check=True)
    for fname, text in (("agent.py", AGENT), ("notes.txt", "remember the milk\n")):
        subprocess.run(_as_nobody(["sh", "-c", f"cat > {fname}"], base), cwd=ws,
                       input=text, text=True, check=True)
    return ws


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _no_userns(base: Path) -> list[str]:
    exe = base / "nouserns"
    if not exe.exists():
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(ROOT / "tests" / "programs" /
                                                           "nouserns.c")], check=True)
    return [str(exe)]


def _recorded(user: tuple[str, Path], name: str, wrap: list[str] = (),
              ) -> tuple[list[str], Path, subprocess.CompletedProcess[str]]:
    """The agent recorded as nobody in a new workspace ``name`` to ``name.steno``: the
    CLI, the workspace and the record's result."""
    py, base = user
    ws = _workspace(base, name)
    cli = [py, "-m", "stenograph"]
    rec = _run([*cli, "record", "-o", str(base / f"{name}.steno"), "--", py, "agent.py"],
               base, ws, wrap=wrap)
    assert rec.returncode == 0, rec.stderr
    return cli, ws, rec


@pytest.fixture(params=["user-namespace", "path-map"])
def seal(request: pytest.FixtureRequest, user: tuple[str, Path]) -> tuple[str, list[str]]:
    """``(kind, wrap)``: how the replays are sealed, and what the commands run under to
    make it so (nothing, or no user namespace to be had)."""
    kind = str(request.param)
    return kind, (_no_userns(user[1]) if kind == "path-map" else [])


def test_a_user_records_and_replays_sealed(user: tuple[str, Path],
                                           seal: tuple[str, list[str]]) -> None:
    base = user[1]
    kind, wrap = seal
    name = f"run-{kind}"
    cli, ws, rec = _recorded(user, name, wrap)
    assert f"uid {pwd.getpwnam('nobody').pw_uid} " in rec.stdout
    before = _digest(ws)
    for flags in ([], ["--build"]):
        rep = _run([*cli, "replay", str(base / f"{name}.steno"), "--json", *flags], base, ws,
                   wrap=wrap)
        assert rep.returncode == 0, (rep.stderr, rep.stdout[-4000:])
        report = json.loads(rep.stdout.splitlines()[-1])
        assert report["sealed"] == kind
        if not flags:
            assert report["divergences"] == [] and all(report["identical"].values()), report
    assert _digest(ws) == before, "a replay wrote into the real workspace"
    if kind == "user-namespace":  # judged from another directory, as another shell would
        rep = _run([*cli, "replay", str(base / f"{name}.steno")], base, base, wrap=wrap)
        assert rep.returncode == 0, (rep.stderr, rep.stdout[-4000:])
        assert "bit-identical" in rep.stderr
    # what it wrote, kept aside on request: the overlay's upper layer, or its likeness
    keep = base / f"kept-{kind}"
    rep = _run([*cli, "replay", str(base / f"{name}.steno"), "--keep-writes", str(keep)],
               base, ws, wrap=wrap)
    assert rep.returncode == 0, (rep.stderr, rep.stdout[-4000:])
    kept = {p.name for p in keep.rglob("*")}
    assert "out.txt" in kept, kept
    assert _digest(ws) == before


TOOLS = """
import os, subprocess, sys, tempfile
run = lambda cmd: subprocess.run(cmd, shell=True, capture_output=True, text=True)
t = tempfile.mkdtemp(prefix="tools-")
print(run("mkdir -p build/a/b && echo x > build/a/b/f && ls -R build | wc -l").stdout)
print(run("rm -r old && ls").stdout)
print(run(f"cp -r src {t}/src && find {t} -type f | sort | sed 's|{t}||'").stdout)
print(run("git add -A && git -c user.name=a -c user.email=a@b commit -qm two && "
          "git log --oneline | wc -l && git status --short").stdout)
print(run("cd src && tar cf ../src.tar . && cd .. && tar tf src.tar | sort").stdout)
print(run("cat .env | wc -c; readlink -f link; cd $(pwd)/src && /bin/pwd").stdout)
print(run(f"ls {t} && rm -r {t} && echo gone").stdout)
print(run("ls; cat node_modules/pkg/index.js; ls node_modules").stdout)  # left out: live
if len(sys.argv) > 1:
    print(run("/sbin/ldconfig -p | head -1").returncode)
"""


def _tools_workspace(base: Path, name: str) -> Path:
    ws = base / name
    script = (f"mkdir -p {ws}/src/pkg {ws}/old && cd {ws} && "
              "echo 'print(1)' > src/pkg/m.py && echo data > old/f && "
              "echo 'API_KEY=sk-live-0123456789abcdef0123' > .env && "
              "mkdir -p node_modules/pkg && echo 'module.exports = 1' > "
              "node_modules/pkg/index.js && "
              f"ln -s {ws}/src/pkg/m.py link && git init -q && git add -A && "
              "git -c user.name=a -c user.email=a@b commit -qm one && cat > tools.py")
    subprocess.run(_as_nobody(["sh", "-c", script], base), input=TOOLS, text=True,
                   check=True, env=_env(base))
    return ws


def test_tools_that_are_other_programs_replay_without_touching_the_workspace(
        user: tuple[str, Path], seal: tuple[str, list[str]]) -> None:
    py, base = user
    kind, wrap = seal
    ws = _tools_workspace(base, f"tools-{kind}")
    cli = [py, "-m", "stenograph"]
    steno = base / f"tools-{kind}.steno"
    rec = _run([*cli, "record", "-o", str(steno), "--", py, "tools.py"], base, ws, wrap=wrap)
    assert rec.returncode == 0, rec.stderr
    assert "gone" in rec.stdout and "module.exports = 1" in rec.stdout, rec.stdout
    assert "node_modules" in rec.stdout.split("module.exports")[0], rec.stdout
    subprocess.run(_as_nobody(["sh", "-c", "git reset -q --hard HEAD~1 && rm -rf build "
                                           "src.tar"],
                              base), cwd=ws, check=True, env=_env(base))
    before, tmp_before = _digest(ws), set(Path("/tmp").glob("tools-*"))
    rep = _run([*cli, "replay", str(steno), "--json"], base, ws, wrap=wrap)
    assert rep.returncode == 0, (rep.stderr, rep.stdout[-4000:])
    report = json.loads(rep.stdout.splitlines()[-1])
    assert report["sealed"] == kind
    assert report["divergences"] == [] and all(report["identical"].values()), report
    assert _digest(ws) == before, "a replay wrote into the real workspace"
    assert set(Path("/tmp").glob("tools-*")) == tmp_before, "a replay wrote into /tmp"


def test_a_static_program_under_path_mapping_is_served_whole(
        user: tuple[str, Path]) -> None:
    """``ldconfig`` is static: no loader carries the path mapping into it. Its exec was
    recorded whole (``shim_c/whole.c``), so the replay serves its output without running
    it, and nothing is refused."""
    py, base = user
    wrap = _no_userns(base)
    ws = _tools_workspace(base, "static")
    cli = [py, "-m", "stenograph"]
    steno = base / "static.steno"
    rec = _run([*cli, "record", "-o", str(steno), "--", py, "tools.py", "static"], base, ws,
               wrap=wrap)
    assert rec.returncode == 0, rec.stderr
    subprocess.run(_as_nobody(["sh", "-c", "git reset -q --hard HEAD~1 && rm -rf build "
                                           "src.tar"],
                              base), cwd=ws, check=True, env=_env(base))
    before = _digest(ws)
    rep = _run([*cli, "replay", str(steno), "--json"], base, ws, wrap=wrap)
    report = json.loads(rep.stdout.splitlines()[-1])
    assert rep.returncode == 0 and report["sealed"] == "path-map", report
    assert report["divergences"] == [] and all(report["identical"].values()), report
    assert _digest(ws) == before


def test_a_user_resumes_a_run_killed_at_its_payment_and_pays_once(
        user: tuple[str, Path], seal: tuple[str, list[str]]) -> None:
    py, base = user
    kind, wrap = seal
    ws = _workspace(base, f"ws-resume-{kind}")
    store = base / f"store-{kind}"
    cli = [py, "-m", "stenograph"]
    current = [Run(kill=("dispatch", 1))]
    with service(current) as svc:
        argv = [*cli, "record", "--store", str(store), "--traj", "t", "--", py, "agent.py",
                svc.url]
        rec = go(current[0], [*wrap, *_as_nobody(argv, base)], ws, _env(base))
        assert current[0].killed.is_set(), rec.stderr
        current[0] = Run(kill=None, resume=True)
        res = go(current[0], [*wrap, *_as_nobody([*cli, "resume", str(store), "t"], base)], ws,
                 _env(base))
        assert res.returncode == 0, res.stderr
        stats = svc.stats()
    assert stats["payments"] == 1 and stats["keys_reused"] == [], stats
    assert "paid 200" in res.stdout or "paid 201" in res.stdout, res.stdout
    out = (ws / "out.txt").read_text().splitlines()
    assert len(out) == 1, out  # the resumed run's write, once, in the real workspace
    assert (ws / "out.txt").stat().st_uid == pwd.getpwnam("nobody").pw_uid
