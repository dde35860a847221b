"""One revision of a bisect, judged (``stenograph bisect``, ``ci/bisect.py``).

``git bisect run`` starts ``python -P -m stenograph.ci.bisect_step PLAN`` at each revision it
picks. ``Plan`` (written as JSON by the command) says what the step needs; the step
points the recorded command at the revision's checkout (``tracked_args``, ``command``),
installs the revision's package into a private venv when its packaging changed
(``prepare_packaging``), build-replays every log (``judge``) and answers in
``git bisect run``'s terms: 0 good, 1 bad, 125 skip (a replay that could not judge), 255
stop (the step itself failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stenograph.errors import BadInput
from stenograph.recorder.inputs import input_file
from stenograph.runner.buildcode import CodeMap, candidates, inside, is_python, point

PACKAGING = ("pyproject.toml", "setup.py", "setup.cfg")
"""Files whose change means the revision must be installed again (``pip install -e``)."""

GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                   "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_PREFIX",
                   "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES")
"""Set inside a git hook or alias, these would point our git commands at another
repository than the one named."""

SKIP, ABORT = 125, 255
"""``git bisect run``: 125 skips a revision; 128 and above stop the bisect (our own bug)."""


@dataclass
class Run:
    """One recorded run: its log and what its RunStarted says (command, directory)."""

    log: str
    argv: list[str]
    cwd: str | None
    pythonpath: str | None
    path: str | None = None
    """The recorded ``PATH``: where a bare ``python`` of the command was found."""
    mapped: dict[str, str] = field(default_factory=dict)
    """Repository-relative path -> ``blob`` or ``tree``, for each argument naming a path
    the good or the bad revision tracks."""


@dataclass
class Plan:
    """What every step needs; the step process reads it from ``plan.json``."""

    repo: str
    work: str
    tmp: str
    runs: list[Run]
    cmd: list[str] | None
    base_python: str
    timeout: float

    def save(self) -> Path:
        path = Path(self.tmp) / "plan.json"
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: str) -> Plan:
        doc = json.loads(Path(path).read_text())
        doc["runs"] = [Run(**r) for r in doc["runs"]]
        return cls(**doc)

    @property
    def steps_file(self) -> Path:
        return Path(self.tmp) / "steps.jsonl"


# -- git ---------------------------------------------------------------------------


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROPPED}
    env.update(LC_ALL="C", LANGUAGE="C", GIT_TERMINAL_PROMPT="0")
    return env


def git(cwd: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        p = subprocess.run(["git", *args], cwd=cwd, env=git_env(), capture_output=True,
                           text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BadInput("git is not installed (not on PATH)") from None
    if check and p.returncode != 0:
        raise BadInput(f"git {args[0]} failed: {_last_line(p.stderr)}", cwd)
    return p


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


def work_tree(repo: str) -> str:
    """The top of the git work tree ``repo`` is in, or one ``BadInput`` line."""
    if not os.path.isdir(repo):
        raise BadInput("--repo: no such directory", repo)
    p = git(repo, "rev-parse", "--is-inside-work-tree", "--show-toplevel", check=False)
    out = p.stdout.split()
    if p.returncode != 0 or not out or out[0] != "true" or len(out) < 2:
        raise BadInput("--repo is not a git work tree", repo)
    return os.path.normpath(p.stdout.splitlines()[1])


def resolve(repo: str, rev: str, option: str) -> str:
    """The commit ``rev`` names, as a full sha."""
    if not rev or rev.startswith("-"):
        raise BadInput(f"{option}: not a revision", rev)
    p = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}",
             check=False)
    if p.returncode != 0:
        raise BadInput(f"{option}: no such commit in the repository", rev)
    return p.stdout.strip()


def subject(repo: str, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha).stdout.strip()


def _kind_at(repo: str, rev: str, rel: str) -> str | None:
    p = git(repo, "cat-file", "-t", f"{rev}:{rel}", check=False)
    kind = p.stdout.strip()
    return kind if p.returncode == 0 and kind in ("blob", "tree") else None


# -- the recorded command, pointed at a revision ------------------------------------


def recorded_run(log: str) -> Run:
    """A readable recorded run (exit 2 if not a file or not a run, 3 if corrupt)."""
    from stenograph.recorder.trajfile import read_trajectory

    path = input_file(log)
    if not os.access(path, os.R_OK):
        raise BadInput("--log: cannot read it (permission denied)", log)
    started = next((e.body for e in read_trajectory(path).events if e.kind == "RunStarted"),
                   None)
    if started is None:
        raise BadInput("--log: not a recorded run (no RunStarted event)", log)
    argv = started.get("argv")
    if not isinstance(argv, list) or not argv:
        raise BadInput("--log: the recorded run has no command", log)
    cwd = started.get("cwd")
    env = started.get("env") if isinstance(started.get("env"), dict) else {}
    pp, bin_path = env.get("PYTHONPATH"), env.get("PATH")
    return Run(log=str(path.resolve()), argv=[str(a) for a in argv],
               cwd=cwd if isinstance(cwd, str) else None,
               pythonpath=pp if isinstance(pp, str) else None,
               path=bin_path if isinstance(bin_path, str) else None)


def tracked_args(repo: str, argv: Sequence[str], cwd: str | None,
                 revs: Sequence[str]) -> dict[str, str]:
    """Which arguments name a path one of ``revs`` tracks (repo-relative -> blob/tree)."""
    out: dict[str, str] = {}
    for _i, _prefix, value in candidates(argv, cwd):
        rel = inside(value, repo)
        if rel is None or rel == "." or rel in out:
            continue
        for rev in revs:
            kind = _kind_at(repo, rev, rel)
            if kind:
                out[rel] = kind
                break
    return out


def command(plan: Plan, run: Run, venv_python: str | None) -> tuple[list[str], dict[str, str]]:
    """The command a step replays ``run`` with, and the ``--env`` it sets: pointed at the
    clone (``buildcode.point``) through the repository (every argument naming a file of
    it, tracked at the good or the bad revision or present in this one, names the same
    file of the clone) and, for a recording made outside the repository (a deployment
    copy), through its working directory, taken as the repository's top. A python
    interpreter becomes the private venv's when the revision has packaging; so does a
    console script the install made."""
    maps = [CodeMap(plan.repo, plan.work)]
    if run.cwd and inside(run.cwd, plan.repo) is None:
        maps.append(CodeMap(os.path.normpath(run.cwd), plan.work))
    argv, env = point(plan.cmd or run.argv, run.cwd, maps, run.pythonpath, run.mapped)
    if venv_python is not None:
        bin_dir = os.path.dirname(venv_python)
        name = os.path.basename(argv[0])
        if is_python(argv[0]):
            argv[0] = venv_python
        elif not name.startswith(("pip", "activate")) and os.path.isfile(
                os.path.join(bin_dir, name)):
            argv[0] = os.path.join(bin_dir, name)
    return argv, env


def base_interpreter(argv: Sequence[str], run: Run) -> str:
    """The interpreter the private venv is made from: the recorded one (``argv[0]`` as
    the recorded run found it, or the interpreter of a console script's ``#!`` line), so
    the venv sees the packages the agent ran with; else the one running stenograph."""
    exe: str | None = argv[0]
    if "/" not in argv[0]:
        exe = shutil.which(argv[0], path=run.path)
    elif not os.path.isabs(argv[0]) and run.cwd:
        exe = os.path.join(run.cwd, argv[0])
    if exe and is_python(exe) and os.access(exe, os.X_OK):
        return exe
    if exe and os.path.isfile(exe):
        with contextlib.suppress(OSError), open(exe, "rb") as f:
            line = f.readline(512)
            if line.startswith(b"#!"):
                parts = line[2:].decode(errors="replace").split()
                if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
                    parts = [shutil.which(parts[1], path=run.path) or parts[1]]
                if parts and is_python(parts[0]) and os.access(parts[0], os.X_OK):
                    return parts[0]
    return sys.executable


# -- one revision ------------------------------------------------------------------


class _Skip(Exception):
    """This revision cannot be judged (git bisect skips it); the message says why."""


def kill_group(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    """End ``proc``'s process group: SIGINT first, and ``grace`` seconds for the whole
    group to go (a replay removes its tape, a bisect step ends its own replay's group:
    ``git``, the leader there, is gone at once), then SIGKILL for whatever is left: a
    replayed program can outlive its ``stenograph replay``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or the group never looks empty
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.02)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_group(argv: Sequence[str], *, cwd: str, env: dict[str, str],
              timeout: float | None = None) -> tuple[int | None, str, str]:
    """Run ``argv`` in its own process group and wait: (exit status, or None when it ran
    out of time, stdout, stderr). Whatever stops the wait (a time-out, Ctrl-C) ends the
    whole group, and so does the end of ``argv``: no replayed program outlives its step."""
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        return None, out, err
    except BaseException:
        kill_group(proc)
        raise
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything it left running
    return proc.returncode, out, err


