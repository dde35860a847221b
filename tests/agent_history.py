"""A small tool-calling agent on the official ``openai`` SDK and a history of 15 commits
after its first, all harmless but one (``PLANTED``, the seventh) that cuts tool output
shorter, so the request of turn 2 changes: what ``stenograph bisect`` and build replay
are judged on (``test_bisect.py``, ``test_judge_elsewhere.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from stenograph.testing.model_server import ModelServer

PY = sys.executable  # the venv's: the agent imports openai
CLI = [sys.executable, "-m", "stenograph"]
GIT_ID = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]

AGENT = '''"""A small tool-calling agent on the official openai SDK."""
import json
import os
import sys

from openai import OpenAI

MAX_OUTPUT = 2000

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
]


def read_file(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def list_dir(path):
    return "\\n".join(sorted(os.listdir(path)))


FUNCS = {"read_file": read_file, "list_dir": list_dir}


def call_tool(name, arguments):
    try:
        out = FUNCS[name](**json.loads(arguments or "{}"))
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"
    return out[:MAX_OUTPUT]


def main():
    client = OpenAI()
    messages = [{"role": "system", "content": "Use the tools, then answer."},
                {"role": "user", "content": "What are the notes about?"}]
    for step in range(1, 8):
        reply = client.chat.completions.create(model="steno-test", messages=messages,
                                               tools=TOOLS)
        msg = reply.choices[0].message
        if not msg.tool_calls:
            print("final:", msg.content)
            return 0
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            result = call_tool(call.function.name, call.function.arguments)
            print(f"step {step}: {call.function.name} -> {len(result)} chars")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''

NOTES = "".join(f"note {i}: the agent keeps careful notes about step {i}.\n" for i in range(12))
SCRIPT = [
    {"text": "Reading the notes.",
     "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"text": "And what else is here.",
     "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
    {"text": "The notes are about careful steps."},
]

Edit = Callable[[Path], None]


def sub(name: str, old: str, new: str) -> Edit:
    def edit(repo: Path) -> None:
        text = (repo / name).read_text()
        assert old in text, (name, old)
        (repo / name).write_text(text.replace(old, new, 1))
    return edit


def write(name: str, text: str) -> Edit:
    def edit(repo: Path) -> None:
        (repo / name).write_text(text)
    return edit


PLANTED = "cut tool output to 200 characters"
COMMITS: list[tuple[str, list[Edit]]] = [
    ("explain the tools", [sub("agent.py", "TOOLS = [", "# what the model may call\nTOOLS = [")]),
    ("time the run", [sub("agent.py", "import sys\n", "import sys\nimport time\n"),
                      sub("agent.py", "    client = OpenAI()\n",
                           "    started = time.time()\n    client = OpenAI()\n"),
                      sub("agent.py", '            print("final:", msg.content)\n',
                           '            print("final:", msg.content)\n'
                           '            print(f"took {time.time() - started:.2f} s")\n')]),
    ("give each run an id", [sub("agent.py", "import time\n", "import time\nimport uuid\n"),
                             sub("agent.py", "    started = time.time()\n",
                                  "    started = time.time()\n    run_id = uuid.uuid4()\n"
                                  '    print("run", run_id)\n')]),
    ("count the files it starts in", [sub("agent.py", '    print("run", run_id)\n',
                                           '    print("run", run_id)\n'
                                           '    print("files:", len(os.listdir(".")))\n')]),
    ("a helper module for the banner", [
        write("helpers.py", '"""Small helpers of the agent."""\n\n\ndef banner(run_id):\n'
               '    return f"agent run {run_id}"\n'),
        sub("agent.py", "from openai import OpenAI\n",
             "from openai import OpenAI\n\nfrom helpers import banner\n"),
        sub("agent.py", '    print("run", run_id)\n', "    print(banner(run_id))\n")]),
    ("say what call_tool does", [sub("agent.py", "def call_tool(name, arguments):\n",
                                      "def call_tool(name, arguments):\n"
                                      '    """Run one tool call; errors are its answer."""\n')]),
    (PLANTED, [sub("agent.py", "MAX_OUTPUT = 2000", "MAX_OUTPUT = 200")]),
    ("comment on the step bound", [sub("agent.py", "    for step in range(1, 8):\n",
                                        "    # seven model calls at most\n"
                                        "    for step in range(1, 8):\n")]),
    ("name the step limit", [sub("agent.py", "TOOLS = [", "MAX_STEPS = 7\n\n# tools\nTOOLS = ["),
                             sub("agent.py", "range(1, 8)", "range(1, MAX_STEPS + 1)")]),
    ("a helper to describe a call", [
        sub("helpers.py", "def banner", "def describe(name, result):\n"
             '    return f"{name} -> {len(result)} chars"\n\n\ndef banner'),
        sub("agent.py", "from helpers import banner", "from helpers import banner, describe"),
        sub("agent.py", 'print(f"step {step}: {call.function.name} -> {len(result)} chars")',
             'print(f"step {step}:", describe(call.function.name, result))')]),
    ("print what the model says", [sub("agent.py", "        msg = reply.choices[0].message\n",
                                        "        msg = reply.choices[0].message\n"
                                        "        if msg.content:\n"
                                        '            print("model:", msg.content)\n')]),
    ("a README", [write("README.md", "# agent\n\nA small agent that reads its notes.\n")]),
    ("a docstring for main", [sub("agent.py", "def main():\n",
                                   'def main():\n    """Ask, call tools, answer."""\n')]),
    ("list the files it sees", [sub("agent.py", '    print("files:", len(os.listdir(".")))\n',
                                     '    print("files:", sorted(os.listdir(".")))\n')]),
    ("say how many steps it took", [sub("agent.py", '            print("final:", msg.content)\n',
                                         '            print("final:", msg.content)\n'
                                         '            print("steps:", step)\n')]),
]
assert len(COMMITS) == 15


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", *GIT_ID, *args], cwd=repo, env=env, capture_output=True,
                          text=True, check=check)


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    out.update(extra)
    return out


def record(where: Path, out: Path, script: list, argv: list[str], **extra: str) -> None:
    """Record ``argv`` run in ``where`` against a loopback model following ``script``."""
    with ModelServer(script=script) as srv:
        p = subprocess.run([*CLI, "record", "-o", str(out), "--", *argv], cwd=where,
                           env=env(OPENAI_BASE_URL=srv.openai_base_url,
                                   OPENAI_API_KEY="sk-test-bisect", **extra),
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def first_commit(repo: Path) -> str:
    """A new repository holding the agent and its notes: its first commit."""
    git(repo, "init", "-q", "-b", "main")
    (repo / "agent.py").write_text(AGENT)
    (repo / "notes.txt").write_text(NOTES)
    return commit(repo, "a small agent on the openai SDK")


def the_rest(repo: Path) -> tuple[list[str], str]:
    """Every commit of ``COMMITS`` on top: their shas, and the planted one's."""
    shas, planted = [], ""
    for message, edits in COMMITS:
        for edit in edits:
            edit(repo)
        shas.append(commit(repo, message))
        if message == PLANTED:
            planted = shas[-1]
    return shas, planted
