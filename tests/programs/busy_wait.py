"""A thread that spins on a flag another thread sets: it never blocks, so under the
tape's scheduler the setter could never run. Record must give up on the schedule
(not hang); replay must stop where the threads ran unscheduled."""

import threading
import time

flag: list = []


def setter() -> None:
    time.sleep(0.01)
    flag.append(1)


threading.Thread(target=setter).start()
spins = 0
while not flag:
    spins += 1
print("spun", spins > 0, time.time())
