"""What the shim cannot see is refused before launch, with one line and exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stenograph.interpose.launch import GO_BUILDINFO, check_dynamic
from stenograph.recorder.errors import BadInput

CLI = [sys.executable, "-m", "stenograph"]


def test_go_binary_is_refused_even_when_dynamically_linked(tmp_path: Path) -> None:
    """No Go toolchain here: a real dynamic ELF carrying Go's build-info section marker
    stands in for a cgo binary (the detector looks for exactly that marker)."""
    true = shutil.which("true")
    assert true
    fake_go = tmp_path / "gobin"
    fake_go.write_bytes(Path(true).read_bytes() + b"\0" * 16 + GO_BUILDINFO + b"\x08\x02")
    fake_go.chmod(0o755)
    check_dynamic(true)  # the plain dynamic binary passes
    with pytest.raises(BadInput, match="Go program"):
        check_dynamic(str(fake_go))
    p = subprocess.run([*CLI, "record", "-o", str(tmp_path / "g.steno"), "--", str(fake_go)],
                       capture_output=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stenograph: error: Go program"), lines
    assert not (tmp_path / "g.steno").exists()
    assert not any(tmp_path.glob(".g.steno.rec*")), "a refused record must leave nothing"
