#!/usr/bin/env python3
"""Concurrency limits: hold a lease while working, renew it, release it on every exit path.

A concurrency policy bounds how many units are held at once (at most 2 exports running per
customer, here). The pattern:

1. Take a lease: `POST /v1/leases` {"policy", "key"}. Denied (200, "allowed": false): do not
   start the work; nothing was taken; retry_after_ms says when the earliest lease held now
   expires (sooner if someone releases). Granted (201): keep the answer's `lease` id.
2. Work, and renew the lease while working: `POST /v1/leases/{id}/renew` every third of its
   lifetime, from a background thread. A renewal's 404 means the lease is gone (it expired:
   this holder stalled for longer than its lease), and past its expiry someone else may hold the
   slot: stop the work.
3. Release it in a `finally`: `DELETE /v1/leases/{id}`, 204 whether or not it was still live, on
   every exit path (a return, an exception, Ctrl-C, `sys.exit`). A release that fails is logged,
   not raised over the work's own outcome: the lease expires by itself at the end of its
   lifetime.

A holder that dies without releasing (a crash, a kill -9) frees its slot when its lease expires;
the demo shows one. `held_lease` below is the part to copy.

Python 3 standard library only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/leases.py
"""
import contextlib
import json
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
LIMIT = 2
LEASE_MS = 1000
# Fields of the answers, as docs/leases.md and the OpenAPI document describe them.
TAKE_FIELDS = {"allowed", "lease", "policy", "key", "limit", "in_use", "remaining",
               "expires_in_ms", "retry_after_ms", "degraded", "decided_by"}
RENEW_FIELDS = {"lease", "policy", "key", "limit", "in_use", "remaining", "expires_in_ms",
                "degraded", "decided_by"}
STORES = {"embedded", "redis"}

# Releases that failed in a `finally` (logged there, not raised): the demo fails on any.
release_failures = []


def fail(message):
    sys.exit(f"leases.py: FAIL: {message}")


def call(method, path, body=None):
    """Returns (status, headers, parsed JSON body or None); error statuses are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, error.headers, error.read()
    except OSError as error:
        raise ConnectionError(f"no answer from {BASE + path}: {error}") from error
    return status, headers, json.loads(raw) if raw else None


def lease_path(lease_id):
    # Lease ids are URL-path safe; quoting changes nothing and keeps any id in one segment.
    return "/v1/leases/" + urllib.parse.quote(lease_id, safe="")


def expect(what, answer, **fields):
    for name, value in fields.items():
        if answer.get(name) != value:
            fail(f"{what}: {name} is {answer.get(name)!r}, expected {value!r}: {answer}")


def check_headers(what, headers, policy, limit, remaining):
    expected = {
        "RateLimit-Policy": f'"{policy}";q={limit};qu="concurrent-requests"',
        "RateLimit": f'"{policy}";r={remaining}',
    }
    for name, value in expected.items():
        if headers.get(name) != value:
            fail(f"{what}: {name} is {headers.get(name)!r}, expected {value!r}")
    for name in ("Decided-By", "Policy-ETag"):
        if not headers.get(name):
            fail(f"{what}: no {name} header")


def check_answer(what, answer, fields, policy, key):
    if set(answer) != fields:
        fail(f"{what}: fields {sorted(answer)}, expected {sorted(fields)}")
    expect(what, answer, policy=policy, key=key, degraded=False)
    if answer["decided_by"] not in STORES:
        fail(f"{what}: decided_by {answer['decided_by']!r}, expected one of {sorted(STORES)}")
    if answer["remaining"] != max(answer["limit"] - answer["in_use"], 0):
        fail(f"{what}: remaining is not limit - in_use: {answer}")


class LeaseDenied(Exception):
    """The limit is full: nothing was taken. `answer` is the denial."""

    def __init__(self, answer):
        super().__init__(f"denied, retry after {answer['retry_after_ms']} ms")
        self.answer = answer


class LeaseLost(Exception):
    """A renewal found the lease gone: stop working, the slot may be someone else's."""


