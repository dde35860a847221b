"""Crashing a recorded run from outside at a known point: the whole process group (the
recorder and the program) killed with SIGKILL as the model server receives its n-th
request. The tests that crash agents share it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any


def kill_at_request(proc: subprocess.Popen[Any], server: Any, n: int) -> threading.Thread:
    """Watch ``server.requests``; SIGKILL ``proc``'s process group (it must lead one:
    ``start_new_session=True``) once there are ``n``. The server should answer slowly
    (``Knobs(delay_ms=...)``) for the kill to land before the n-th reply."""
    def watch() -> None:
        while proc.poll() is None:
            if len(server.requests) >= n:
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t
