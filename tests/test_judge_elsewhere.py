"""A recording made where the agent is deployed, judged in a checkout somewhere else:
the code is the checkout's (or the revision's), the data is the recording's.

The agent of ``agent_history`` is deployed by copying its first commit to
``srv/agent`` (no ``.git``), recorded there, and the deployment copy stays, with its old
code, as it would on the host. Then ``replay --build``, ``regress`` and ``bisect`` are
run from the repository (``src/agent``), a worktree of it and a CI-like clone at another
path; each must judge that checkout's code, not the deployment's: the planted commit is
found, a checkout before it matches. Real git, real processes, the real shim, the
loopback model server stopped before any judging.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_history import (
    AGENT,
    CLI,
    PLANTED,
    PY,
    SCRIPT,
    env,
    first_commit,
    git,
    record,
    the_rest,
)


@dataclass
class Deployed:
    repo: Path
    deploy: Path
    log: Path
    shas: list[str]
    planted: str
    tmp: Path

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=cwd, env=env(), capture_output=True,
                              text=True, timeout=timeout)

    def worktree(self, name: str, sha: str) -> Path:
        path = self.tmp / name
        if not path.exists():
            git(self.repo, "worktree", "add", "-q", "--detach", str(path), sha)
        return path


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    tmp = tmp_path_factory.mktemp("elsewhere")
    repo = tmp / "src" / "agent"
    repo.mkdir(parents=True)
    shas = [first_commit(repo)]
    deploy = tmp / "srv" / "agent"
    shutil.copytree(repo, deploy, ignore=shutil.ignore_patterns(".git"))
    log = tmp / "logs" / "run.steno"
    log.parent.mkdir()
    record(deploy, log, SCRIPT, [PY, "agent.py"])
    rest, planted = the_rest(repo)
    shas += rest
    assert shas.index(planted) == 7
    return Deployed(repo, deploy, log, shas, planted, tmp)


def _build_report(p: subprocess.CompletedProcess[str]) -> dict:
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_replay_build_runs_the_checkout_here_not_the_deployment(deployed: Deployed) -> None:
    d = deployed
    # the repository at its head: the planted commit is in it
    rep = _build_report(d.run("replay", "--build", "--json", str(d.log), cwd=d.repo))
    assert rep["code"] == [{"recorded": str(d.deploy), "here": str(d.repo)}]
    assert rep["divergences"], rep
    first = rep["divergences"][0]
    assert (first["turn"], first["channel"], first["kind"]) == (2, "model", "changed"), first
    assert [c["path"] for c in first["diff"]] == ["body $.messages[3].content"]
    # a worktree just before the planted commit matches, though the repository's newer
    # helper module and every harmless change are in it
    before = d.worktree("wt-before", d.shas[6])
    p = d.run("replay", "--build", "--json", str(d.log), cwd=before)
    rep = _build_report(p)
    assert p.returncode == 0 and rep["divergences"] == [], rep["divergences"]
    assert rep["code"] == [{"recorded": str(d.deploy), "here": str(before)}]
    # the deployment copy itself was never written
    assert (d.deploy / "agent.py").read_text() == AGENT
    assert sorted(x.name for x in d.deploy.iterdir()) == ["agent.py", "notes.txt"]


def test_a_typed_command_and_a_gone_deployment(deployed: Deployed) -> None:
    """``-- python agent.py`` typed in the checkout means the checkout's agent.py; with
    the deployment directory gone from this host, the recorded workspace still is the
    data."""
    d = deployed
    after = d.worktree("wt-after", d.planted)
    away = d.tmp / "srv" / "agent.away"
    d.deploy.rename(away)
    try:
        p = d.run("replay", "--build", "--json", str(d.log), "--", PY, "agent.py", cwd=after)
        rep = _build_report(p)
        assert p.returncode == 1 and rep["divergences"][0]["turn"] == 2, rep
        before = d.worktree("wt-before", d.shas[6])
        p = d.run("replay", "--build", "--json", str(d.log), "--", PY, "agent.py", cwd=before)
        assert p.returncode == 0, _build_report(p)["divergences"]
    finally:
        away.rename(d.deploy)


def test_an_explicit_map_from_anywhere(deployed: Deployed) -> None:
    d = deployed
    before = d.worktree("wt-before", d.shas[6])
    p = d.run("replay", "--build", "--json", "--map", f"{d.deploy}={before}", str(d.log),
              cwd=d.tmp)
    assert p.returncode == 0, _build_report(p)["divergences"]
    p = d.run("replay", "--build", "--json", "--map", f"{d.deploy}={d.repo}", str(d.log),
              cwd=d.tmp)
    assert p.returncode == 1, p.stderr
    # the pytest plugin takes the same map (unmapped, the deployment's code would pass)
    p = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--stenograph-logs", ".", "--stenograph-map", f"{d.deploy}={d.repo}"],
                       cwd=d.log.parent, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "1 failed" in p.stdout, p.stdout[-2000:]
    assert "turn 2" in p.stdout, p.stdout[-2000:]
    # from an unrelated directory with no map, the code at the recorded paths is judged
    # (the deployment's own, which matches), and the report says so
    p = d.run("replay", "--build", "--json", str(d.log), cwd=d.tmp)
    rep = _build_report(p)
    assert p.returncode == 0 and rep["code"] == "live at the recorded paths", rep
    for bad, want in [("nothing", "--map wants RECORDED=HERE"),
                      ("relative=.", "must be an absolute path"),
                      (f"{d.deploy}={d.tmp}/missing", "no such directory here")]:
        p = d.run("replay", "--build", "--map", bad, str(d.log), cwd=d.tmp)
        assert p.returncode == 2 and p.stdout == "", (bad, p.stdout, p.stderr)
        assert len(p.stderr.splitlines()) == 1 and want in p.stderr, p.stderr


def test_regress_from_a_ci_clone_at_another_path(deployed: Deployed) -> None:
    d = deployed
    ci = d.tmp / "ci" / "build" / "agent"
    git(d.tmp, "clone", "-q", str(d.repo), str(ci))
    p = d.run("regress", "--json", str(d.log.parent), cwd=ci)
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert [r["status"] for r in out["logs"]] == ["fail"], out
    assert out["logs"][0]["divergences"][0]["turn"] == 2, out
    git(ci, "checkout", "-q", d.shas[6])
    p = d.run("regress", "--json", str(d.log.parent), cwd=ci)
    assert p.returncode == 0, p.stdout


def test_bisect_in_the_repository_and_in_a_worktree(deployed: Deployed) -> None:
    d = deployed
    p = d.run("bisect", "--good", d.shas[0], "--bad", d.shas[-1], "--log", str(d.log),
              "--repo", str(d.repo), "--json", "--", PY, "agent.py", cwd=d.repo)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["first_bad"] == {"sha": d.planted, "subject": PLANTED}
    wt = d.worktree("wt-head", d.shas[-1])  # adjacent ends: two replays, the same answer
    p = d.run("bisect", "--good", d.shas[6], "--bad", d.planted, "--log", str(d.log),
              "--repo", str(wt), "--json", cwd=wt)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["first_bad"]["sha"] == d.planted
    assert (d.deploy / "agent.py").read_text() == AGENT
