// bench/peers/undici_rate.mjs: the Node peer of `make bench-rate`
// (bench/ratelimit.lua), written as a Node user calls a rate-limited API
// with no limiter: TASKS workers each loop calling undici's request() on
// one Agent, each call wrapped in p-retry as bench/peers/undici_peer.mjs
// wraps it (a 429, a 5xx or a network error is retried; 3 retries,
// exponential backoff from 1 s capped at 60 s with p-retry's jitter). A
// call that fails after its retries is counted and the worker goes on with
// the next, as such a loop does.
//
//   node undici_rate.mjs URL TASKS [FIRST]
//
// FIRST: the backoff's first step in seconds (p-retry's minTimeout; 1 by
// default).
//
// Prints "ready" once its client is made, then loops until it is killed
// (the bench counts what the server answered, not what this prints).
import { Agent, request } from 'undici';
import pRetry, { AbortError } from 'p-retry';

const [url, tasksArg, firstArg] = process.argv.slice(2);
const tasks = Number(tasksArg), first = Number(firstArg ?? 1);
if (!url || !(tasks >= 1) || !(first > 0)) {
  console.error('usage: node undici_rate.mjs URL TASKS [FIRST]');
  process.exit(2);
}

const agent = new Agent({ connections: tasks });

class StatusError extends Error {
  constructor(status) { super(`status ${status}`); this.status = status; }
}

async function get() {
  return pRetry(async () => {
    const res = await request(url, { dispatcher: agent });
    await res.body.text();
    if (res.statusCode === 429 || res.statusCode >= 500) throw new StatusError(res.statusCode);
    if (res.statusCode !== 200) throw new AbortError(new StatusError(res.statusCode));
  }, { retries: 3, factor: 2, minTimeout: first * 1000, maxTimeout: 60000, randomize: true });
}

async function worker() {
  for (;;) {
    try { await get(); } catch { /* counted by the server; the loop goes on */ }
  }
}

console.log('ready');
for (let w = 0; w < tasks; w++) worker();
