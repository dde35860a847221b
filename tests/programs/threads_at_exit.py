"""Threads still inside a call when the process ends: a heartbeat in a timed wait, a
rich ``Live`` refresher never stopped, tqdm's monitor, a reader blocked on a pipe.
The exit stops each of them mid-call, before its next record."""

import os
import sys
import threading
import time

from rich.console import Console
from rich.live import Live
from tqdm import tqdm

stop = threading.Event()


def heartbeat() -> None:
    beats = 0
    while not stop.wait(0.01):
        beats += 1


threading.Thread(target=heartbeat, daemon=True).start()
live = Live("starting", console=Console(file=sys.stdout, force_terminal=False),
            refresh_per_second=20)
live.start()
for i in range(4):
    live.update(f"step {i}")
    time.sleep(0.02)
for _ in tqdm(range(10), mininterval=0.01, file=sys.stdout):
    time.sleep(0.01)
r, w = os.pipe()
threading.Thread(target=lambda: os.read(r, 10), daemon=True).start()
time.sleep(0.03)
print("done", flush=True)
os._exit(0) if len(sys.argv) > 1 else None
