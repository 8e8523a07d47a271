#!/usr/bin/env python3
"""Reserve, then settle: rate-limit work whose cost is known only afterwards (LLM tokens).

The pattern, as an LLM gateway uses it against a tokens-per-minute policy:

1. Reserve an estimate: `POST /v1/acquire` with cost=estimate (the prompt's tokens plus the
   completion's max_tokens, say). Denied: do not start the work; retry after retry_after_ms.
   Allowed: keep the answer's `ticket`.
2. Do the work, and count what it really used.
3. Settle the difference:
   - used less: `POST /v1/refund` with cost=surplus and the ticket. The ticket makes the refund
     land only where the reservation was taken (never above the full quota, nothing once time
     has refilled those units anyway); `refunded` says how many came back.
   - used more: `POST /v1/report` with cost=extra. A report is taken whether or not it fits, so
     the subject can go into debt (at most twice its quota); its next acquires are denied until
     time has paid the debt back, and retry_after_ms says when.
   - used exactly the estimate: nothing to do.

`POST /v1/peek` shows where a subject stands without spending anything. `POST /v1/reset`
(an admin token, when the service has any) gives a subject its full quota back at once.

If the client dies between reserving and settling, the estimate stays taken until it refills:
the error is on the safe side (the subject is charged at most its estimate, never let through
for free), so no clean-up is needed. A surplus that is never refunded is only lost quota.

This demo's bucket holds 1000 tokens and refills 1 per minute, so that every number it checks
is exact within its run; a real policy would refill 1000 per 60000 ms.

Python 3 standard library only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/metered.py
"""
import json
import os
import random
import sys
import urllib.error
import urllib.request

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
CAPACITY = 1000


def fail(message):
    sys.exit(f"metered.py: FAIL: {message}")


def call(method, path, body=None):
    """Returns (status, parsed JSON body or None); error statuses are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except OSError as error:
        fail(f"no answer from {BASE + path}: {error}")
    return status, json.loads(raw) if raw else None


def decide(operation, body):
    """POST /v1/<operation> (acquire, peek, report or refund); returns the 200 answer's body."""
    status, answer = call("POST", f"/v1/{operation}", body)
    if status != 200:
        fail(f"{operation}: expected 200, got {status}: {answer}")
    return answer


def expect(what, answer, **fields):
    for name, value in fields.items():
        if answer.get(name) != value:
            fail(f"{what}: {name} is {answer.get(name)!r}, expected {value!r}: {answer}")


def main():
    policy = f"example-metered-{os.getpid()}-{random.randrange(10**6)}"
    key = "team-7"
    subject = {"policy": policy, "key": key}
    status, body = call("POST", "/v1/policies", {
        "name": policy, "algorithm": "token_bucket",
        "capacity": CAPACITY, "refill_tokens": 1, "refill_period_ms": 60000})
    if status != 201:
        fail(f"create policy: expected 201, got {status}: {body}")
    print(f"created policy {policy} (token bucket, {CAPACITY} tokens, refilled 1 per minute)")

    used = 0
    # (estimate, actual): one finishes early, one runs over, one is spot on.
    for n, (estimate, actual) in enumerate([(300, 180), (200, 260), (250, 250)], start=1):
        # 1. Reserve the estimate; keep the ticket.
        answer = decide("acquire", {**subject, "cost": estimate})
        expect(f"request {n}: acquire {estimate}", answer,
               allowed=True, remaining=CAPACITY - used - estimate)
        ticket = answer.get("ticket")
        if not ticket:
            fail(f"request {n}: an allowed acquire without a ticket: {answer}")

        # 2. Do the work (here: a fixed usage).
        used += actual

        # 3. Settle.
        if actual < estimate:
            surplus = estimate - actual
            answer = decide("refund", {**subject, "cost": surplus, "ticket": ticket})
            expect(f"request {n}: refund {surplus}", answer,
                   allowed=True, refunded=surplus, remaining=CAPACITY - used)
            settled = f"refunded {answer['refunded']}"
        elif actual > estimate:
            extra = actual - estimate
            answer = decide("report", {**subject, "cost": extra})
            expect(f"request {n}: report {extra}", answer,
                   allowed=True, remaining=CAPACITY - used)
            settled = f"reported {extra} more"
        else:
            settled = "nothing to settle"

        # Where the subject stands, without spending anything.
        answer = decide("peek", {**subject, "cost": 1})
        expect(f"request {n}: peek", answer, allowed=True, remaining=CAPACITY - used)
        if "ticket" in answer:
            fail(f"request {n}: a peek returned a ticket: {answer}")
        print(f"request {n}: estimated {estimate}, used {actual}, {settled}; "
              f"peek: remaining={answer['remaining']} (= {CAPACITY} - {used})")

    # A request that runs far over its estimate: the report puts the subject into debt.
    estimate, actual = 300, 900
    answer = decide("acquire", {**subject, "cost": estimate})
    expect("request 4: acquire", answer, allowed=True, remaining=CAPACITY - used - estimate)
    used += actual
    answer = decide("report", {**subject, "cost": actual - estimate})
    expect("request 4: report", answer, allowed=True, remaining=0)
    if answer["retry_after_ms"] <= 0:
        fail(f"request 4: a subject in debt with retry_after_ms={answer['retry_after_ms']}")
    print(f"request 4: estimated {estimate}, used {actual}, reported {actual - estimate} more: "
          f"{used - CAPACITY} tokens in debt, retry_after_ms={answer['retry_after_ms']}")
    answer = decide("acquire", {**subject, "cost": 100})
    expect("acquire in debt", answer, allowed=False, remaining=0)
    if answer["retry_after_ms"] <= 0:
        fail(f"acquire in debt: denied with retry_after_ms={answer['retry_after_ms']}")
    print(f"request 5: acquire 100 denied, retry_after_ms={answer['retry_after_ms']}")

    # An operator gives the subject its quota back.
    status, body = call("POST", "/v1/reset", subject)
    if status != 204:
        fail(f"reset: expected 204, got {status}: {body}")
    answer = decide("peek", {**subject, "cost": CAPACITY})
    expect("peek after reset", answer, allowed=True, remaining=CAPACITY)
    print(f"reset: peek for {CAPACITY} is allowed, remaining={answer['remaining']}")

    status, body = call("DELETE", f"/v1/policies/{policy}")
    if status != 204:
        fail(f"delete policy: expected 204, got {status}: {body}")
    print(f"deleted policy {policy}")
    print("metered.py: OK")


if __name__ == "__main__":
    main()
