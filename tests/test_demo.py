"""`make demo` is the README's first command: run its script as the Makefile does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_records_replays_bit_for_bit_and_keeps_the_key_out(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STENO_", "OPENAI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["DEMO_OUT"] = str(tmp_path / "demo-out")
    p = subprocess.run(["bash", str(ROOT / "examples" / "demo.sh")], cwd=ROOT, env=env,
                       capture_output=True, timeout=300)
    out = p.stdout.decode()
    assert p.returncode == 0, (out[-2000:], p.stderr.decode()[-2000:])
    assert "stdout: bit-identical" in out and "the API key is nowhere" in out, out[-2000:]
    assert (tmp_path / "demo-out" / "agent.steno").stat().st_size < 2_000_000
