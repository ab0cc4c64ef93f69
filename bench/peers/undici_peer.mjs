// bench/peers/undici_peer.mjs: the Node peer of `make bench-peers`
// (bench/peers.lua), written as a Node user calls a rate-limited API:
// undici's request() on one Agent allowing CONC connections, each call
// wrapped in p-retry: a 429, a 5xx or a network error is retried, any other
// status is final; 3 retries after the first attempt, exponential backoff
// from 1 s capped at 60 s with p-retry's jitter (ratewise's defaults, as
// near as p-retry's options come).
//
//   node undici_peer.mjs URL N CONC WARMUP
//
// CONC = 1 is the sequential shape: one call at a time. Otherwise CONC
// workers each loop over their share of the N calls. WARMUP calls go first,
// off the clock (connections, the JIT). Prints one line:
//   rate=REQ_PER_S failed=F cpu_us=CPU_PER_REQ
// A failed call (an error after the retries, a status other than 200, a
// body other than "ok") is counted and the first of each kind goes to
// stderr; the exit status is 1 when any failed.
import { Agent, request } from 'undici';
import pRetry, { AbortError } from 'p-retry';

const [url, nArg, concArg, warmupArg] = process.argv.slice(2);
const n = Number(nArg), conc = Number(concArg), warmup = Number(warmupArg ?? 0);
if (!url || !(n >= 1) || !(conc >= 1) || !(warmup >= 0)) {
  console.error('usage: node undici_peer.mjs URL N CONC WARMUP');
  process.exit(2);
}

const agent = new Agent({ connections: conc });

class StatusError extends Error {
  constructor(status) { super(`status ${status}`); this.status = status; }
}

async function get() {
  return pRetry(async () => {
    const res = await request(url, { dispatcher: agent });
    const body = await res.body.text();
    if (res.statusCode === 429 || res.statusCode >= 500) throw new StatusError(res.statusCode);
    if (res.statusCode !== 200) throw new AbortError(new StatusError(res.statusCode));
    return body;
  }, { retries: 3, factor: 2, minTimeout: 1000, maxTimeout: 60000, randomize: true });
}

const shown = new Set();
async function run(count) {
  let failed = 0;
  const worker = async (calls) => {
    for (let i = 0; i < calls; i++) {
      let why = null;
      try {
        const body = await get();
        if (body !== 'ok') why = `a body of ${body.length} bytes, not "ok"`;
      } catch (err) {
        why = String(err && err.message || err);
      }
      if (why !== null) {
        failed++;
        if (!shown.has(why)) { shown.add(why); console.error(`undici failed: ${why}`); }
      }
    }
  };
  const workers = [];
  for (let w = 0; w < conc; w++) {
    const calls = Math.floor(count / conc) + (w < count % conc ? 1 : 0);
    if (calls > 0) workers.push(worker(calls));
  }
  await Promise.all(workers);
  return failed;
}

let failed = warmup > 0 ? await run(warmup) : 0;
const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
failed += await run(n);
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
await agent.close();
console.log(`rate=${(n / secs).toFixed(1)} failed=${failed} cpu_us=${((cpu.user + cpu.system) / n).toFixed(2)}`);
process.exit(failed > 0 ? 1 : 0);
