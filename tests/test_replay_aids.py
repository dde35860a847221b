"""What replay does for the program beyond serving values: it says where a diverging
program was, and it runs CPython's cyclic collector at the points the tape fixes.

Real programs under the real CLI: a replay that diverges must name the function the
program was in (native and Python stacks in the report), and a cycle with a finalizer
must be collected at the same point of the program in record and replay (an exchange a
hook put on the tape), not when allocation counts happen to say. (Finalizers run with the
tape paused: a clock one reads is live, see docs/determinism.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PY = sys.executable  # the venv: the programs import requests
CLI = [sys.executable, "-m", "stenograph"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}


def _record(tmp: Path, argv: list[str]) -> tuple[Path, bytes]:
    out = tmp / "run.steno"
    p = subprocess.run([*CLI, "record", "-o", str(out), "--", *argv], cwd=tmp, env=_env(),
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return out, p.stdout


def _replay(tmp: Path, steno: Path, *flags: str) -> tuple[int, dict]:
    p = subprocess.run([*CLI, "replay", str(steno), "--json", *flags], cwd=tmp, env=_env(),
                       capture_output=True, timeout=120)
    assert p.stdout, p.stderr.decode(errors="replace")
    return p.returncode, json.loads(p.stdout.decode().splitlines()[-1])


def test_a_divergence_says_where_the_program_was(tmp_path: Path) -> None:
    prog = tmp_path / "agent.py"
    prog.write_text("import time\n\ndef stamp():\n    return time.time()\n\nprint(stamp())\n")
    steno, _ = _record(tmp_path, [os.path.realpath(PY), str(prog)])
    prog.write_text("import os, time\n\ndef stamp():\n    return os.urandom(4)\n\n"
                    "print(stamp())\n")
    code, rep = _replay(tmp_path, steno, "--live", str(prog))  # the changed code, not the
    # recorded workspace's copy
    assert code == 1, rep
    stack = rep["divergences"][0].get("python_stack", [])
    assert any(line.startswith("Native stack") for line in stack), stack
    assert any(str(prog) in line and "in stamp" in line for line in stack), stack




CYCLES = textwrap.dedent("""
    import gc, sys
    import requests
    print("automatic collection:", gc.isenabled())
    seen = []
    class Node:
        def __init__(self, i):
            self.me, self.i = self, i
        def __del__(self):
            seen.append(self.i)
    for i in range(3):
        Node(i)                       # garbage in a cycle, with a finalizer
        print("before call", i, len(seen))
        requests.get(sys.argv[1] + "/x")
        print("after call", i, seen)
""")


def test_cycles_are_collected_at_the_same_points_in_record_and_replay(
        tmp_path: Path, counting_server: str) -> None:
    prog = tmp_path / "cycles.py"
    prog.write_text(CYCLES)
    plain = subprocess.run([PY, str(prog), counting_server], env=_env(), capture_output=True,
                           timeout=60)
    assert b"automatic collection: True" in plain.stdout
    steno, out = _record(tmp_path, [PY, str(prog), counting_server])
    text = out.decode()
    assert "automatic collection: False" in text, text
    # each cycle is collected at the exchange that follows it
    assert "before call 1 1" in text and "before call 2 2" in text, text
    code, rep = _replay(tmp_path, steno)
    assert rep["divergences"] == [], rep
    assert rep["identical"] == {"stdout": True, "stderr": True, "exit_status": True}, rep
    assert code == 0
