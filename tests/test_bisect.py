"""`stenograph bisect`: the first commit whose build replay of a recorded run fails.

Real git, real processes, the real shim: a repository in pytest's temporary directory
holds a small tool-calling agent on the official ``openai`` SDK, recorded once at its
first commit against the loopback ``ModelServer``; the server is stopped before any
bisect, so every model reply comes from the log. 15 more commits follow, all harmless
(comments, an extra ``time.time()``, ``uuid.uuid4()``, ``os.listdir``, a new helper
module) but one in the middle that cuts tool output shorter, so the request of turn 2
changes. The bisect must name that commit and leave the user's checkout exactly as it
was: every byte under the work tree and ``.git``, HEAD, no bisect state, no worktree.

A second repository is a package (``pyproject.toml`` with an in-tree build backend, so
``pip install -e`` works offline) run as ``python -m agentpkg`` from a venv: its
planted commit changes only the version in ``pyproject.toml``, which the agent puts in
its prompt through ``importlib.metadata``, so only a bisect that installs each revision
whose packaging changed finds it; a commit whose ``pyproject.toml`` does not parse must
be skipped, not called bad.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_history import (
    CLI,
    NOTES,
    PLANTED,
    PY,
    SCRIPT,
    Edit,
    commit,
    env,
    first_commit,
    git,
    record,
    sub,
    the_rest,
)

from stenograph.ci.bisect_step import Plan, Run, command
from stenograph.runner.buildcode import python_mode


@dataclass
class Repo:
    path: Path
    log: Path
    shas: list[str]
    planted: str
    tmp: Path

    def state(self) -> dict[str, str]:
        """Every file under the work tree, .git included, by content: what "untouched"
        means here."""
        out = {}
        for p in sorted(self.path.rglob("*")):
            rel = str(p.relative_to(self.path))
            out[rel] = "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        return out

    def bisect(self, *args: str) -> subprocess.CompletedProcess[str]:
        scratch = self.tmp / "tmpdir"  # the command's TMPDIR: left empty afterwards
        scratch.mkdir(exist_ok=True)
        p = subprocess.run([*CLI, "bisect", *args], cwd=self.tmp, env=env(TMPDIR=str(scratch)),
                           capture_output=True, text=True, timeout=300)
        assert list(scratch.iterdir()) == [], "bisect left temporary files behind"
        return p

    def assert_untouched(self, before: dict[str, str], head: str) -> None:
        assert self.state() == before  # first: git status below refreshes the index
        assert git(self.path, "rev-parse", "HEAD").stdout.strip() == head
        assert git(self.path, "status", "--porcelain", "--ignored").stdout == ""
        assert git(self.path, "bisect", "log", check=False).returncode != 0
        assert not (self.path / ".git" / "BISECT_LOG").exists()
        assert len(git(self.path, "worktree", "list").stdout.splitlines()) == 1


@pytest.fixture(scope="module")
def agent_repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    tmp = tmp_path_factory.mktemp("bisect")
    repo = tmp / "agent"
    repo.mkdir()
    shas = [first_commit(repo)]
    log = tmp / "run.steno"
    record(repo, log, SCRIPT, [PY, "agent.py"])
    rest, planted = the_rest(repo)
    shas += rest
    assert len(shas) == 16 and shas.index(planted) == 7
    return Repo(repo, log, shas, planted, tmp)


def test_finds_the_planted_commit_and_leaves_the_checkout_alone(agent_repo: Repo) -> None:
    r = agent_repo
    before, head = r.state(), r.shas[-1]
    p = r.bisect("--good", r.shas[0], "--bad", r.shas[-1], "--log", str(r.log),
                 "--repo", str(r.path), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["first_bad"] == {"sha": r.planted, "subject": PLANTED}
    assert (out["good"], out["bad"], out["log"]) == (r.shas[0], r.shas[-1], str(r.log))
    d = out["divergence"]
    assert (d["turn"], d["channel"], d["kind"]) == (2, "model", "changed")
    assert [c["path"] for c in d["diff"]] == ["body $.messages[3].content"]
    assert d["diff"][0]["recorded"] == NOTES and d["diff"][0]["asked"] == NOTES[:200]
    steps = out["steps"]
    assert [s["role"] for s in steps[:2]] == ["bad", "good"]
    assert [s["verdict"] for s in steps[:2]] == ["bad", "good"]
    assert 2 <= len(steps) - 2 <= 4  # log2 of the 14 commits in between
    for s in steps[2:]:
        i = r.shas.index(s["sha"])
        assert s["verdict"] == ("bad" if i >= 7 else "good"), (i, s)
    assert r.planted in {s["sha"] for s in steps}
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("step ")]
    assert len(progress) == len(steps)
    assert progress[0].startswith(f"step 1: {r.shas[-1][:10]} bad (")
    r.assert_untouched(before, head)


def test_prints_the_commit_and_its_divergence(agent_repo: Repo) -> None:
    """Adjacent ends: git bisect has nothing left to test once both are judged."""
    r = agent_repo
    before = r.state()
    p = r.bisect("--good", r.shas[6], "--bad", r.planted, "--log", str(r.log),
                 "--repo", str(r.path))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"first bad commit: {r.planted} {PLANTED}"
    assert lines[1].startswith("  run.steno: turn 2, model: model #1 POST http://127.0.0.1:")
    assert lines[1].endswith("/v1/chat/completions (changed)")
    assert lines[2] == "    body $.messages[3].content: (first difference at character 200)"
    assert lines[3].startswith("      recorded ...") and lines[3].endswith(f"({len(NOTES)} chars)")
    assert lines[4].startswith("      asked    ...") and lines[4].endswith('about " (200 chars)')
    assert lines[5].startswith("2 revisions replayed (0 by git bisect) in ")
    assert len(lines) == 6
    progress = p.stderr.splitlines()
    assert [ln.split(" (")[0] for ln in progress] == [
        f"step 1: {r.planted[:10]} bad", f"step 2: {r.shas[6][:10]} good"], p.stderr
    r.assert_untouched(before, r.shas[-1])


def _stepping(scratch: Path) -> bool:
    """Is a step of ``git bisect run`` (its plan lives under ``scratch``) running?"""
    p = subprocess.run(["pgrep", "-f", f"bisect_step .*{scratch}"], capture_output=True)
    return p.returncode == 0


def test_ctrl_c_ends_every_process_and_removes_the_clone(agent_repo: Repo) -> None:
    r = agent_repo
    before = r.state()
    scratch = r.tmp / "tmpdir-int"
    scratch.mkdir()
    err = r.tmp / "int.err"
    with open(err, "w") as sink:
        # a terminal's Ctrl-C: SIGINT to the foreground process group
        proc = subprocess.Popen([*CLI, "bisect", "--good", r.shas[0], "--bad", r.shas[-1],
                                 "--log", str(r.log), "--repo", str(r.path)], cwd=r.tmp,
                                env=env(TMPDIR=str(scratch)), stdout=subprocess.DEVNULL,
                                stderr=sink, start_new_session=True,
                                # a job a shell started in the background inherits SIGINT
                                # ignored (so would this whole suite): a terminal's own
                                # foreground job does not
                                preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                 signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 60
            while not _stepping(scratch) and time.monotonic() < deadline:
                assert proc.poll() is None, err.read_text()
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGINT)  # a step of git bisect run is running now
            assert proc.wait(30) == 130
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert err.read_text().splitlines()[-1] == "stenograph: error: aborted"
    assert list(scratch.iterdir()) == []
    left = subprocess.run(["pgrep", "-af", str(scratch)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
    r.assert_untouched(before, r.shas[-1])


def _one_error_line(p: subprocess.CompletedProcess[str], steps: int = 0) -> str:
    """Exit 2, nothing on stdout, one error line on stderr after ``steps`` progress lines."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == steps + 1, p.stderr
    assert all(ln.startswith(f"step {i + 1}: ") for i, ln in enumerate(lines[:-1])), p.stderr
    assert lines[-1].startswith("stenograph: error: "), p.stderr
    return lines[-1]


