"""The demo agent (examples/agent.py, the openai SDK) recorded in a workspace of its own
against the loopback model server, with a script that branches on what the model is
given (as a real model's reply would): a test can plant a divergence where each kind
comes from -- the model, the environment (notes.txt), the harness (its truncation rule
for tool output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stenograph.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stenograph"]

NOTES = "release notes: ship it.\nplease deploy web1 tonight.\n"


def script(second: dict | None = None) -> list:
    return [
        {"text": "Listing first.", "tool_calls": [{"name": "list_dir",
                                                   "arguments": {"path": "."}}]},
        second or {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"if": "deploy web1", "then": {"tool_calls": [
            {"name": "run", "arguments": {"command": "echo deploying web1"}}]},
         "else": {"text": "Nothing to deploy."}},
        {"text": "Done: web1 is deployed."},
    ]


def env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    env.update(extra)
    return env


def record(root: Path, name: str, *, notes: str = NOTES, turns: list | None = None,
           max_output: int | None = None, checkout: Path | None = None) -> tuple[Path, list]:
    """Record the agent in a workspace of its own; (the .steno, the requests the model
    server received, as JSON). With ``checkout``, notes.txt is there (written only if
    it says something else: a file left alone keeps its mtime) and the agent is given it
    as ``--workdir``: the files its tools read are outside the recorded workspace."""
    ws = root / name
    ws.mkdir()
    where = (checkout or ws) / "notes.txt"
    if not where.exists() or where.read_text() != notes:
        where.write_text(notes)
    src = (REPO / "examples" / "agent.py").read_text()
    if max_output is not None:  # the harness's truncation rule for tool output
        assert "MAX_OUTPUT = 4000\n" in src
        src = src.replace("MAX_OUTPUT = 4000\n", f"MAX_OUTPUT = {max_output}\n")
    (ws / "agent.py").write_text(src)
    out = root / f"{name}.steno"
    with ModelServer(script=turns or script()) as srv:
        p = subprocess.run([*CLI, "record", "-o", str(out), "--", sys.executable, "agent.py",
                            "--workdir", str(checkout or ".")], cwd=ws,
                           capture_output=True, timeout=180,
                           env=env(OPENAI_BASE_URL=srv.openai_base_url,
                                    OPENAI_API_KEY="sk-test-view"))
        got = [r.json() for r in srv.requests if r.path.endswith("/chat/completions")]
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return out, got


