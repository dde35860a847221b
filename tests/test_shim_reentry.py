"""A wrapped call made by a signal handler that interrupted the shim must not deadlock.

The record path appends to the thread's buffer under a per-buffer spin lock; a handler
that runs while its own thread holds it, and reads the clock, used to spin forever. Such a
call now runs live and untaped, and is counted (``steno_reentries``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "stenograph"]

TIMER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t fired;
static volatile long sink;

static void on_alarm(int sig) {
    (void)sig;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sink += ts.tv_nsec;
    fired++;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 50}, {0, 50}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct timespec ts;
    for (long i = 0; i < 1000000; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
    setitimer(ITIMER_REAL, &off, NULL);
    unsigned long (*reentries)(void) = (unsigned long (*)(void))dlsym(RTLD_DEFAULT,
                                                                       "steno_reentries");
    printf("fired=%d reentries=%lu\n", (int)fired, reentries ? reentries() : 0UL);
    return 0;
}
"""


def test_clock_read_from_a_timer_handler_does_not_deadlock_the_record(tmp_path: Path) -> None:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "timer.c"
    src.write_text(TIMER_C)
    exe = tmp_path / "timer"
    subprocess.run([cc, "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
    out = tmp_path / "timer.steno"
    # its own session, so that a hung program is killed with the recorder
    p = subprocess.Popen([*CLI, "record", "-o", str(out), "--", str(exe)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("recording hung: a handler's clock read deadlocked on the shim's lock")
    assert p.returncode == 0, stderr
    m = re.fullmatch(rb"fired=(\d+) reentries=(\d+)\n", stdout)
    assert m, stdout
    fired, reentries = int(m.group(1)), int(m.group(2))
    assert fired > 0
    # about a third of the handler's reads land while the main loop holds the lock
    assert 0 < reentries <= fired
    assert out.is_file()