@pytest.mark.parametrize("case", ["unknown-rev", "not-ancestor", "same", "missing-log",
                                  "not-a-run", "not-a-repo"])
def test_bad_input_is_one_line_and_changes_nothing(agent_repo: Repo, case: str) -> None:
    r = agent_repo
    good, bad, log, repo = r.shas[0], r.shas[-1], str(r.log), str(r.path)
    if case == "unknown-rev":
        good = "no-such-rev"
    elif case == "not-ancestor":
        good, bad = r.shas[-1], r.shas[0]
    elif case == "same":
        bad = good
    elif case == "missing-log":
        log = str(r.tmp / "missing.steno")
    elif case == "not-a-run":
        log = str(r.path / "notes.txt")
    elif case == "not-a-repo":
        repo = str(r.tmp)
    before = r.state()
    line = _one_error_line(r.bisect("--good", good, "--bad", bad, "--log", log,
                                    "--repo", repo))
    want = {"unknown-rev": "--good: no such commit in the repository (no-such-rev)",
            "not-ancestor": "is not an ancestor of --bad",
            "same": "--good and --bad are the same commit",
            "missing-log": f"no such file ({log})",
            "not-a-run": "wrong magic",
            "not-a-repo": f"--repo is not a git work tree ({repo})"}[case]
    assert want in line, line
    r.assert_untouched(before, r.shas[-1])


