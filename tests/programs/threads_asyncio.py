"""asyncio with blocking work on threads (asyncio.to_thread, run_in_executor): the loop
wakes when a worker hands its result back."""

import asyncio
import threading
import time
import uuid


def blocking(i: int) -> tuple:
    time.sleep(0.001 * (i % 3))
    return i, uuid.uuid4().hex[:6], threading.get_native_id()


async def main() -> None:
    print(await asyncio.gather(*(asyncio.to_thread(blocking, i) for i in range(6))))
    loop = asyncio.get_running_loop()
    print(await loop.run_in_executor(None, blocking, 2))
    done = []

    async def ticker() -> None:
        for _ in range(5):
            await asyncio.sleep(0.0005)
            done.append(round(loop.time() % 100, 6))

    await asyncio.gather(ticker(), asyncio.to_thread(blocking, 7))
    print(done, time.time())


asyncio.run(main())
