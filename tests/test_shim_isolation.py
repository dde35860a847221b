"""Replay isolation: a replayed process cannot open AF_INET/AF_INET6 sockets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]


def test_replay_refuses_tcp_sockets_unless_allowed(tmp_path: Path) -> None:
    prog = tmp_path / "net.py"
    prog.write_text("import socket\ns = socket.socket()\nprint('opened', int(s.family))\n")
    steno = tmp_path / "net.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(prog)],
                         capture_output=True, timeout=120, cwd=tmp_path)
    assert rec.returncode == 0 and rec.stdout == b"opened 2\n", rec.stderr
    refused = subprocess.run([*CLI, "replay", str(steno)], capture_output=True, timeout=120,
                             cwd=tmp_path)
    assert b"PermissionError" in refused.stderr
    assert b"opened" not in refused.stdout
    assert refused.returncode != 0
    allowed = subprocess.run([*CLI, "replay", str(steno), "--allow-network"],
                             capture_output=True, timeout=120, cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout == b"opened 2\n"
    assert b"bit-identical" in allowed.stderr
