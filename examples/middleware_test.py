#!/usr/bin/env python3
"""Starts middleware.py against RATELIMITER_URL and checks that it answers 429 with the service's
headers once a key has used its quota. Exits non-zero on any mismatch; always stops the app.

Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/middleware_test.py
"""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
POLICY = f"example-middleware-{os.getpid()}-{random.randrange(10**6)}"


class Failure(Exception):
    pass


def request(url, method="GET", body=None, headers=None):
    """Returns (status, headers, text); error statuses are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()
    except OSError as error:
        raise Failure(f"no answer from {url}: {error}")


def start_app():
    env = dict(os.environ, RATELIMITER_URL=BASE, RATELIMITER_POLICY=POLICY, PORT="0")
    app = subprocess.Popen([sys.executable, str(Path(__file__).with_name("middleware.py"))],
                           env=env, stdout=subprocess.PIPE, text=True)
    line = []
    reader = threading.Thread(target=lambda: line.append(app.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if not line or not line[0].startswith("listening on "):
        app.kill()
        app.wait()
        raise Failure(f"middleware.py did not start (exit code {app.poll()}, said {line})")
    print(line[0].strip())
    return app, line[0].split()[2]


def check(app_url):
    headers = {"X-Api-Key": "key-a"}
    for attempt in range(1, 6):
        status, got, text = request(app_url + "/hello", headers=headers)
        if status == 429:
            break
        if status != 200 or text != "hello\n":
            raise Failure(f"request {attempt}: expected 200 hello, got {status} {text!r}")
        if f'"{POLICY}";r={3 - attempt}' not in (got["RateLimit"] or ""):
            raise Failure(f"request {attempt}: RateLimit {got['RateLimit']!r}, expected r={3 - attempt}")
        print(f"request {attempt}: 200, RateLimit: {got['RateLimit']}")
    else:
        raise Failure("never got 429 after 5 requests")
    if attempt != 4:
        raise Failure(f"429 after {attempt - 1} requests, expected 3")
    expected = {"RateLimit-Policy": f'"{POLICY}";q=3;w=', "RateLimit": f'"{POLICY}";r=0;t='}
    for name, prefix in expected.items():
        if not (got[name] or "").startswith(prefix):
            raise Failure(f"429 without the service's {name} header: {got[name]!r}")
    if not (got["Retry-After"] or "").isdigit() or int(got["Retry-After"]) < 1:
        raise Failure(f"429 without a Retry-After of at least 1: {got['Retry-After']!r}")
    print(f"request {attempt}: 429, Retry-After: {got['Retry-After']}, RateLimit-Policy: {got['RateLimit-Policy']}")

    # Another key has its own quota.
    status, _, _ = request(app_url + "/hello", headers={"X-Api-Key": "key-b"})
    if status != 200:
        raise Failure(f"another key: expected 200, got {status}")
    print("another X-Api-Key: 200")


def main():
    # 3 requests per key, refilled at 1 per minute: nothing refills during the test.
    status, _, text = request(BASE + "/v1/policies", "POST", {
        "name": POLICY, "algorithm": "token_bucket",
        "capacity": 3, "refill_tokens": 1, "refill_period_ms": 60000})
    if status != 201:
        raise Failure(f"create policy: expected 201, got {status}: {text}")
    print(f"created policy {POLICY}")
    app, app_url = start_app()
    try:
        check(app_url)
    finally:
        app.terminate()
        try:
            app.wait(timeout=5)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()
        request(BASE + f"/v1/policies/{POLICY}", "DELETE")
    print("middleware_test.py: OK")


if __name__ == "__main__":
    # Stop the app on SIGTERM too (from `timeout`, CI cancellation): SystemExit runs the finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("middleware_test.py: FAIL: terminated"))
    try:
        main()
    except Failure as failure:
        sys.exit(f"middleware_test.py: FAIL: {failure}")