class Lease:
    """A granted lease, renewed by a background thread until `stop()`."""

    def __init__(self, answer, lease_ms):
        self.answer = answer
        self.id = answer["lease"]
        self.lease_ms = lease_ms
        self.renewals = []  # the answers of the renewals that succeeded
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._renew_until_stopped, daemon=True)
        self._thread.start()

    def _renew_until_stopped(self):
        # A third of the lifetime: two renewals in a row may fail or be late before it expires.
        while not self._stop.wait(self.lease_ms / 3 / 1000):
            try:
                status, _, body = call("POST", lease_path(self.id) + "/renew",
                                       {"lease_ms": self.lease_ms})
            except ConnectionError as error:
                print(f"renewal of {self.id}: {error}; retrying", file=sys.stderr)
                continue
            if status == 200:
                self.renewals.append(body)
            elif status == 404:
                self._lost.set()
                return
            else:  # a 503 while the store is away: try again, the lease has time left
                print(f"renewal of {self.id}: {status} {body}; retrying", file=sys.stderr)

    def check(self):
        """Call between steps of the work: raises LeaseLost once a renewal got a 404."""
        if self._lost.is_set():
            raise LeaseLost(f"lease {self.id} expired or was released")

    def stop(self):
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def held_lease(policy, key, cost=1, lease_ms=LEASE_MS):
    """Takes a lease (raises LeaseDenied when the limit is full), renews it while the block runs,
    and releases it however the block ends."""
    status, headers, answer = call("POST", "/v1/leases",
                                   {"policy": policy, "key": key, "cost": cost,
                                    "lease_ms": lease_ms})
    if status == 200 and answer.get("allowed") is False:
        raise LeaseDenied(answer)
    if status != 201:
        fail(f"take: expected 201 or a 200 denial, got {status}: {answer}")
    if headers.get("Location") != lease_path(answer.get("lease", "")):
        fail(f"take: Location is {headers.get('Location')!r} for lease {answer.get('lease')!r}")
    lease = Lease(answer, lease_ms)
    lease.headers = headers
    try:
        yield lease
    finally:
        lease.stop()
        try:
            status, _, body = call("DELETE", lease_path(lease.id))
        except ConnectionError as error:
            status, body = None, str(error)
        if status != 204:
            # Not raised: that would hide the block's own exception. The lease expires anyway.
            print(f"release of {lease.id}: {status} {body}; it expires by itself",
                  file=sys.stderr)
            release_failures.append(lease.id)


def take_and_release(policy, key, cost=1):
    """A lease held for no work at all: shows what the limit has left."""
    with held_lease(policy, key, cost) as lease:
        return lease.answer


def work(name, leases, steps=6, step_s=0.4):
    """Stands for real work that lasts longer than a lease: 2.4 s against leases of 1 s."""
    for _ in range(steps):
        for lease in leases:
            lease.check()
        time.sleep(step_s)
    print(f"{name}: worked {steps * step_s:.1f} s on leases of {LEASE_MS} ms, renewed "
          + ", ".join(str(len(lease.renewals)) for lease in leases) + " times")


