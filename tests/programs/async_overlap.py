"""Overlapping streamed completions in one event loop (AsyncOpenAI), with a ticker task
that reads the wall clock while they are in flight: the order in which the loop runs
them is what `stenograph record --asyncio` must reproduce.

Usage: OPENAI_BASE_URL=... OPENAI_API_KEY=... python async_overlap.py STREAMS
"""

import asyncio
import sys
import time

from openai import AsyncOpenAI


async def one(client: AsyncOpenAI, i: int) -> str:
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"hi {i}"}], stream=True)
    parts = []
    async for ev in stream:
        if ev.choices and ev.choices[0].delta.content:
            parts.append(ev.choices[0].delta.content)
            print(i, repr(ev.choices[0].delta.content), round(time.monotonic() % 100, 4),
                  flush=True)
    return "".join(parts)


async def ticker() -> None:
    for k in range(10):
        await asyncio.sleep(0.002)
        print("tick", k, round(time.time() % 100, 4), flush=True)


async def main() -> None:
    client = AsyncOpenAI()
    n = int(sys.argv[1])
    done = await asyncio.gather(*(one(client, i) for i in range(n)), ticker())
    print(done)
    await client.close()


asyncio.run(main())
