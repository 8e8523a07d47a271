#!/usr/bin/env python3
"""Per-customer limits: a plan upgrade, a temporary boost that ends by itself, and a block.

A policy states the default limits and, in `tiers`, named changes of them ("pro": the same
limit, raised). An override gives the subjects its `match` selects (an exact `key`, a `prefix`
or a `cidr` range) exactly one of: a `tier`, `limits` of their own, `unlimited` or `block`,
optionally until `expires_at`. It is in force at once; the subject's counters are kept, so an
upgrade mid-window does not hand out a fresh quota, and an override that ends puts the subject
back where its usage says.

1. Plan upgrade: "acme" spends the free plan's 3 requests, is denied, moves to `pro` (10) with
   `POST /v1/policies/{name}/overrides` and is allowed again: the 3 already spent count, so 7
   are left. Decisions name the override (`override`, `tier`, the `Ratelimit-Override` header).
   `GET /v1/policies/{name}/resolve?key=acme` explains why.
2. Temporary boost: "launch-partner" gets a limit of 100 until `expires_at`, a few seconds
   ahead; when it passes, the partner is decided by the policy again, with no call to make.
3. Block: every key starting with "scraper-" is denied without consulting the store
   (`decided_by: override`, no `Retry-After`: there is no time to wait for); resolve says so.
4. Downgrade: deleting acme's override puts it back on the free plan, still 10 used of 3.

The policy is a fixed window of one hour, so every number checked is exact within the run.
Exits non-zero with a message on any answer that differs from what docs/overrides.md describes.

Python 3 standard library only. Usage: RATELIMITER_URL=http://127.0.0.1:8080 python3 examples/overrides.py
"""
import datetime
import json
import os
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
FREE, PRO, BOOST = 3, 10, 100


def fail(message):
    sys.exit(f"overrides.py: FAIL: {message}")


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


def expect(what, answer, **fields):
    for name, value in fields.items():
        if answer.get(name) != value:
            fail(f"{what}: {name} is {answer.get(name)!r}, expected {value!r}: {answer}")


def acquire(policy, key):
    """POST /v1/acquire of 1 unit; returns (answer, headers)."""
    status, headers, answer = call("POST", "/v1/acquire", {"policy": policy, "key": key})
    if status != 200:
        fail(f"acquire {key}: expected 200, got {status}: {answer}")
    return answer, headers


def create_override(policy, body):
    """POST an override; checks the 201, its Location and ETag; returns its document."""
    status, headers, doc = call("POST", f"/v1/policies/{policy}/overrides", body)
    if status != 201:
        fail(f"creating override {body}: expected 201, got {status}: {doc}")
    if headers.get("Location") != f"/v1/policies/{policy}/overrides/{doc['id']}":
        fail(f"Location is {headers.get('Location')!r} for override {doc}")
    if not headers.get("ETag"):
        fail(f"no ETag on the creation of {doc}")
    expect("created override", doc, match=body["match"])
    return doc


def resolve(policy, key):
    query = urllib.parse.urlencode({"key": key})
    status, _, answer = call("GET", f"/v1/policies/{policy}/resolve?{query}")
    if status != 200:
        fail(f"resolve {key}: expected 200, got {status}: {answer}")
    return answer


def rfc3339_in(seconds):
    """A time `seconds` from now, in whole seconds (so at least seconds - 1 ahead), as RFC 3339."""
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_upgrade(policy):
    for i in range(FREE):
        answer, _ = acquire(policy, "acme")
        expect(f"free acquire {i + 1}", answer, allowed=True, limit=FREE, remaining=FREE - 1 - i)
        if "override" in answer or "tier" in answer:
            fail(f"no override applies to acme yet: {answer}")
    answer, _ = acquire(policy, "acme")
    expect("the free plan spent", answer, allowed=False, limit=FREE, remaining=0)

    upgrade = create_override(policy, {"match": {"key": "acme"}, "tier": "pro",
                                       "reason": "upgraded to pro"})
    expect("upgrade", upgrade, tier="pro", reason="upgraded to pro")
    # In force at once, and the 3 units spent this window still count: 10 - 3 - 1 left.
    answer, headers = acquire(policy, "acme")
    expect("first acquire on pro", answer, allowed=True, limit=PRO, remaining=PRO - FREE - 1,
           tier="pro", override={"id": upgrade["id"], "match": {"key": "acme"}})
    header = headers.get("Ratelimit-Override")
    if header != f"id={upgrade['id']};match=exact;tier=pro":
        fail(f"Ratelimit-Override is {header!r}")
    allowed = 1
    while acquire(policy, "acme")[0]["allowed"]:
        allowed += 1
        if allowed > PRO:
            fail("acme was allowed more than the pro limit")
    if allowed != PRO - FREE:
        fail(f"acme was allowed {allowed} on pro after spending {FREE}, expected {PRO - FREE}")
    print(f"plan upgrade: acme spent {FREE} on free, then {allowed} more on pro ({PRO} in all)")

    why = resolve(policy, "acme")
    expect("resolve acme", why, decided_by="tier", tier="pro", override=upgrade)
    if why["limits"][0].get("limit") != PRO:
        fail(f"resolve acme: limits are {why['limits']}")
    candidates = [(c["precedence"], c["applies"], c["override"]["id"]) for c in why["candidates"]]
    if candidates != [("exact", True, upgrade["id"])]:
        fail(f"resolve acme: candidates are {why['candidates']}")
    print(f"resolve acme: decided_by={why['decided_by']} tier={why['tier']} "
          f"limit={why['limits'][0]['limit']} by override {upgrade['id']}")
    return upgrade