def test_a_bad_revision_that_does_not_fail_is_refused(agent_repo: Repo) -> None:
    r = agent_repo
    before = r.state()
    p = r.bisect("--good", r.shas[0], "--bad", r.shas[5], "--log", str(r.log),
                 "--repo", str(r.path))
    line = _one_error_line(p, steps=1)
    assert line == (f"stenograph: error: the --bad revision {r.shas[5][:12]} does not fail: "
                    "its build replay of run.steno matches; nothing to bisect")
    r.assert_untouched(before, r.shas[-1])


def test_a_good_revision_that_fails_is_refused(agent_repo: Repo) -> None:
    r = agent_repo
    p = r.bisect("--good", r.shas[8], "--bad", r.shas[-1], "--log", str(r.log),
                 "--repo", str(r.path))
    line = _one_error_line(p, steps=2)
    assert line == (f"stenograph: error: the --good revision {r.shas[8][:12]} fails too: "
                    "run.steno diverges at turn 2, model; give an older --good")


# -- a packaged agent ---------------------------------------------------------------

BACKEND = '''"""A PEP 517 build backend in the tree: enough for `pip install -e`, offline."""
import base64
import hashlib
import os
import tomllib
import zipfile


def _project():
    with open("pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _wheel(directory, files):
    p = _project()
    dist = f"{p['name']}-{p['version']}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\\nName: {p['name']}\\n"
                                 f"Version: {p['version']}\\n")
    files[f"{dist}/WHEEL"] = ("Wheel-Version: 1.0\\nGenerator: inbackend\\n"
                              "Root-Is-Purelib: true\\nTag: py3-none-any\\n")
    rows = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(data)}")
    files[f"{dist}/RECORD"] = "\\n".join([*rows, f"{dist}/RECORD,,"]) + "\\n"
    name = f"{p['name']}-{p['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"__editable__.agentpkg.pth": os.path.abspath(".") + "\\n"})
'''

PYPROJECT = '''[build-system]
requires = []
build-backend = "inbackend"
backend-path = ["."]

[project]
name = "agentpkg"
version = "1.0"
'''

PKG_MAIN = '''"""agentpkg's agent: its version is in its prompt."""
from importlib.metadata import version

from openai import OpenAI

client = OpenAI()
messages = [{"role": "system", "content": f"You are agentpkg {version('agentpkg')}."},
            {"role": "user", "content": "Say hello."}]
reply = client.chat.completions.create(model="steno-test", messages=messages)
print(reply.choices[0].message.content)
'''

PKG_COMMITS: list[tuple[str, list[Edit]]] = [
    ("a comment", [sub("agentpkg/__main__.py", "client = OpenAI()",
                        "# the model\nclient = OpenAI()")]),
    ("describe the package", [sub("pyproject.toml", 'version = "1.0"\n',
                                   'version = "1.0"\ndescription = "an agent"\n')]),
    ("pyproject that does not parse", [sub("pyproject.toml", 'description = "an agent"',
                                            'description = "an agent')]),
    ("fix pyproject", [sub("pyproject.toml", 'description = "an agent',
                            'description = "an agent"')]),
    ("agentpkg 1.1", [sub("pyproject.toml", 'version = "1.0"', 'version = "1.1"')]),
    ("another comment", [sub("agentpkg/__main__.py", "# the model", "# the model it talks to")]),
]


