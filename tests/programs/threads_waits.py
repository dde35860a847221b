"""Threads that meet through timed waits: a queue polled with a timeout, a condition
waited on with a timeout, an event polled, a timer. How many times each wait times out
depends on when the other thread runs."""

import queue
import random
import threading
import time

q: queue.Queue = queue.Queue()


def producer() -> None:
    for i in range(15):
        time.sleep(random.random() * 0.002)
        q.put(i)
    q.put(None)


threading.Thread(target=producer).start()
seen = []
while True:
    try:
        x = q.get(timeout=0.0007)
    except queue.Empty:
        seen.append("-")
        continue
    if x is None:
        break
    seen.append(str(x))
print(" ".join(seen))

cond = threading.Condition()
state = {"n": 0}


def bump() -> None:
    for _ in range(8):
        time.sleep(0.0004)
        with cond:
            state["n"] += 1
            cond.notify()


threading.Thread(target=bump).start()
waits = 0
with cond:
    while state["n"] < 8:
        cond.wait(timeout=0.0002)
        waits += 1
print("condition waits", waits, round(time.perf_counter() % 100, 6))

done = threading.Event()
threading.Timer(0.004, done.set).start()
polls = 0
while not done.wait(0.0005):
    polls += 1
print("event polls", polls, time.time())
