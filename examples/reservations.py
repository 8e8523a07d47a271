#!/usr/bin/env python3
"""Reservations: many workers drain one shared quota by waiting for their slot, not retrying.

The pattern, for 20 workers sending 60 e-mails through a provider that takes 10 a second:

1. Before each job, ask once: `POST /v1/acquire` {"policy", "key", "cost", "max_wait_ms"}.
   Allowed: the units are booked for you, now, for a time no later than max_wait_ms ahead;
   `delay_ms` says how long to wait (0: act at once) and `act_at` when that is, in RFC 3339 on
   the service's clock. Denied: it would not fit within max_wait_ms, and nothing was taken;
   `retry_after_ms` says how long it would have to wait.
2. Sleep `delay_ms`, counted from when the answer arrived (your clock and the service's may
   differ: prefer delay_ms to act_at), then do the job.
3. A booking you will not use (shutdown, the job was cancelled): `POST /v1/refund` with its
   cost and its `ticket` before `act_at` gives its units back, for the next reservation.

No worker is denied while the queue is shorter than its max_wait_ms, none wakes up to find the
quota taken, and the service hands out the slots first come, first served, across every worker
and every instance. The demo checks that every job was allowed, that the act_at times keep to
the limit over every interval (at most the bucket's 5 plus 10 a second), and that a cancelled
booking gives its unit back and its slot to the next reservation.

Python 3 standard library only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/reservations.py
"""
import datetime
import json
import os
import queue
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
WORKERS = 20
JOBS = 60
BURST = 5  # the bucket's capacity
RATE = 10  # units refilled per second
MAX_WAIT_MS = 20000
KEY = "mail-provider"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?(Z|[+-]\d\d:\d\d)$")


def fail(message):
    sys.exit(f"reservations.py: FAIL: {message}")


class Mismatch(Exception):
    """An answer that differs from docs/reservations.md."""


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
        raise Mismatch(f"no answer from {BASE + path}: {error}") from error
    return status, json.loads(raw) if raw else None


def decide(operation, body):
    """POST /v1/<operation>; returns the 200 answer's body."""
    status, answer = call("POST", f"/v1/{operation}", body)
    if status != 200:
        raise Mismatch(f"{operation}: expected 200, got {status}: {answer}")
    return answer


def act_at_us(answer):
    """An answer's `act_at` in µs since the epoch. The service writes as few fraction digits as
    the instant needs (`.1Z`, `.021374Z`, none), so the fraction is padded to 6 digits."""
    text = answer.get("act_at")
    m = RFC3339.match(text) if isinstance(text, str) else None
    if not m:
        raise Mismatch(f"act_at is not an RFC 3339 time: {answer}")
    seconds, fraction, offset = m.groups()
    offset = "+00:00" if offset == "Z" else offset
    at = datetime.datetime.fromisoformat(seconds + offset)
    return (at - EPOCH) // datetime.timedelta(microseconds=1) + int((fraction or "").ljust(6, "0"))


def reserve(policy, cost=1):
    """A reservation of `cost` units; returns (answer, act_at in µs). Raises on a denial."""
    answer = decide("acquire", {"policy": policy, "key": KEY, "cost": cost,
                                "max_wait_ms": MAX_WAIT_MS})
    if answer.get("allowed") is not True:
        raise Mismatch(f"a reservation was denied with a queue far shorter than {MAX_WAIT_MS} ms: {answer}")
    delay = answer.get("delay_ms")
    if not isinstance(delay, int) or not 0 <= delay <= MAX_WAIT_MS:
        raise Mismatch(f"an allowed reservation without a delay_ms from 0 to {MAX_WAIT_MS}: {answer}")
    if not answer.get("ticket"):
        raise Mismatch(f"an allowed reservation without a ticket: {answer}")
    return answer, act_at_us(answer)


def worker(policy, jobs, acts, errors, lock):
    try:
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            answer, act = reserve(policy)
            # Sleep until the slot, counted from the answer's arrival, then do the job.
            time.sleep(answer["delay_ms"] / 1000)
            with lock:
                acts.append((act, job, answer["delay_ms"]))
    except Exception as error:  # noqa: BLE001: reported by the main thread
        with lock:
            errors.append(f"{threading.current_thread().name}: {error}")


