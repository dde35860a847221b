"""Threads that each run a subprocess and wait for it."""

import subprocess
import threading

out = {}


def run(i: int) -> None:
    p = subprocess.run(["sh", "-c", f"echo {i}; date +%N"], capture_output=True, text=True)
    out[i] = p.stdout.split()


ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(sorted(out.items()))