def main():
    policy = f"example-leases-{os.getpid()}-{random.randrange(10**6)}"
    key = "customer-42"
    document = {"name": policy, "algorithm": "concurrency", "limit": LIMIT, "lease_ms": LEASE_MS}
    status, _, body = call("POST", "/v1/policies", document)
    if status != 201:
        fail(f"create policy: expected 201, got {status}: {body}")
    expect("create policy", body, fail_mode="open", **document)
    print(f"created policy {policy} (at most {LIMIT} at once, leases of {LEASE_MS} ms)")

    # Two workers hold the two slots; a third is denied while they work.
    with held_lease(policy, key) as first:
        check_answer("first take", first.answer, TAKE_FIELDS, policy, key)
        expect("first take", first.answer, allowed=True, limit=LIMIT, in_use=1, remaining=1,
               expires_in_ms=LEASE_MS, retry_after_ms=0)
        check_headers("first take", first.headers, policy, LIMIT, 1)
        print(f"worker 1: granted lease {first.id}, in_use=1, remaining=1")
        with held_lease(policy, key) as second:
            expect("second take", second.answer, allowed=True, in_use=2, remaining=0)
            print(f"worker 2: granted lease {second.id}, in_use=2, remaining=0")
            try:
                with held_lease(policy, key):
                    fail(f"a third lease granted beyond the limit of {LIMIT}")
            except LeaseDenied as denied:
                answer = denied.answer
                check_answer("third take", answer, TAKE_FIELDS - {"lease"}, policy, key)
                expect("third take", answer, allowed=False, in_use=2, remaining=0,
                       expires_in_ms=0)
                if not 0 < answer["retry_after_ms"] <= LEASE_MS:
                    fail(f"third take: retry_after_ms {answer['retry_after_ms']} is not in "
                         f"1..={LEASE_MS}")
                print(f"worker 3: denied, retry_after_ms={answer['retry_after_ms']} "
                      "(the earliest lease's expiry; a release frees a slot sooner)")
            work("workers 1 and 2", [first, second])
            for lease in (first, second):
                if len(lease.renewals) < 2:
                    fail(f"lease {lease.id} renewed {len(lease.renewals)} times in 2.4 s")
                renewal = lease.renewals[-1]
                check_answer("renewal", renewal, RENEW_FIELDS, policy, key)
                expect("renewal", renewal, lease=lease.id, limit=LIMIT, in_use=2, remaining=0,
                       expires_in_ms=LEASE_MS)
        # Worker 2 has released its slot: one more lease fits, and no more.
        answer = take_and_release(policy, key)
        expect("take after worker 2 released", answer, allowed=True, in_use=2)
        print("worker 2 released: a new take is granted with in_use=2")

        # Work that fails: the `finally` releases its lease all the same.
        try:
            with held_lease(policy, key) as failing:
                raise RuntimeError("the export crashed")
        except RuntimeError as error:
            print(f"worker 4: {error}; its lease was released on the way out")
        answer = take_and_release(policy, key)
        expect("take after worker 4 failed", answer, allowed=True, in_use=2)

    # Everything was released: both slots are free.
    answer = take_and_release(policy, key, cost=LIMIT)
    expect(f"take of cost {LIMIT} after every release", answer, allowed=True, in_use=LIMIT)
    print(f"every lease released: a take of cost {LIMIT} is granted")

    # A released lease is gone: renewing it is a 404, releasing it again a 204.
    status, _, body = call("POST", lease_path(failing.id) + "/renew", {})
    if status != 404 or body.get("type") != "urn:ratelimiter:problem:unknown-lease":
        fail(f"renew of a released lease: expected 404 unknown-lease, got {status}: {body}")
    status, _, body = call("DELETE", lease_path(failing.id))
    if status != 204:
        fail(f"second release: expected 204, got {status}: {body}")
    print("a released lease: renew is 404 unknown-lease, a second release 204")

    # An id altered in one character is no lease: not found, and the real one is untouched.
    with held_lease(policy, key) as lease:
        last = lease.id[-1]
        altered = lease.id[:-1] + ("2" if last == "1" else "1" if last.isdigit() else "0")
        status, _, body = call("POST", lease_path(altered) + "/renew", {})
        if status != 404:
            fail(f"renew of an altered id: expected 404, got {status}: {body}")
        status, _, body = call("DELETE", lease_path(altered))
        if status not in (204, 404):
            fail(f"release of an altered id: expected 204 or 404, got {status}: {body}")
        status, _, body = call("POST", lease_path(lease.id) + "/renew", {})
        if status != 200:
            fail(f"renew after an altered id was released: expected 200, got {status}: {body}")
        expect("renew after an altered id was released", body, in_use=1)
    print("an id altered in one character: renew 404, release touches nothing")

    # A holder that dies (here: never renews nor releases) frees its slots at its expiry.
    status, _, answer = call("POST", "/v1/leases",
                             {"policy": policy, "key": "customer-7", "cost": LIMIT,
                              "lease_ms": 300})
    if status != 201:
        fail(f"take by the holder that dies: expected 201, got {status}: {answer}")
    expect("take by the holder that dies", answer, in_use=LIMIT, expires_in_ms=300)
    status, headers, answer = call("POST", "/v1/leases", {"policy": policy, "key": "customer-7"})
    if status != 200:
        fail(f"take while the dead holder's lease lasts: expected 200, got {status}: {answer}")
    expect("take while the dead holder's lease lasts", answer, allowed=False, remaining=0)
    if not 0 < answer["retry_after_ms"] <= 300 or headers.get("Retry-After") != "1":
        fail(f"denial: retry_after_ms {answer['retry_after_ms']}, Retry-After "
             f"{headers.get('Retry-After')!r}, expected 1..=300 and '1'")
    wait_ms = answer["retry_after_ms"]
    time.sleep(wait_ms / 1000)
    answer = take_and_release(policy, "customer-7")
    expect("take after the dead holder's lease expired", answer, allowed=True, in_use=1)
    print(f"a holder that died: denied, then granted after retry_after_ms={wait_ms}")

    status, _, body = call("DELETE", f"/v1/policies/{policy}")
    if status != 204:
        fail(f"delete policy: expected 204, got {status}: {body}")
    print(f"deleted policy {policy}")
    if release_failures:
        fail(f"releases that failed: {release_failures}")
    print("leases.py: OK")


if __name__ == "__main__":
    try:
        main()
    except ConnectionError as error:
        fail(str(error))
