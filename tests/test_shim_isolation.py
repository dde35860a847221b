"""Replay isolation: a replayed process reaches no peer outside the recorded tree
(connects the recording made are served from the socket tape; what it never made --
here an unconnected datagram socket's sendto, which the tape does not follow -- is
refused: outside loopback with EACCES, to loopback with ECONNREFUSED), while sockets and
local probes work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PY = os.path.realpath(sys.executable)
CLI = [sys.executable, "-m", "stenograph"]


NET_PROG = """
import socket
s = socket.socket()
print('opened', int(s.family), flush=True)
for addr in (('127.0.0.1', 9), ('192.0.2.1', 80)):
    c = socket.socket()
    c.settimeout(0.5)
    try:
        c.connect(addr)
        print(addr[0], 'connected')
    except OSError as e:
        print(addr[0], type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for addr in (('127.0.0.1', 9), ('192.0.2.7', 53)):
    try:
        u.sendto(b'x', addr)
        print('sendto', addr[0], 'sent')
    except OSError as e:
        print('sendto', addr[0], type(e).__name__)
"""


def test_replay_refuses_what_reaches_the_network_unless_allowed(tmp_path: Path) -> None:
    prog = tmp_path / "net.py"
    prog.write_text(NET_PROG)
    steno = tmp_path / "net.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(prog)],
                         capture_output=True, timeout=120, cwd=tmp_path)
    assert rec.returncode == 0 and rec.stdout.startswith(b"opened 2\n"), rec.stderr
    refused = subprocess.run([*CLI, "replay", str(steno)], capture_output=True, timeout=120,
                             cwd=tmp_path)
    lines = refused.stdout.decode().splitlines()
    recorded = rec.stdout.decode().splitlines()
    assert lines[0] == "opened 2"  # the socket itself is not refused
    # connects the recording made are served from the socket tape, as they came out
    assert lines[1:3] == recorded[1:3] and lines[1].startswith("127.0.0.1 "), lines
    # an unconnected datagram socket's sendto is not taped: refused
    assert lines[3] == "sendto 127.0.0.1 ConnectionRefusedError"  # recorded: sent
    assert lines[4] == "sendto 192.0.2.7 PermissionError"
    assert "refused 2 connection(s)" in refused.stderr.decode(), refused.stderr
    allowed = subprocess.run([*CLI, "replay", str(steno), "--allow-network"],
                             capture_output=True, timeout=120, cwd=tmp_path)
    assert allowed.stdout == rec.stdout
    assert b"PermissionError" not in allowed.stdout


RAW_GETRANDOM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 1;
    for (int c = 0; c < calls; c++) {
        unsigned char buf[16];
        long r;
        /* a raw `syscall` instruction: no libc wrapper, no syscall() function */
        __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_getrandom), "D"(buf), "S"(sizeof buf),
                         "d"(0) : "rcx", "r11", "memory");
        printf("%ld ", r);
        for (int i = 0; i < 16; i++) printf("%02x", buf[i]);
        printf("\n");
    }
    return 0;
}
"""


def _raw_getrandom_binary(tmp: Path) -> str:
    src = tmp / "rawrand.c"
    src.write_text(RAW_GETRANDOM_C)
    exe = tmp / "rawrand"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    return str(exe)


def _replay(tmp: Path, steno: Path, *cmd: str) -> subprocess.CompletedProcess[bytes]:
    extra = ["--", *cmd] if cmd else []
    return subprocess.run([*CLI, "replay", str(steno), *extra], capture_output=True,
                          timeout=120, cwd=tmp)


def test_raw_getrandom_syscall_is_trapped_recorded_and_served(tmp_path: Path) -> None:
    exe = _raw_getrandom_binary(tmp_path)
    native = subprocess.run([exe, "2"], capture_output=True, check=True).stdout
    steno = tmp_path / "raw.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", exe, "2"],
                         capture_output=True, timeout=120, cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    lines = rec.stdout.decode().splitlines()
    assert len(lines) == 2 and all(line.startswith("16 ") for line in lines)
    assert rec.stdout != native and lines[0] != lines[1]  # real entropy while recording
    again = _replay(tmp_path, steno)
    assert again.returncode == 0, again.stderr
    assert again.stdout == rec.stdout  # served from the entropy stream, not the kernel
    assert b"bit-identical" in again.stderr
    # a program that makes one raw call too many: the report names the bypass
    more = _replay(tmp_path, steno, exe, "3")
    assert more.returncode == 1
    assert b"syscall-instruction(getrandom)" in more.stdout + more.stderr


