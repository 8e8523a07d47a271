#!/usr/bin/env python3
"""Acquire from a token bucket until denied, wait retry_after_ms, acquire again, clean up.

Python 3 standard library only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/python_client.py
"""
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")


def fail(message):
    sys.exit(f"python_client.py: FAIL: {message}")


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
        fail(f"no answer from {BASE + path}: {error}")
    return status, headers, json.loads(raw) if raw else None


def acquire(policy, key):
    status, headers, body = call("POST", "/v1/acquire", {"policy": policy, "key": key, "cost": 1})
    if status != 200:
        fail(f"acquire: expected 200, got {status}: {body}")
    for name in ("RateLimit", "RateLimit-Policy"):
        if not headers.get(name):
            fail(f"acquire: no {name} header")
    return headers, body


def main():
    policy = f"example-python-{os.getpid()}-{random.randrange(10**6)}"
    # 3 tokens, refilled at 1 per second: the fourth request waits about 1 s.
    status, _, body = call("POST", "/v1/policies", {
        "name": policy, "algorithm": "token_bucket",
        "capacity": 3, "refill_tokens": 1, "refill_period_ms": 1000})
    if status != 201:
        fail(f"create policy: expected 201, got {status}: {body}")
    print(f"created policy {policy} (token bucket, 3 tokens, 1/s)")

    expected = 2
    for attempt in range(1, 6):
        headers, body = acquire(policy, "user-42")
        if not body["allowed"]:
            break
        if body["remaining"] != expected:
            fail(f"acquire {attempt}: remaining {body['remaining']}, expected {expected}")
        print(f"acquire {attempt}: allowed, remaining={body['remaining']}, RateLimit: {headers['RateLimit']}")
        expected -= 1
    else:
        fail("never denied after 5 acquires")
    if expected != -1:
        fail(f"denied after {attempt - 1} grants, expected 3")
    if not headers.get("Retry-After") or body["retry_after_ms"] <= 0:
        fail(f"denial without a wait: Retry-After={headers.get('Retry-After')}, body={body}")
    wait_ms = body["retry_after_ms"]
    print(f"acquire {attempt}: denied, retry_after_ms={wait_ms}, Retry-After: {headers['Retry-After']}")

    time.sleep(wait_ms / 1000)
    _, body = acquire(policy, "user-42")
    if not body["allowed"]:
        fail(f"still denied after waiting {wait_ms} ms: {body}")
    print(f"after sleeping {wait_ms} ms: allowed, remaining={body['remaining']}")

    status, _, body = call("DELETE", f"/v1/policies/{policy}")
    if status != 204:
        fail(f"delete policy: expected 204, got {status}: {body}")
    print(f"deleted policy {policy}")
    print("python_client.py: OK")


if __name__ == "__main__":
    main()
