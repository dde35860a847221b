"""A thread that spins on a flag another thread sets: it never blocks, so under the
tape's scheduler the setter could never run. Record must give up on the schedule
(not hang); replay must stop where the threads ran unscheduled.

The setter starts its short sleep only once the spinner is about to spin (``ready``):
else, on a loaded machine, the spinner could be slow to come back from starting the
thread, the setter's sleep end first, and the flag be set before the first spin."""

import threading
import time

flag: list = []
ready: list = []


def setter() -> None:
    while not ready:
        time.sleep(0.001)
    time.sleep(0.01)
    flag.append(1)


threading.Thread(target=setter).start()
spins = 0
ready.append(1)
while not flag:
    spins += 1
print("spun", spins > 0, time.time())