def test_raw_getrandom_in_exec_and_forked_children(tmp_path: Path) -> None:
    exe = _raw_getrandom_binary(tmp_path)
    prog = tmp_path / "tree.py"
    prog.write_text(
        "import os, subprocess, sys\n"
        f"print(subprocess.run([{exe!r}], capture_output=True).stdout.decode(), end='')\n"
        f"subprocess.run(['/bin/sh', '-c', {exe!r} + ' | cat'])\n"
        "sys.stdout.flush()\n"
        f"os.execv({exe!r}, [{exe!r}])\n")
    steno = tmp_path / "tree.steno"
    rec = subprocess.run([*CLI, "record", "-o", str(steno), "--", PY, str(prog)],
                         capture_output=True, timeout=120, cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert len(set(rec.stdout.splitlines())) == 3
    again = _replay(tmp_path, steno)
    assert again.returncode == 0, again.stderr
    assert again.stdout == rec.stdout


STATIC_CHILD_C = r"""
#include <stdio.h>
#include <sys/syscall.h>
int main(void) {
    unsigned char buf[16];
    long r;
    /* what a Go runtime does for crypto/rand: a raw getrandom from its own text */
    __asm__ volatile("syscall" : "=a"(r) : "a"(SYS_getrandom), "D"(buf), "S"(sizeof buf),
                     "d"(0) : "rcx", "r11", "memory");
    printf("child getrandom %ld\n", r);
    return 0;
}
"""

FIXED_PARENT_C = r"""
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
/* 64 KiB of text: the parent's executable range then covers the child's main */
__attribute__((used)) static void pad(void) { __asm__ volatile(".skip 65536, 0x90"); }
int main(int argc, char **argv) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { execv(argv[1], argv + 1); _exit(127); }
    int st;
    waitpid(pid, &st, 0);
    printf("child %s %d\n", WIFSIGNALED(st) ? "killed by" : "exited", WIFSIGNALED(st) ?
           WTERMSIG(st) : WEXITSTATUS(st));
    return 0;
}
"""


def test_a_static_child_of_a_fixed_address_program_is_not_killed(tmp_path: Path) -> None:
    """A position-dependent program (Debian's /usr/bin/python3 is one) has its text at
    0x400000, where a static Go binary's is too: the raw-getrandom trap of the parent's
    text, inherited through exec, trapped the child's own getrandom, and the child, which
    has no handler, died of SIGSYS (`age-keygen`, kubectl under record)."""
    (tmp_path / "child.c").write_text(STATIC_CHILD_C)
    (tmp_path / "parent.c").write_text(FIXED_PARENT_C)
    child, parent = tmp_path / "child", tmp_path / "parent"
    for out, src, flags in ((child, "child.c", ["-static"]), (parent, "parent.c", ["-no-pie"])):
        subprocess.run(["gcc", "-O1", *flags, "-o", str(out), str(tmp_path / src)],
                       check=True, timeout=120)
    native = subprocess.run([str(parent), str(child)], capture_output=True, text=True)
    assert "child exited 0" in native.stdout, native.stdout
    steno = tmp_path / "p.steno"
    rec = subprocess.run([*CLI, "record", "--workspace", "none", "-o", str(steno), "--",
                          str(parent), str(child)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout == native.stdout, rec.stdout  # not "child killed by 31"
    rep = subprocess.run([*CLI, "replay", str(steno)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert rep.returncode == 0 and rep.stdout == native.stdout, rep.stderr