def _packaging_key(work: str) -> dict[str, str]:
    """Blob id of each packaging file at the revision checked out (none: no packaging)."""
    out = git(work, "ls-tree", "HEAD", "--", *PACKAGING).stdout
    key = {}
    for line in out.splitlines():
        meta, _tab, name = line.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            key[name] = parts[2]
    return key


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROPPED}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PIP_REQUIRE_VIRTUALENV="0")
    env.pop("PYTHONPATH", None)
    return env


def _make_venv(plan: Plan, venv: Path) -> str:
    """A venv of the recorded interpreter that sees that interpreter's packages.

    Not ``--system-site-packages``: made from a venv's python, that shows the base
    installation's site-packages, not the venv's, where the agent's dependencies are.
    A ``.pth`` adds the recorded interpreter's own site directories after the venv's."""
    base = plan.base_python
    env = _pip_env()
    rc, _out, err = run_group([base, "-m", "venv", "--without-pip", str(venv)], cwd=plan.tmp,
                              env=env, timeout=plan.timeout)
    if rc != 0:
        raise _Skip(f"cannot make a venv with {base}: {_last_line(err)}")
    rc, out, err = run_group(
        [base, "-c", "import json, site; print(json.dumps(site.getsitepackages() + "
         "([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])))"],
        cwd=plan.tmp, env=env, timeout=plan.timeout)
    py = str(venv / "bin" / "python")
    rc2, purelib, err2 = run_group([py, "-c", "import sysconfig; "
                                    "print(sysconfig.get_paths()['purelib'])"],
                                   cwd=plan.tmp, env=env, timeout=plan.timeout)
    if rc != 0 or rc2 != 0:
        raise _Skip(f"cannot read the site directories of {base}: {_last_line(err + err2)}")
    lines = [f"import site; site.addsitedir({d!r})" for d in json.loads(out)]
    Path(purelib.strip(), "zz-stenograph-bisect-base.pth").write_text("\n".join(lines) + "\n")
    return py


