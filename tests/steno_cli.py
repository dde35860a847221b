"""The stenograph CLI as the tests drive it: record a command, replay a recording.

Real subprocesses, as a user runs them; each test module keeps its own assertions on
top of these two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "stenograph"]


def record(out: Path, argv: list[str], cwd: Path, *flags: str,
           timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """``stenograph record -o OUT [FLAGS] -- ARGV`` in ``cwd``; it must succeed."""
    p = subprocess.run([*CLI, "record", *flags, "-o", str(out), "--", *argv], cwd=cwd,
                       capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert out.exists()
    return p


def replay_json(steno: Path, cwd: Path, *flags: str,
                timeout: float = 120) -> tuple[int, dict]:
    """``stenograph replay STENO --json``: its exit code and its report."""
    p = subprocess.run([*CLI, "replay", str(steno), "--json", *flags], cwd=cwd,
                       capture_output=True, timeout=timeout)
    assert p.stdout, p.stderr.decode(errors="replace")
    return p.returncode, json.loads(p.stdout.decode().splitlines()[-1])


def why(stderr: str, room: int = 3000) -> str:
    """A failed replay's report for an assertion message: its lines without the native
    and Python stack (``where:``), which would push the divergence itself out of view."""
    return "\n".join(ln for ln in stderr.splitlines()
                     if not ln.lstrip().startswith("where:"))[-room:]
