"""Recording onto a full disk: one line, exit 5, no half store; the program unharmed.

A real tmpfs (mounted here: the suite runs as root, as `make test` does on this
machine; skipped where a mount cannot be made), filled with a real file, and real
`stenograph record` runs of a program that posts a 1 MiB body to a real server on
127.0.0.1 and exits 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "stenograph"]
PROGRAM = """
import sys, requests
r = requests.post(sys.argv[1] + "/up", data=b"x" * (1 << 20))
print("status", r.status_code, r.text)
sys.exit(3)
"""




@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)],
                       capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave_kib: int) -> None:
    st = os.statvfs(disk)
    free_kib = st.f_bavail * st.f_frsize // 1024
    with open(disk / "pad", "wb") as f:
        f.truncate(0)
        left = (free_kib - leave_kib) * 1024
        chunk = b"\0" * (1 << 20)
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])


def _record(tmp: Path, disk: Path, url: str) -> subprocess.CompletedProcess[str]:
    prog = tmp / "agent.py"
    prog.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STENO_")}
    return subprocess.run([*CLI, "record", "--store", str(disk / "store"), "-o",
                           str(tmp / "out.steno"), "--", sys.executable, str(prog), url],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_no_room_for_a_store_is_one_line_and_leaves_nothing(tmp_path: Path, small_disk: Path,
                                                            counting_server: str) -> None:
    _fill(small_disk, 1000)  # less than one preallocated segment
    p = _record(tmp_path, small_disk, counting_server)
    assert p.returncode == 5, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], p.stderr
    assert not (small_disk / "store").exists()
    assert not (tmp_path / "out.steno").exists()


def test_a_body_with_no_room_does_not_harm_the_program(tmp_path: Path, small_disk: Path,
                                                       counting_server: str) -> None:
    _fill(small_disk, 33000)  # a segment fits; the 1 MiB body's blob does not
    p = _record(tmp_path, small_disk, counting_server)
    assert "status 200 got 1048576" in p.stdout, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 3, p.stderr  # the program's own exit status, kept
