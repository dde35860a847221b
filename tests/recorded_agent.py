"""A recorded demo agent in a workspace of its own, for the build-replay tests: the
agent (examples/agent.py, the openai SDK) with a timestamp and a uuid4 in its system
prompt, recorded once against the loopback model server; edits of it made the way a
developer makes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stenograph.testing.model_server import ModelServer

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "stenograph"]
SCRIPT = json.loads((REPO / "examples" / "agent_script.json").read_text())
PROMPT = '"You are a careful agent. Use the tools, then answer."'
STAMPED = ('f"You are a careful agent. Use the tools, then answer. '
           'Now: {datetime.now(UTC).isoformat()}; run {uuid.uuid4()}."')


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "STENO_"))}
    env.update(extra)
    return env


def _base_agent() -> str:
    src = (REPO / "examples" / "agent.py").read_text()
    assert PROMPT in src
    return src.replace(PROMPT, STAMPED)


class Recorded:
    def __init__(self, ws: Path, steno: Path, source: str) -> None:
        self.ws, self.steno, self.source = ws, steno, source

    def write(self, source: str) -> None:
        (self.ws / "agent.py").write_text(source)

    def replay(self, *flags: str) -> tuple[int, dict]:
        p = subprocess.run([*CLI, "replay", *flags, "--json", str(self.steno)], cwd=self.ws,
                           capture_output=True, timeout=180, env=clean_env())
        lines = p.stdout.decode().strip().splitlines()
        assert lines, p.stderr.decode(errors="replace")[-3000:]
        return p.returncode, json.loads(lines[-1])


def record_agent(root: Path, name: str = "run") -> Recorded:
    ws = root / name
    ws.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "agent_script.json", ws)
    source = _base_agent()
    (ws / "agent.py").write_text(source)
    steno = root / f"{name}.steno"
    with ModelServer(script=SCRIPT) as srv:
        p = subprocess.run([*CLI, "record", "-o", str(steno), "--", sys.executable,
                            "agent.py", "--workdir", "."], cwd=ws, capture_output=True,
                           timeout=180, env=clean_env(OPENAI_BASE_URL=srv.openai_base_url,
                                                 OPENAI_API_KEY="sk-test-build"))
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return Recorded(ws, steno, source)


INCIDENTAL = (
    "import decimal, fractions, random  # a new import: listings and stats it makes\n"
    "_noise = (time.time(), uuid.uuid4(), os.listdir('.'), random.random(), "
    "os.urandom(8), time.monotonic())\n"
)


def incidental(source: str) -> str:
    """The agent with more clock, entropy, uuid and listing reads at import and before
    its prompt is made (so every later served value shifts)."""
    src = source.replace("from openai import OpenAI\n", "from openai import OpenAI\n" + INCIDENTAL)
    return src.replace("    started = datetime.now(UTC)\n",
                       "    time.time(); uuid.uuid4(); datetime.now(UTC); os.listdir('.')\n"
                       "    started = datetime.now(UTC)\n")