def temporary_boost(policy):
    answer, _ = acquire(policy, "launch-partner")
    expect("the partner before its boost", answer, allowed=True, limit=FREE, remaining=FREE - 1)
    expires_at = rfc3339_in(3)
    boost = create_override(policy, {"match": {"key": "launch-partner"},
                                     "limits": {policy: {"limit": BOOST}},
                                     "expires_at": expires_at, "reason": "launch day"})
    expect("boost", boost, expires_at=expires_at, limits={policy: {"limit": BOOST}})
    answer, _ = acquire(policy, "launch-partner")
    expect("boosted", answer, allowed=True, limit=BOOST, remaining=BOOST - 2,
           override={"id": boost["id"], "match": {"key": "launch-partner"}})
    if "tier" in answer:
        fail(f"a boost by `limits` names no tier: {answer}")
    # Nothing to call when it ends: past `expires_at` the policy decides again (its 3, of which
    # 2 are spent). Allow the instance a few seconds past the expiry.
    end = datetime.datetime.strptime(expires_at, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    while True:
        answer, _ = acquire(policy, "launch-partner")
        if "override" not in answer:
            break
        if time.time() > end + 5:
            fail(f"the boost did not end after its expiry {expires_at}: {answer}")
        time.sleep(0.2)
    if time.time() < end - 0.05:
        fail(f"the boost ended before its expiry {expires_at}")
    expect("after the boost", answer, limit=FREE)
    # The expired override is swept from the policy's overrides within seconds.
    path = f"/v1/policies/{policy}/overrides/{boost['id']}"
    while call("GET", path)[0] != 404:
        if time.time() > end + 10:
            fail(f"the expired boost {boost['id']} is still listed 10 s after its expiry")
        time.sleep(0.2)
    print(f"temporary boost: limit {BOOST} until {expires_at}, then the policy's {FREE} again")


def block(policy):
    blocked = create_override(policy, {"match": {"prefix": "scraper-"}, "block": True,
                                       "reason": "scraping"})
    expect("block", blocked, block=True)
    for key in ("scraper-1", "scraper-42"):
        answer, headers = acquire(policy, key)
        expect(f"acquire {key}", answer, allowed=False, decided_by="override",
               override={"id": blocked["id"], "match": {"prefix": "scraper-"}})
        if headers.get("Retry-After") is not None:
            fail(f"a block without expiry has no Retry-After: {headers.get('Retry-After')}")
        if headers.get("Ratelimit-Override") != f"id={blocked['id']};match=prefix":
            fail(f"Ratelimit-Override is {headers.get('Ratelimit-Override')!r}")
    answer, _ = acquire(policy, "scraper")
    expect("a key the prefix does not match", answer, allowed=True, limit=FREE)
    why = resolve(policy, "scraper-42")
    expect("resolve scraper-42", why, decided_by="block", override=blocked)
    if "limits" in why or why["candidates"][0]["precedence"] != "prefix/8":
        fail(f"resolve scraper-42: {why}")
    print("block: every key starting with 'scraper-' denied, decided_by=override")


def main():
    policy = f"example-overrides-{os.getpid()}-{random.randrange(10**6)}"
    status, _, body = call("POST", "/v1/policies", {
        "name": policy, "algorithm": "fixed_window", "limit": FREE, "window_ms": 3_600_000,
        # A policy of one limit names it after itself.
        "tiers": {"pro": {policy: {"limit": PRO}}},
    })
    if status != 201:
        fail(f"creating policy {policy}: expected 201, got {status}: {body}")
    try:
        upgrade = plan_upgrade(policy)
        temporary_boost(policy)
        block(policy)

        status, _, listed = call("GET", f"/v1/policies/{policy}/overrides")
        ids = sorted(o["id"] for o in listed["overrides"]) if status == 200 else None
        if status != 200 or upgrade["id"] not in ids or len(ids) != 2:
            fail(f"listing overrides: {status}: {listed}")

        status, _, body = call("DELETE", f"/v1/policies/{policy}/overrides/{upgrade['id']}")
        if status != 204:
            fail(f"deleting the upgrade: expected 204, got {status}: {body}")
        answer, _ = acquire(policy, "acme")
        expect("acme back on free", answer, allowed=False, limit=FREE, remaining=0)
        if "override" in answer:
            fail(f"the deleted override still applies: {answer}")
        print("downgrade: the override deleted, acme is on the free plan again, its usage kept")
    finally:
        status, _, body = call("DELETE", f"/v1/policies/{policy}")
        if status != 204:
            fail(f"deleting policy {policy}: expected 204, got {status}: {body}")
    print("overrides.py: ok")


if __name__ == "__main__":
    main()