def check_rate(acts):
    """Over every interval [a_i, a_j] of the sorted act_at times, at most BURST plus what RATE a
    second refills in it (1 µs allowed for the rounding of act_at's text)."""
    for i in range(len(acts)):
        for j in range(i, len(acts)):
            span_us = acts[j] - acts[i] + 1
            allowed = BURST + span_us * RATE // 1_000_000
            if j - i + 1 > allowed:
                fail(f"{j - i + 1} jobs acted within {span_us} µs, the limit allows {allowed}")


def main():
    policy = f"example-reservations-{os.getpid()}-{random.randrange(10**6)}"
    try:
        status, body = call("POST", "/v1/policies", {
            "name": policy, "algorithm": "token_bucket",
            "capacity": BURST, "refill_tokens": RATE, "refill_period_ms": 1000})
    except Mismatch as error:
        fail(str(error))
    if status != 201:
        fail(f"create policy: expected 201, got {status}: {body}")
    print(f"created policy {policy} (token bucket, {BURST} tokens, refilled {RATE} a second)")
    try:
        run(policy)
    except Mismatch as error:
        fail(str(error))
    status, body = call("DELETE", f"/v1/policies/{policy}")
    if status != 204:
        fail(f"delete policy: expected 204, got {status}: {body}")
    print(f"deleted policy {policy}")
    print("reservations.py: OK")


def run(policy):
    jobs = queue.Queue()
    for n in range(JOBS):
        jobs.put(n)
    acts, errors, lock = [], [], threading.Lock()
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(policy, jobs, acts, errors, lock),
                                name=f"worker-{n}") for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    if errors:
        fail("; ".join(errors))
    if len(acts) != JOBS:
        fail(f"{len(acts)} jobs done, expected {JOBS}")
    times = sorted(a for a, _, _ in acts)
    check_rate(times)
    span = (times[-1] - times[0]) / 1e6
    # 60 jobs at 10 a second after a burst of 5: the last acts (60 - 5) / 10 = 5.5 s after the first.
    if span < 5.0 or elapsed < 5.0:
        fail(f"the jobs acted over {span:.2f} s and the run took {elapsed:.2f} s: expected at least 5 s")
    delayed = sum(1 for _, _, d in acts if d > 0)
    longest = max(d for _, _, d in acts)
    print(f"{JOBS} jobs by {WORKERS} workers in {elapsed:.2f} s: none denied, {JOBS - delayed} at once, "
          f"{delayed} booked ahead (longest delay_ms {longest}); acts over {span:.2f} s, "
          f"within {BURST} + {RATE} a second over every interval")

    # Cancel: a booking given back before its act_at frees its slot for the next reservation.
    # The first reservation takes the whole bucket, so that the second is booked well ahead.
    reserve(policy, cost=BURST)
    booked, booked_at = reserve(policy)
    if booked["delay_ms"] < 100:
        raise Mismatch(f"a reservation behind a full bucket's worth was booked only "
                       f"{booked['delay_ms']} ms ahead: {booked}")
    cancel = decide("refund", {"policy": policy, "key": KEY, "cost": 1, "ticket": booked["ticket"]})
    if cancel.get("allowed") is not True or cancel.get("refunded") != 1:
        raise Mismatch(f"a cancel before act_at did not give its 1 unit back: {cancel}")
    after, after_at = reserve(policy)
    if after_at != booked_at:
        raise Mismatch(f"the next reservation did not get the cancelled slot ({booked['act_at']}): {after}")
    print(f"cancel: a booking {booked['delay_ms']} ms ahead refunded {cancel['refunded']} with its "
          f"ticket; the next reservation got its slot, act_at {after['act_at']}")
    # Give that one back too, as a worker shutting down would.
    decide("refund", {"policy": policy, "key": KEY, "cost": 1, "ticket": after["ticket"]})


if __name__ == "__main__":
    main()
