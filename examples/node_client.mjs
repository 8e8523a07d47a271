// Acquire from a token bucket until denied, wait retry_after_ms, acquire again, clean up.
// Node 20+, built-in fetch only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 node examples/node_client.mjs
import { setTimeout as sleep } from 'node:timers/promises';

const BASE = (process.env.RATELIMITER_URL ?? 'http://127.0.0.1:8080').replace(/\/$/, '');
const policy = `example-node-${process.pid}-${Math.floor(Math.random() * 1e6)}`;

function fail(message) {
  console.error(`node_client.mjs: FAIL: ${message}`);
  process.exit(1);
}

// Returns { status, headers, body }; error statuses are answers too.
async function call(method, path, body) {
  let response;
  try {
    response = await fetch(BASE + path, {
      method,
      headers: body ? { 'Content-Type': 'application/json' } : {},
      body: body ? JSON.stringify(body) : undefined,
    });
  } catch (error) {
    fail(`no answer from ${BASE + path}: ${error.cause?.message ?? error.message}`);
  }
  const text = await response.text();
  return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null };
}

async function acquire() {
  const { status, headers, body } = await call('POST', '/v1/acquire', { policy, key: 'user-42', cost: 1 });
  if (status !== 200) fail(`acquire: expected 200, got ${status}: ${JSON.stringify(body)}`);
  for (const name of ['RateLimit', 'RateLimit-Policy']) {
    if (!headers.get(name)) fail(`acquire: no ${name} header`);
  }
  return { headers, body };
}

// 3 tokens, refilled at 1 per second: the fourth request waits about 1 s.
let res = await call('POST', '/v1/policies', {
  name: policy, algorithm: 'token_bucket', capacity: 3, refill_tokens: 1, refill_period_ms: 1000,
});
if (res.status !== 201) fail(`create policy: expected 201, got ${res.status}: ${JSON.stringify(res.body)}`);
console.log(`created policy ${policy} (token bucket, 3 tokens, 1/s)`);

let expected = 2;
let attempt = 0;
let answer;
while (true) {
  attempt += 1;
  if (attempt > 5) fail('never denied after 5 acquires');
  answer = await acquire();
  if (!answer.body.allowed) break;
  if (answer.body.remaining !== expected) {
    fail(`acquire ${attempt}: remaining ${answer.body.remaining}, expected ${expected}`);
  }
  console.log(`acquire ${attempt}: allowed, remaining=${answer.body.remaining}, RateLimit: ${answer.headers.get('RateLimit')}`);
  expected -= 1;
}
if (expected !== -1) fail(`denied after ${attempt - 1} grants, expected 3`);
const retryAfter = answer.headers.get('Retry-After');
const waitMs = answer.body.retry_after_ms;
if (!retryAfter || !(waitMs > 0)) fail(`denial without a wait: Retry-After=${retryAfter}, body=${JSON.stringify(answer.body)}`);
console.log(`acquire ${attempt}: denied, retry_after_ms=${waitMs}, Retry-After: ${retryAfter}`);

await sleep(waitMs);
answer = await acquire();
if (!answer.body.allowed) fail(`still denied after waiting ${waitMs} ms: ${JSON.stringify(answer.body)}`);
console.log(`after sleeping ${waitMs} ms: allowed, remaining=${answer.body.remaining}`);

res = await call('DELETE', `/v1/policies/${policy}`);
if (res.status !== 204) fail(`delete policy: expected 204, got ${res.status}: ${JSON.stringify(res.body)}`);
console.log(`deleted policy ${policy}`);
console.log('node_client.mjs: OK');