def _venv_seeing_ours(where: Path) -> Path:
    """A venv whose python also sees this interpreter's packages (openai): the agent's."""
    subprocess.run([PY, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    dirs = json.loads(subprocess.check_output(
        [PY, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"]))
    purelib = subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True)
    Path(purelib.strip(), "base.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    return py


@pytest.fixture(scope="module")
def package_repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    tmp = tmp_path_factory.mktemp("bisect-pkg")
    repo = tmp / "agentpkg"
    (repo / "agentpkg").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "inbackend.py").write_text(BACKEND)
    (repo / "agentpkg" / "__init__.py").write_text("")
    (repo / "agentpkg" / "__main__.py").write_text(PKG_MAIN)
    shas = [commit(repo, "agentpkg 1.0")]
    py = _venv_seeing_ours(tmp / "venv")
    quiet = env(PYTHONDONTWRITEBYTECODE="1")  # nothing written into the checkout
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "-e", str(repo)], check=True, env=quiet, cwd=tmp)
    log = tmp / "pkg.steno"
    record(repo, log, [{"text": "Hello."}], [str(py), "-m", "agentpkg"],
            PYTHONDONTWRITEBYTECODE="1")
    planted = ""
    for message, edits in PKG_COMMITS:
        for edit in edits:
            edit(repo)
        shas.append(commit(repo, message))
        if message == "agentpkg 1.1":
            planted = shas[-1]
    # a branch where the commit that cannot be installed comes just before the bad one
    git(repo, "checkout", "-q", "-b", "side", shas[3])
    sub("pyproject.toml", 'description = "an agent', 'description = "an agent"')(repo)
    sub("pyproject.toml", 'version = "1.0"', 'version = "1.1"')(repo)
    shas.append(commit(repo, "fix pyproject, agentpkg 1.1"))
    git(repo, "checkout", "-q", "main")
    return Repo(repo, log, shas, planted, tmp)


@pytest.mark.soak  # (10 CPU-seconds of make test's budget; the bisect itself stays)
def test_a_package_is_installed_per_revision_and_a_broken_one_skipped(
        package_repo: Repo) -> None:
    r = package_repo
    before = r.state()
    p = r.bisect("--good", r.shas[0], "--bad", "main", "--log", str(r.log),
                 "--repo", str(r.path), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["first_bad"] == {"sha": r.planted, "subject": "agentpkg 1.1"}
    d = out["divergence"]
    assert (d["turn"], d["channel"]) == (1, "model")
    assert d["diff"] == [{"path": "body $.messages[0].content",
                          "recorded": "You are agentpkg 1.0.", "asked": "You are agentpkg 1.1."}]
    verdicts = {r.shas.index(s["sha"]): s for s in out["steps"]}
    broken = verdicts.get(3)  # git tests the middle one first
    assert broken is not None and broken["verdict"] == "skip", out["steps"]
    assert broken["reason"].startswith("pip install -e failed: "), broken
    assert all(s["verdict"] == ("bad" if i >= 5 else "good")
               for i, s in verdicts.items() if i != 3), out["steps"]
    r.assert_untouched(before, r.shas[6])


def test_skipped_revisions_can_leave_it_undecided(package_repo: Repo) -> None:
    """On the branch the commit before the bad one cannot be installed: either could be
    the first bad one, and the bisect says so instead of guessing."""
    r = package_repo
    before = r.state()
    side = r.shas[7]
    p = r.bisect("--good", r.shas[0], "--bad", "side", "--log", str(r.log),
                 "--repo", str(r.path), "--json")
    assert p.returncode == 2, p.stderr
    out = json.loads(p.stdout)
    assert out["first_bad"] is None and out["bad"] == side
    assert {c["sha"] for c in out["candidates"]} == {r.shas[3], side}, out
    why = {c["sha"]: c["reason"] for c in out["candidates"]}
    assert why[r.shas[3]].startswith("pip install -e failed: ") and why[side] is None
    r.assert_untouched(before, r.shas[6])


# -- the command each step replays ------------------------------------------------------


def test_the_command_is_pointed_at_the_revision(tmp_path: Path) -> None:
    repo, work = tmp_path / "repo", tmp_path / "clone"
    for d in (repo / "pkg", work / "pkg", work / "src"):
        d.mkdir(parents=True)
    (work / "agent.py").write_text("")
    (work / "config.toml").write_text("")
    plan = Plan(repo=str(repo), work=str(work), tmp=str(tmp_path), runs=[], cmd=None,
                base_python=PY, timeout=60)
    run = Run(log="x.steno", cwd=str(repo),
              argv=["/usr/bin/python3", "-u", "agent.py", f"--config={repo}/config.toml",
                    "--data", str(repo), "/etc/hosts", "notes.txt"],
              pythonpath=f"{repo}/pkg:/opt/lib", mapped={"notes.txt": "blob"})
    argv, env = command(plan, run, None)
    assert argv == ["/usr/bin/python3", "-u", f"{work}/agent.py", f"--config={work}/config.toml",
                    "--data", str(repo), "/etc/hosts", f"{work}/notes.txt"]
    assert env == {"PYTHONPATH": f"{work}:{work}/src:{work}/pkg:/opt/lib"}
    # python -m in the repository: its working directory would come first on sys.path,
    # and the sealed replay shows the recorded code there
    run = Run(log="x.steno", cwd=str(repo / "pkg"), argv=["python3.11", "-m", "tool", "x"],
              pythonpath=None)
    argv, env = command(plan, run, str(tmp_path / "venv" / "bin" / "python"))
    assert argv == [str(tmp_path / "venv" / "bin" / "python"), "-m", "tool", "x"]
    assert env == {"PYTHONSAFEPATH": "1", "PYTHONPATH": f"{work}/pkg:{work}:{work}/src"}
    assert python_mode(["python", "-X", "dev", "-W", "error", "s.py", "-m"]) == (5, None)
    assert python_mode(["python", "-um", "mod"]) == (None, "-m")
    assert python_mode(["python", "-c", "print()"]) == (None, "-c")
