"""What the launcher decides before launch: recorded whole, or refused (one line, exit 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from stenograph.runner.launch import GO_BUILDINFO, check_dynamic

CLI = [sys.executable, "-m", "stenograph"]


def test_a_go_binary_linked_dynamically_is_recorded_whole(tmp_path: Path) -> None:
    """A real dynamic ELF carrying Go's build-info section marker stands in for a cgo
    binary (the launcher looks for exactly that marker; Debian's Go programs are tested
    in test_whole_children.py): it is recorded whole, not refused."""
    true = shutil.which("true")
    assert true
    fake_go = tmp_path / "gobin"
    fake_go.write_bytes(Path(true).read_bytes() + b"\0" * 16 + GO_BUILDINFO + b"\x08\x02")
    fake_go.chmod(0o755)
    assert check_dynamic(true) is False  # the plain dynamic binary runs as it is
    assert check_dynamic(str(fake_go)) is True
    p = subprocess.run([*CLI, "record", "-o", str(tmp_path / "g.steno"), "--", str(fake_go)],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rep = subprocess.run([*CLI, "replay", str(tmp_path / "g.steno")], capture_output=True,
                         text=True, timeout=60)
    assert rep.returncode == 0 and "bit-identical" in rep.stderr, rep.stderr


SCANDIR_C = r"""
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int no_dots(const struct dirent *e) { return e->d_name[0] != '.'; }
int main(int argc, char **argv) {
    struct dirent **v;
    int n = scandir(argv[1], &v, no_dots, NULL);   /* no compar: order as listed */
    if (n < 0) { perror("scandir"); return 1; }
    for (int i = 0; i < n; i++) { printf("%s ", v[i]->d_name); free(v[i]); }
    free(v);
    n = scandir(argv[1], &v, NULL, alphasort);
    printf("| %d\n", n);
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    return 0;
}
"""


def test_scandir_listings_are_taped_sorted_and_checked(tmp_path: Path) -> None:
    """glibc's scandir() bypasses the opendir wrapper; the shim rebuilds it on the taped
    calls, so its order is the sorted one in both modes and a changed listing is drift."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is part of the project's build requirements"
    exe = tmp_path / "scan"
    src = tmp_path / "scan.c"
    src.write_text(SCANDIR_C)
    subprocess.run([gcc, "-O1", "-o", str(exe), str(src)], check=True)
    d = tmp_path / "d"
    d.mkdir()
    for name in ["q", "b", "zz", "a", "m", "k", "c9", "c10"]:
        (d / name).touch()
    native = subprocess.run([str(exe), str(d)], capture_output=True, text=True).stdout
    steno = tmp_path / "scan.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", str(exe), str(d)],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout == "a b c10 c9 k m q zz | 10\n"  # sorted by name, not disk order
    assert sorted(native.split("|")[0].split()) == rec.stdout.split("|")[0].split()
    rep = subprocess.run([*CLI, "replay", str(steno)], capture_output=True, text=True,
                         timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout == rec.stdout
    (d / "zz").unlink()
    (d / "new").touch()  # same count, other names: reported, served as recorded
    rep = subprocess.run([*CLI, "replay", str(steno), "--json"], capture_output=True,
                         text=True, timeout=60)
    report = json.loads(rep.stdout.splitlines()[-1])
    assert any(x["channel"] == "dirents" for x in report["drift"]), report
    assert report["identical"]["stdout"], report


def test_replay_that_is_not_bit_identical_exits_1(tmp_path: Path) -> None:
    """No stream diverges (echo reads nothing from the tape), but the replayed command
    prints other bytes: a script or CI step must not take that for a pass."""
    steno = tmp_path / "e.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", "echo", "one"],
                         capture_output=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    same = subprocess.run([*CLI, "replay", str(steno)], capture_output=True, timeout=60)
    assert same.returncode == 0, same.stderr
    other = subprocess.run([*CLI, "replay", str(steno), "--", "echo", "two"],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 1, other.stderr
    assert "stdout differs" in other.stderr
    assert other.stderr.strip().splitlines()[-1].startswith("stenograph: error: replay is not")
    js = subprocess.run([*CLI, "replay", str(steno), "--json", "--", "echo", "two"],
                        capture_output=True, text=True, timeout=60)
    assert js.returncode == 1
    assert json.loads(js.stdout)["identical"]["stdout"] is False