def prepare_packaging(plan: Plan) -> str | None:
    """The private venv's python with this revision installed, or None (no packaging).

    Installed again only when a packaging file changed since the last install: an
    editable install follows the clone's files from one checkout to the next."""
    key = _packaging_key(plan.work)
    if not key:
        return None
    venv = Path(plan.tmp) / "venv"
    state = Path(plan.tmp) / "venv-installed.json"
    py = str(venv / "bin" / "python")
    if state.is_file() and json.loads(state.read_text()) == key:
        return py
    if not venv.exists():
        py = _make_venv(plan, venv)
    state.unlink(missing_ok=True)
    env = _pip_env()
    args = ["install", "-q", "--no-deps", "-e", plan.work]

    def pip(runner: list[str], *extra: str) -> tuple[int | None, str]:
        rc, _out, err = run_group([*runner, *args, *extra], cwd=plan.tmp, env=env,
                                  timeout=plan.timeout)
        return rc, ("timed out" if rc is None else _last_line(err)) + (
            " (no pip)" if "No module named pip" in err else "")

    runner = [py, "-m", "pip"]
    rc, why = pip(runner, "--no-build-isolation")
    if rc != 0 and why.endswith("(no pip)"):  # the recorded env has no pip: ours, aimed there
        runner = [sys.executable, "-m", "pip", "--python", py]
        rc, why = pip(runner, "--no-build-isolation")
    if rc != 0:  # the build backend is not installed beside the agent: an isolated build
        rc, why2 = pip(runner)
        why = f"{why}; with build isolation: {why2}"
    if rc != 0:
        raise _Skip(f"pip install -e failed: {why}")
    state.write_text(json.dumps(key))
    return py


