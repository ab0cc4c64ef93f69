"""bench/peers/httpx_peer.py: the Python peer of `make bench-peers`
(bench/peers.lua), written as a Python user calls a rate-limited API with
httpx and tenacity: a 429, a 5xx or a transport error is retried, any other
status is final; 3 retries after the first attempt, exponential backoff
from 1 s capped at 60 s with full jitter (ratewise's defaults).

    /usr/bin/python3 httpx_peer.py URL N CONC WARMUP

Run by Debian's python3 with python3-httpx and python3-tenacity.
CONC = 1 is the sequential shape, one call at a time, written as such a
script is: a plain loop on one httpx.Client, each call in tenacity's
Retrying. Otherwise one httpx.AsyncClient whose limits allow CONC
connections, and CONC asyncio tasks each looping over their share of the N
calls, each call in AsyncRetrying. WARMUP calls go first, on the same
client, off the clock. Prints one line:
    rate=REQ_PER_S failed=F cpu_us=CPU_PER_REQ
A failed call (an error after the retries, a status other than 200, a
body other than "ok") is counted and the first of each kind goes to
stderr; the exit status is 1 when any failed.
"""
import asyncio
import sys
import time

import httpx
from tenacity import (AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt,
                      wait_random_exponential)


class RetryableStatus(Exception):
    def __init__(self, status):
        super().__init__(f"status {status}")


def retryable(exc):
    return isinstance(exc, (RetryableStatus, httpx.TransportError))


# What both the loop and the tasks retry with.
RETRY = dict(stop=stop_after_attempt(4), wait=wait_random_exponential(multiplier=1, max=60),
             retry=retry_if_exception(retryable), reraise=True)


def checked(res):
    if res.status_code == 429 or res.status_code >= 500:
        raise RetryableStatus(res.status_code)
    return res


class Tally:
    """Failed calls, the first of each kind shown on stderr."""

    def __init__(self):
        self.failed, self.shown = 0, set()

    def note(self, res, exc):
        why = None
        if exc is not None:
            why = f"{type(exc).__name__}: {exc}"
        elif res.status_code != 200:
            why = f"status {res.status_code}"
        elif res.text != "ok":
            why = f'a body of {len(res.content)} bytes, not "ok"'
        if why is not None:
            self.failed += 1
            if why not in self.shown:
                self.shown.add(why)
                print(f"httpx failed: {why}", file=sys.stderr)


def clock():
    return time.perf_counter(), time.process_time()


def since(start):
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def sequential(url, n, warmup, tally):
    with httpx.Client(timeout=30) as client:
        def get():
            for attempt in Retrying(**RETRY):
                with attempt:
                    return checked(client.get(url))
            raise AssertionError("Retrying ended without an outcome")

        def run(count):
            for _ in range(count):
                try:
                    res = get()
                except Exception as exc:  # every failure is counted, none raised
                    tally.note(None, exc)
                else:
                    tally.note(res, None)

        run(warmup)
        start = clock()
        run(n)
        return since(start)


async def concurrent(url, n, conc, warmup, tally):
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        async def get():
            async for attempt in AsyncRetrying(**RETRY):
                with attempt:
                    return checked(await client.get(url))
            raise AssertionError("AsyncRetrying ended without an outcome")

        async def worker(calls):
            for _ in range(calls):
                try:
                    res = await get()
                except Exception as exc:  # every failure is counted, none raised
                    tally.note(None, exc)
                else:
                    tally.note(res, None)

        async def run(count):
            shares = [count // conc + (1 if w < count % conc else 0) for w in range(conc)]
            await asyncio.gather(*(worker(calls) for calls in shares if calls > 0))

        await run(warmup)
        start = clock()
        await run(n)
        return since(start)


def main():
    if len(sys.argv) != 5:
        print("usage: httpx_peer.py URL N CONC WARMUP", file=sys.stderr)
        return 2
    url, n, conc, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if n < 1 or conc < 1 or warmup < 0:
        print("httpx_peer.py: N and CONC must be >= 1, WARMUP >= 0", file=sys.stderr)
        return 2
    tally = Tally()
    if conc == 1:
        secs, cpu = sequential(url, n, warmup, tally)
    else:
        secs, cpu = asyncio.run(concurrent(url, n, conc, warmup, tally))
    print(f"rate={n / secs:.1f} failed={tally.failed} cpu_us={cpu * 1e6 / n:.2f}")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
