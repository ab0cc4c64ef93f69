"""bench/peers/httpx_rate.py: the Python peer of `make bench-rate`
(bench/ratelimit.lua), written as a Python user calls a rate-limited API
with no limiter: TASKS asyncio tasks each loop calling one
httpx.AsyncClient, each call in tenacity's AsyncRetrying as
bench/peers/httpx_peer.py retries it (a 429, a 5xx or a transport error;
stop_after_attempt(4), wait_random_exponential(multiplier=1, max=60)). A
call that fails after its retries is counted and the task goes on with the
next, as such a loop does.

    /usr/bin/python3 httpx_rate.py URL TASKS [FIRST]

FIRST: the backoff's first step in seconds (tenacity's multiplier; 1 by
default).

Prints "ready" once its client is made, then loops until it is killed (the
bench counts what the server answered, not what this prints).
"""
import asyncio
import sys

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential


class RetryableStatus(Exception):
    def __init__(self, status):
        super().__init__(f"status {status}")


def retryable(exc):
    return isinstance(exc, (RetryableStatus, httpx.TransportError))


def retrying(first):
    return dict(stop=stop_after_attempt(4), wait=wait_random_exponential(multiplier=first, max=60),
                retry=retry_if_exception(retryable), reraise=True)


async def main(url, tasks, first):
    retry = retrying(first)
    limits = httpx.Limits(max_connections=tasks, max_keepalive_connections=tasks)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        async def get():
            async for attempt in AsyncRetrying(**retry):
                with attempt:
                    res = await client.get(url)
                    if res.status_code == 429 or res.status_code >= 500:
                        raise RetryableStatus(res.status_code)
                    return res

        async def worker():
            while True:
                try:
                    await get()
                except Exception:  # counted by the server; the loop goes on
                    pass

        print("ready", flush=True)
        await asyncio.gather(*(worker() for _ in range(tasks)))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or int(sys.argv[2]) < 1 or (len(sys.argv) == 4 and float(sys.argv[3]) <= 0):
        print("usage: httpx_rate.py URL TASKS [FIRST]", file=sys.stderr)
        sys.exit(2)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) == 4 else 1.0))
