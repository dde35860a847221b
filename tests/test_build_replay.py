"""`stenograph replay --build`: a recording of one build judged against another.

The program is the demo agent (examples/agent.py, the official openai SDK), with a
timestamp and a uuid4 put into its system prompt, recorded once in a workspace of its
own. Each test then edits the agent in that workspace the way a developer would -- the
build under test is the code as it is now -- and build-replays the recording:
incidental reads (clocks, entropy, uuids, listings, a new import) pass and fail exact
replay; a changed truncation rule fails at its turn with the diff; an extra model call
fails as unrecorded; a missing one as missing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from recorded_agent import CLI, Recorded, clean_env, incidental, record_agent


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    r = record_agent(tmp_path_factory.mktemp("build"))
    yield r


@pytest.fixture()
def agent(rec: Recorded) -> Iterator[Recorded]:
    yield rec
    rec.write(rec.source)


def test_the_recorded_build_matches(agent: Recorded) -> None:
    code, rep = agent.replay("--build")
    assert code == 0 and rep["divergences"] == [], rep
    assert rep["exit_status"] == {"recorded": 0, "replayed": 0}
    assert "identical" not in rep  # stdout is not compared unless asked


def test_incidental_reads_pass_build_replay_and_fail_exact_replay(agent: Recorded) -> None:
    agent.write(incidental(agent.source))
    code, rep = agent.replay("--build")
    assert code == 0 and rep["divergences"] == [], rep
    drift = rep["drift"]
    assert drift.get("clock", 0) > 0 and drift.get("entropy", 0) > 0, drift
    # the prompt's timestamp and uuid are the new build's own: masked, not a change
    assert drift.get("request values", 0) >= 1, drift
    code, exact = agent.replay("--live", str(agent.ws / "agent.py"))
    assert code == 1 and exact["divergences"], exact
    code, rep = agent.replay("--build", "--compare-output")
    assert code == 1 and rep["divergences"][0]["channel"] == "output", rep


def test_a_changed_truncation_rule_fails_at_its_turn_with_the_diff(agent: Recorded) -> None:
    agent.write(incidental(agent.source).replace("MAX_OUTPUT = 4000", "MAX_OUTPUT = 40"))
    code, rep = agent.replay("--build")
    assert code == 1, rep
    (d,) = rep["divergences"]
    # turn 2's tool (read_file of the script) is the first output longer than 40
    assert (d["turn"], d["channel"], d["kind"]) == (3, "model", "changed"), d
    paths = [c["path"] for c in d["diff"]]
    assert paths == ["body $.messages[5].content"], paths  # the stamped prompt is not shown
    assert d["diff"][0]["asked"] == d["diff"][0]["recorded"][:40]


def test_an_extra_model_call_fails_as_unrecorded(agent: Recorded) -> None:
    extra = agent.source.replace(
        '            print(f"final answer: {msg.content or \'\'}")\n',
        '            print(f"final answer: {msg.content or \'\'}")\n'
        '            client.chat.completions.create(model=a.model, messages=messages)\n')
    assert extra != agent.source
    agent.write(extra)
    code, rep = agent.replay("--build")
    assert code == 1, rep
    (d,) = rep["divergences"]
    assert (d["turn"], d["channel"], d["kind"]) == (5, "model", "unrecorded"), d
    # what the build asked, and how it differs from the last recorded model call
    assert d["request"]["method"] == "POST" and d["request"]["url"].endswith("/chat/completions")
    assert "tools" not in d["request"]["body"], d["request"]  # asked without tools
    assert d["nearest"] == 3 and d["nearest_is"] == "the last recorded call of its channel"
    tools = [c for c in d["diff"] if c["path"].startswith("body $.tools[")]
    assert tools and all(c["asked"] is None for c in tools), d["diff"]
    text = subprocess.run([*CLI, "replay", "--build", str(agent.steno)], cwd=agent.ws,
                          capture_output=True, text=True, timeout=120, env=clean_env()).stderr
    assert "(not in the recording)\n  asked: POST http" in text, text
    assert "against the last recorded call of its channel, #3:" in text, text


def test_a_missing_model_call_fails_as_missing(agent: Recorded) -> None:
    agent.write(agent.source.replace("MAX_STEPS = 10", "MAX_STEPS = 2"))
    code, rep = agent.replay("--build")
    assert code == 1, rep
    missing = [d for d in rep["divergences"] if d["kind"] == "missing"]
    assert [(d["turn"], d["channel"]) for d in missing] == [(3, "model"), (4, "model")], rep
    # each shows the recorded request, diffed against the last call the build made
    for d in missing:
        assert d["request"]["body"]["messages"][-1]["role"] == "tool", d["request"]
        assert d["nearest"] == 1 and d["diff"], d
        assert all(c["path"].startswith("body $.messages[") for c in d["diff"]), d["diff"]
        assert any(c["asked"] is None for c in d["diff"])  # messages the build never sent


def test_bad_flags_are_refused_before_anything_runs(agent: Recorded, tmp_path: Path) -> None:
    for flags in (["--build", "--lenient"], ["--compare-output"], ["--env", "X=1"],
                  ["--build", "--env", "NOEQUALS"]):
        p = subprocess.run([*CLI, "replay", *flags, str(agent.steno)], cwd=tmp_path,
                           capture_output=True, timeout=60, env=clean_env())
        err = p.stderr.decode().strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and err[0].startswith("stenograph: error:"), \
            (flags, err)

