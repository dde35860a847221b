"""A directory of recordings as a regression suite: `stenograph regress` (parallel,
JUnit, failures grouped by first-divergence site) and the pytest plugin
(`pytest --stenograph-logs DIR`, run in a subprocess on a temp dir of logs). Two
recordings of the demo agent in workspaces of their own; after recording, one
workspace's agent gets a changed truncation rule, so exactly that log must fail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from recorded_agent import CLI, clean_env, record_agent


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("regress")
    ok = record_agent(root, "ok")
    broken = record_agent(root, "broken")
    broken.write(broken.source.replace("MAX_OUTPUT = 4000", "MAX_OUTPUT = 40"))
    d = root / "logs"
    (d / "a").mkdir(parents=True)
    (d / "b").mkdir()
    shutil.copy(ok.steno, d / "a" / "ok.steno")
    shutil.copy(broken.steno, d / "b" / "broken.steno")
    (d / "notes.txt").write_text("not a log")
    return d


def test_regress_runs_every_log_groups_the_failure_and_writes_junit(
        logs: Path, tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    p = subprocess.run([*CLI, "regress", str(logs), "-j", "2", "--junit", str(junit),
                        "--json"], capture_output=True, timeout=300, env=clean_env())
    assert p.returncode == 1, p.stderr.decode(errors="replace")[-3000:]
    out = json.loads(p.stdout)
    assert {o["file"]: o["status"] for o in out["logs"]} == {"a/ok.steno": "pass",
                                                               "b/broken.steno": "fail"}
    s = out["summary"]
    assert (s["passed"], s["failed"], s["errors"], s["jobs"]) == (1, 1, 0, 2)
    (group,) = s["groups"]
    assert group["files"] == ["b/broken.steno"]
    assert group["site"] == "changed model call at turn 3, body $.messages[5].content"
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"a/ok.steno", "b/broken.steno"}
    failure = cases["b/broken.steno"].find("failure")
    assert failure is not None and "turn 3" in (failure.text or "")
    assert cases["a/ok.steno"].find("failure") is None
    p = subprocess.run([*CLI, "regress", str(logs / "a")], capture_output=True, timeout=300,
                       env=clean_env())
    assert p.returncode == 0 and b"1 of 1 log(s) match" in p.stderr, p.stderr[-2000:]


def test_the_pytest_plugin_collects_one_test_per_log_and_fails_the_right_one(
        logs: Path, tmp_path: Path) -> None:
    run = tmp_path / "empty"
    run.mkdir()
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--stenograph-logs",
            str(logs)]
    p = subprocess.run([*base, "--collect-only", "-q"], cwd=run, capture_output=True,
                       timeout=120, env=clean_env())
    listed = p.stdout.decode()
    assert "a/ok.steno" in listed and "b/broken.steno" in listed, listed
    p = subprocess.run(base, cwd=run, capture_output=True, timeout=300, env=clean_env())
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 1, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "b/broken.steno: changed model call at turn 3" in out, out[-3000:]
    assert "body $.messages[5].content" in out
    p = subprocess.run([*base, "-k", "not broken"], cwd=run, capture_output=True, timeout=300,
                       env=clean_env())
    assert p.returncode == 0 and b"1 passed" in p.stdout, p.stdout[-2000:]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "nologs"
    empty.mkdir()
    for target in (tmp_path / "missing", empty):
        p = subprocess.run([*CLI, "regress", str(target)], capture_output=True, timeout=60,
                           env=clean_env())
        err = p.stderr.decode().strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and "error" in err[0], err
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                        "--stenograph-logs", str(tmp_path / "missing")], cwd=empty,
                       capture_output=True, timeout=60, env=clean_env())
    assert p.returncode == 4 and b"no such directory" in p.stderr + p.stdout
