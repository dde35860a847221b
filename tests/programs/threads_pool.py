"""A thread pool whose workers meet at a barrier, then read clocks, uuids and their ids.

Which worker takes which task, and in what order results land, is the scheduler's
choice: the tape must make it the recorded one.
"""

import concurrent.futures as cf
import threading
import time
import uuid

barrier = threading.Barrier(4)
landed = []


def work(i: int) -> tuple:
    if i < 4:
        barrier.wait()
    u = uuid.uuid4().hex[:8]
    landed.append((i, threading.get_native_id(), threading.get_ident() % 100003))
    return i, round(time.monotonic() % 1000, 6), u


with cf.ThreadPoolExecutor(4) as ex:
    for r in ex.map(work, range(12)):
        print(r)
print(landed)
ts = [threading.Thread(target=lambda: landed.append(threading.get_native_id())) for _ in range(3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print([t.native_id for t in ts], landed[-3:], time.time())
