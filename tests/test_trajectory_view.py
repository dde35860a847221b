"""The trajectory view on real recordings: `show` against what the model server received,
and `diff` on divergences planted where each kind comes from (the model, the
environment, the harness). The agent is examples/agent.py (the openai SDK), recorded
under the real shim against the loopback model server; the server's script branches on
what the model is given, as a real model's reply would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from planted_agent import CLI, NOTES, env, record, script


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list]]:
    root = tmp_path_factory.mktemp("view")
    return {
        "base": record(root, "base"),
        # the model chose another file on the same context
        "model": record(root, "model", turns=script(
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "agent.py"}}]})),
        # the file the tool reads says something else
        "env": record(root, "env", notes="release notes: ship it.\nnothing to do.\n"),
        # the harness cuts tool output at 20 characters
        "harness": record(root, "harness", max_output=20),
        # a shell tool whose arguments do not name the file it reads, and the file differs
        "shell": record(root, "shell", turns=script(SHELL)),
        "shell-env": record(root, "shell-env", turns=script(SHELL),
                            notes="release notes: ship it.\nnothing to do.\n"),
    }


SHELL = {"tool_calls": [{"name": "run", "arguments": {"command": "cat n*"}}]}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env=env())


def test_show_turn_is_the_request_the_server_received(runs: dict) -> None:
    steno, received = runs["base"]
    assert len(received) == 4
    for n, want in enumerate(received, 1):
        p = cli("show", str(steno), "--turn", str(n), "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["turn"] == n
        assert doc["request"]["body"] == want
        assert doc["model"]["asked"] == want["model"]
    last = json.loads(cli("show", str(steno), "--turn", "3", "--json").stdout)
    assert [c["name"] for c in last["tool_calls"]] == ["run"]
    assert last["tool_results"][0]["content"].startswith("deploying web1")
    assert last["tool_results"][0]["source"] == "next request"
    assert last["checkpoint"] is not None


def test_show_lists_the_turns(runs: dict) -> None:
    p = cli("show", str(runs["base"][0]))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "4 turn(s)" in lines[0]
    assert "list_dir(path=.)" in lines[1]
    assert "read_file(path=notes.txt)" in lines[2]
    assert "run(command=echo deploying web1)" in lines[3]
    assert "answer: Done" in lines[4]
    doc = json.loads(cli("show", str(runs["base"][0]), "--json").stdout)
    assert [t["turn"] for t in doc["turns"]] == [1, 2, 3, 4]
    assert doc["record"]["tools_called"] == {"list_dir": 1, "read_file": 1, "run": 1}


def test_show_bad_turn_is_one_line(runs: dict) -> None:
    p = cli("show", str(runs["base"][0]), "--turn", "9")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "4 turn(s)" in p.stderr


def _diff(a: Path, b: Path) -> tuple[int, dict]:
    p = cli("diff", str(a), str(b), "--json")
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_diff_same_run_is_none(runs: dict) -> None:
    rc, d = _diff(runs["base"][0], runs["base"][0])
    assert rc == 0 and d["t_div"] is None and d["cause"] == "none"


def test_diff_model_side(runs: dict) -> None:
    rc, d = _diff(runs["base"][0], runs["model"][0])
    assert rc == 1
    assert d["t_div"] == 2 and d["context_identical"] is True and d["cause"] == "model"
    assert d["differences"][-1]["path"] == "reply"


def test_diff_environment_side(runs: dict) -> None:
    rc, d = _diff(runs["base"][0], runs["env"][0])
    assert rc == 1
    assert d["t_div"] == 3 and d["context_identical"] is False
    assert d["cause"] == "environment"
    first = d["differences"][0]
    assert "notes.txt" in first["source"] and "deploy web1" in first["a"]


def test_diff_harness_side(runs: dict) -> None:
    rc, d = _diff(runs["base"][0], runs["harness"][0])
    assert rc == 1
    assert d["t_div"] == 3 and d["context_identical"] is False and d["cause"] == "harness"
    first = d["differences"][0]
    assert first["source"].startswith("harness: tool result of read_file")
    assert first["b"] == NOTES[:20]


def test_diff_environment_side_through_a_tool_that_names_no_file(runs: dict) -> None:
    """The file a shell tool read is known by the stat `cat` made of it on the tape (the
    shim names the file an fstat looked at), its bytes by the workspace snapshot."""
    rc, d = _diff(runs["shell"][0], runs["shell-env"][0])
    assert rc == 1 and d["t_div"] == 3 and d["cause"] == "environment", d
    first = d["differences"][0]
    assert first["source"].startswith("environment: tool result: the file notes.txt differs "
                                      "between the runs (bytes "), first
    [f] = [f for f in first["files"] if f["file"] == "notes.txt"]
    assert f["verdict"] == "differs" and f["what"] == ["bytes", "size", "mtime"], f
    assert f["a"]["sha256"] and f["b"]["sha256"] and f["a"]["path"].endswith("/shell/notes.txt")


def test_diff_text_names_the_cause(runs: dict) -> None:
    p = cli("diff", str(runs["base"][0]), str(runs["env"][0]))
    assert p.returncode == 1
    assert "cause: environment (contexts at turn 3 differ)" in p.stdout
    assert "notes.txt" in p.stdout


def test_diff_of_a_store_trajectory(runs: dict, tmp_path: Path) -> None:
    store = tmp_path / "store"
    p = cli("log", "import", str(runs["env"][0]), str(store))
    assert p.returncode == 0, p.stderr
    rc, d = _diff(runs["base"][0], store)
    assert rc == 1 and d["cause"] == "environment"


def test_show_refuses_a_fifo_and_a_missing_file(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path / "missing.steno"):
        p = cli("show", str(path))
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    fifo.unlink()  # (shutil.rmtree would open it, and block)


MODEL_PROGRAM = '''
import json

import stenograph

@stenograph.model
def llm(messages, model="local-7b"):
    if "weather" in messages[-1]["content"]:
        return {"model": "local-7b", "usage": {"prompt_tokens": 12, "completion_tokens": 3},
                "choices": [{"finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": [{
                        "id": "c1", "type": "function", "function": {
                            "name": "weather",
                            "arguments": json.dumps({"city": "Paris"})}}]}}]}
    return "It is sunny in Paris."

@stenograph.tool
def weather(city):
    return f"sunny in {city}"

msgs = [{"role": "user", "content": "what is the weather?"}]
r = llm(messages=msgs)
weather("Paris")  # a harness that does not hand the result back in the next request
print(llm(messages=[{"role": "user", "content": "and now?"}]))
'''


def test_show_of_stenograph_model_calls(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(MODEL_PROGRAM)
    out = tmp_path / "m.steno"
    p = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable, str(prog)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env())
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(cli("show", str(out), "--json").stdout)
    assert [t["turn"] for t in doc["turns"]] == [1, 2]
    t1 = json.loads(cli("show", str(out), "--turn", "1", "--json").stdout)
    assert t1["context"]["api"] == "stenograph.model"
    assert t1["request"]["body"]["kwargs"]["messages"][0]["content"] == "what is the weather?"
    assert t1["tool_calls"] == [{"id": "c1", "name": "weather", "arguments": {"city": "Paris"}}]
    assert t1["usage"] == {"input_tokens": 12, "output_tokens": 3}
    assert t1["tool_results"][0]["content"] == "sunny in Paris"
    assert t1["tool_results"][0]["source"].startswith("tool call")
    t2 = json.loads(cli("show", str(out), "--turn", "2", "--json").stdout)
    assert t2["reply"]["text"] == "It is sunny in Paris."