def _replay_env(plan: Plan) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROPPED}
    scratch = Path(plan.tmp) / "scratch"
    scratch.mkdir(exist_ok=True)
    env["TMPDIR"] = str(scratch)  # a killed replay's tape goes with our directory
    return env


def judge(plan: Plan) -> dict[str, Any]:
    """The verdict on the revision checked out in the clone: ``bad`` as soon as one log's
    build replay diverges (with that divergence), ``skip`` if one could not be judged
    (why), else ``good``. A replay that exits 1 without its JSON report crashed: that is
    a skip, not a divergence."""
    t0 = time.monotonic()
    sha = git(plan.work, "rev-parse", "HEAD").stdout.strip()
    res: dict[str, Any] = {"sha": sha, "verdict": "good"}
    reasons: list[str] = []
    try:
        venv_python = prepare_packaging(plan)
    except _Skip as exc:
        reasons.append(str(exc))
        venv_python = None
    for run in plan.runs if not reasons else []:
        argv, env = command(plan, run, venv_python)
        sets = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        rc, out, err = run_group(
            [sys.executable, "-P", "-m", "stenograph", "replay", "--build", run.log, "--json",
             "--code", "none", *sets, "--", *argv],
            cwd=plan.tmp, env=_replay_env(plan), timeout=plan.timeout)
        report = _report(out)
        name = os.path.basename(run.log)
        if rc == 1 and report is not None and report.get("divergences"):
            res.update(verdict="bad", log=run.log, divergence=report["divergences"][0],
                       divergences=len(report["divergences"]))
            break
        if rc == 0:
            continue
        if rc is None:
            reasons.append(f"{name}: the replay ran out of time ({plan.timeout:g} s)")
        elif rc in (2, 3):
            what = "refused" if rc == 2 else "found a corrupt log"
            reasons.append(f"{name}: the replay {what} (exit {rc}): {_last_line(err)}")
        else:
            reasons.append(f"{name}: the replay crashed (exit {rc}): {_last_line(err)}")
    if res["verdict"] != "bad" and reasons:
        res.update(verdict="skip", reason="; ".join(reasons))
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


def _report(out: str) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                return doc if isinstance(doc, dict) else None
    return None


def step_main(args: Sequence[str]) -> int:
    """The test ``git bisect run`` starts: judge the revision, note it, answer git."""
    if len(args) != 1:
        print("usage: python -m stenograph.ci.bisect_step PLAN", file=sys.stderr)
        return ABORT
    plan = Plan.load(args[0])
    try:
        res = judge(plan)
    except KeyboardInterrupt:
        return ABORT
    except Exception:  # our own bug: stop the bisect rather than call a revision bad
        (Path(plan.tmp) / "step-error.txt").write_text(traceback.format_exc())
        return ABORT
    with open(plan.steps_file, "a") as f:
        f.write(json.dumps(res) + "\n")
    return {"good": 0, "bad": 1}.get(res["verdict"], SKIP)


if __name__ == "__main__":
    sys.exit(step_main(sys.argv[1:]))
