// The scenario of clients/check.sh, through a TypeScript client: types that openapi-typescript
// generated from openapi/openapi.json (generated/schema.d.ts; clients/check.sh writes it) and the
// openapi-fetch runtime, which checks every path, body and answer against those types.
//
// Usage: tsx scenario.ts BASE_URL ADMIN_TOKEN CLIENT_TOKEN
//
// ADMIN_TOKEN is one of the service's `auth.admin_tokens` (the policy API), CLIENT_TOKEN one of
// its `auth.client_tokens` (decisions and leases). Creates a policy of several limits, acquires
// until denied, peeks, refunds with the ticket of the last allowed acquire, creates a concurrency
// policy and takes and releases a lease of it, reads and lists the policies, and deletes both.
// Exits non-zero, saying which step, at the first answer that is not the one expected.
import { randomUUID } from "node:crypto";
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/schema.js";

type SeveralLimitsPolicy = components["schemas"]["SeveralLimitsPolicy"];
type ConcurrencyPolicy = components["schemas"]["ConcurrencyPolicy"];
type PolicyDoc = components["schemas"]["PolicyDoc"];

function check(step: string, ok: boolean, detail: unknown): void {
  if (!ok) {
    console.error(`typescript scenario: ${step}: unexpected answer: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`typescript scenario: ${step}: ok`);
}

function isSeveralLimits(p: PolicyDoc | undefined): p is SeveralLimitsPolicy {
  return p !== undefined && "limits" in p;
}

const [baseUrl, adminToken, clientToken] = process.argv.slice(2);
if (!baseUrl || !adminToken || !clientToken) {
  console.error("usage: tsx scenario.ts BASE_URL ADMIN_TOKEN CLIENT_TOKEN");
  process.exit(2);
}
const admin = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${adminToken}` } });
const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${clientToken}` } });

const suffix = randomUUID().slice(0, 8);
const rate = `ts-rate-${suffix}`;
const leases = `ts-leases-${suffix}`;

// A policy of two limits: 3 per minute and a bucket of 5.
const policy: SeveralLimitsPolicy = {
  name: rate,
  limits: [
    { name: "per-minute", algorithm: "fixed_window", limit: 3, window_ms: 60_000 },
    { name: "burst", algorithm: "token_bucket", capacity: 5, refill_tokens: 1, refill_period_ms: 60_000 },
  ],
};
const created = await admin.POST("/v1/policies", { body: policy });
check("create a policy of several limits", created.response.status === 201, created.error);
check(
  "the answer is a policy of several limits",
  isSeveralLimits(created.data) && created.data.limits.length === 2,
  created.data,
);

// Acquire until denied: the window admits 3.
let ticket: string | null | undefined;
const answers: boolean[] = [];
for (let i = 0; i < 10; i++) {
  const { data, error } = await client.POST("/v1/acquire", { body: { policy: rate, key: "user-1" } });
  check("acquire", data !== undefined, error);
  if (data === undefined) break;
  answers.push(data.allowed);
  if (!data.allowed) {
    check("denied with a retry", data.retry_after_ms > 0 && data.remaining === 0, data);
    break;
  }
  ticket = data.ticket;
}
check(
  "acquire until denied: 3 allowed, then denied",
  JSON.stringify(answers) === JSON.stringify([true, true, true, false]),
  answers,
);
check("an allowed acquire has a ticket", typeof ticket === "string" && ticket.length > 0, ticket);

let peek = await client.POST("/v1/peek", { body: { policy: rate, key: "user-1" } });
check("peek answers denied", peek.data?.allowed === false, peek.data ?? peek.error);

const refund = await client.POST("/v1/refund", {
  body: { policy: rate, key: "user-1", cost: 1, ticket },
});
check("refund with the ticket gives 1 back", refund.data?.refunded === 1, refund.data ?? refund.error);
peek = await client.POST("/v1/peek", { body: { policy: rate, key: "user-1" } });
check("peek after the refund answers allowed", peek.data?.allowed === true, peek.data ?? peek.error);

// Replace the policy (PUT, name from the path) and read it back.
const replaced = await admin.PUT("/v1/policies/{name}", {
  params: { path: { name: rate } },
  body: { limits: policy.limits, description: "from TypeScript" },
});
check("replace the policy", replaced.response.status === 200, replaced.error);
const read = await admin.GET("/v1/policies/{name}", { params: { path: { name: rate } } });
check(
  "read it back",
  isSeveralLimits(read.data) && read.data.description === "from TypeScript",
  read.data ?? read.error,
);

// A concurrency policy: take a lease, release it.
const concurrency: ConcurrencyPolicy = {
  name: leases,
  algorithm: "concurrency",
  limit: 1,
  lease_ms: 30_000,
};
const createdLeases = await admin.POST("/v1/policies", { body: concurrency });
check("create a concurrency policy", createdLeases.response.status === 201, createdLeases.error);
const lease = await client.POST("/v1/leases", { body: { policy: leases, key: "job-1" } });
check("take a lease", lease.data?.allowed === true && !!lease.data.lease, lease.data ?? lease.error);
const second = await client.POST("/v1/leases", { body: { policy: leases, key: "job-1" } });
check("a second lease is denied", second.data?.allowed === false, second.data ?? second.error);
const released = await client.DELETE("/v1/leases/{id}", {
  params: { path: { id: lease.data?.lease ?? "" } },
});
check("release the lease", released.response.status === 204, released.error);
const again = await client.POST("/v1/leases", { body: { policy: leases, key: "job-1" } });
check("a lease again after the release", again.data?.allowed === true, again.data ?? again.error);
await client.DELETE("/v1/leases/{id}", { params: { path: { id: again.data?.lease ?? "" } } });

const page = await admin.GET("/v1/policies");
const names = page.data?.policies.map((p) => p.name) ?? [];
check("list the policies", names.includes(rate) && names.includes(leases), names);

for (const name of [rate, leases]) {
  const removed = await admin.DELETE("/v1/policies/{name}", { params: { path: { name } } });
  check(`delete ${name}`, removed.response.status === 204, removed.error);
}
const gone = await admin.GET("/v1/policies/{name}", { params: { path: { name: rate } } });
check("the policy is gone", gone.response.status === 404, gone.error);
console.log("typescript scenario: passed");
