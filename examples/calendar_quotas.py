#!/usr/bin/env python3
"""Calendar quotas: a daily quota that resets at midnight in the customer's time zone, beside a
monthly one that resets on the 1st, in one policy.

    RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/calendar_quotas.py

Creates a policy of two limits, "daily" (3 a day in Asia/Kolkata, UTC+05:30 all year) and
"monthly" (50 a month in UTC), spends the day's 3, and checks that the fourth acquire is denied by
"daily" alone, that each limit's `resets_at` is the next midnight of its zone (the next 1st for
the month), that `retry_after_ms` counts down to it, and that `RateLimit-Policy`'s `w` is each
period's length. Then deletes the policy. Python 3 standard library only: the zones chosen have
no daylight saving, so the expected instants need no time-zone database here.
"""

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
KOLKATA = timezone(timedelta(hours=5, minutes=30))


def fail(message):
    print(f"calendar_quotas.py: {message}", file=sys.stderr)
    sys.exit(1)


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            raw = r.read()
            return r.status, r.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, e.headers, json.loads(raw) if raw else None


def next_midnight(now, zone):
    """The first instant of the day after `now` in `zone`."""
    local = now.astimezone(zone)
    return datetime(local.year, local.month, local.day, tzinfo=zone) + timedelta(days=1)


def next_first_of_month(now):
    """The first instant of the next month in UTC, and the length of this one in days."""
    local = now.astimezone(timezone.utc)
    start = datetime(local.year, local.month, 1, tzinfo=timezone.utc)
    end = datetime(local.year + local.month // 12, local.month % 12 + 1, 1, tzinfo=timezone.utc)
    return end, (end - start).days


def main():
    name = f"calendar-example-{uuid.uuid4().hex[:8]}"
    status, _, doc = call(
        "POST",
        "/v1/policies",
        {
            "name": name,
            "limits": [
                {"name": "daily", "algorithm": "fixed_window", "limit": 3,
                 "calendar": {"unit": "day", "time_zone": "Asia/Kolkata"}},
                {"name": "monthly", "algorithm": "fixed_window", "limit": 50,
                 "calendar": {"unit": "month", "time_zone": "UTC"}},
            ],
        },
    )
    if status != 201:
        fail(f"creating the policy answered {status}: {doc}")
    try:
        before = datetime.now(timezone.utc)
        for expected in (2, 1, 0):
            status, _, answer = call("POST", "/v1/acquire", {"policy": name, "key": "acme"})
            if status != 200 or not answer["allowed"] or answer["remaining"] != expected:
                fail(f"expected an allowed acquire with {expected} left: {status} {answer}")
        status, headers, denied = call("POST", "/v1/acquire", {"policy": name, "key": "acme"})
        after = datetime.now(timezone.utc)
        if status != 200 or denied["allowed"] or denied["violated"] != ["daily"]:
            fail(f"expected a denial by the daily limit: {status} {denied}")
        daily, monthly = denied["limits"]

        # The day resets at the next midnight in Kolkata, shown with its offset.
        resets = datetime.fromisoformat(daily["resets_at"])
        if resets.utcoffset() != timedelta(hours=5, minutes=30):
            fail(f"the daily reset is not shown in Kolkata's offset: {daily}")
        if resets not in (next_midnight(before, KOLKATA), next_midnight(after, KOLKATA)):
            fail(f"the daily reset is not the next midnight in Kolkata: {daily}")
        wait_ms = (resets - after).total_seconds() * 1000
        if not 0 <= daily["retry_after_ms"] - wait_ms <= 5_000:
            fail(f"retry_after_ms does not count down to {resets}: {daily}")
        if denied["retry_after_ms"] != daily["retry_after_ms"]:
            fail(f"the answer's retry_after_ms is not the daily limit's: {denied}")

        # The month resets on the 1st at midnight UTC.
        month_end, days = next_first_of_month(after)
        if datetime.fromisoformat(monthly["resets_at"]) != month_end:
            fail(f"the monthly reset is not the next 1st: {monthly}")

        policy = headers.get("RateLimit-Policy", "")
        wanted = f'"{name}/daily";q=3;w=86400, "{name}/monthly";q=50;w={days * 86400}'
        if policy != wanted:
            fail(f"RateLimit-Policy is {policy!r}, not {wanted!r}")
        print(
            f"calendar_quotas.py: denied until {daily['resets_at']} (midnight in Kolkata); "
            f"the month resets at {monthly['resets_at']}"
        )
    finally:
        status, _, _ = call("DELETE", f"/v1/policies/{name}")
        if status != 204:
            fail(f"deleting the policy answered {status}")


if __name__ == "__main__":
    main()
