"""The scenario of clients/check.sh, through a Python client that openapi-python-client generated
from openapi/openapi.json (imported as `ratelimiter_client`; clients/check.sh puts it on the path).

Usage: python3 scenario.py BASE_URL ADMIN_TOKEN CLIENT_TOKEN

ADMIN_TOKEN is one of the service's `auth.admin_tokens` (the policy API), CLIENT_TOKEN one of its
`auth.client_tokens` (decisions and leases).

Creates a policy of several limits, acquires until denied, peeks, refunds with the ticket of the
last allowed acquire, creates a concurrency policy and takes and releases a lease of it, reads
and lists the policies back as typed models, and deletes both policies. Exits non-zero, saying
which step, at the first answer that is not the one expected.
"""

import sys
import uuid

from ratelimiter_client import AuthenticatedClient
from ratelimiter_client.api.decisions import acquire, peek, refund
from ratelimiter_client.api.leases import release, take
from ratelimiter_client.api.policies import (
    create_policy,
    delete_policy,
    list_policies,
    read_policy,
    replace_policy,
)
from ratelimiter_client.models import (
    AcquireRequest,
    AcquireResponse,
    ConcurrencyPolicy,
    ConcurrencyPolicyAlgorithm,
    FixedWindowLimit,
    FixedWindowLimitAlgorithm,
    PolicyList,
    RefundRequest,
    SeveralLimitsPolicy,
    SeveralLimitsPolicyReplacement,
    TakeLeaseRequest,
    TakeLeaseResponse,
    TokenBucketLimit,
    TokenBucketLimitAlgorithm,
)


def check(step: str, ok: bool, detail: object) -> None:
    if not ok:
        print(f"python scenario: {step}: unexpected answer: {detail!r}", file=sys.stderr)
        sys.exit(1)
    print(f"python scenario: {step}: ok")


def main() -> None:
    base_url, admin_token, client_token = sys.argv[1:4]
    admin = AuthenticatedClient(base_url=base_url, token=admin_token, raise_on_unexpected_status=True)
    client = AuthenticatedClient(base_url=base_url, token=client_token, raise_on_unexpected_status=True)
    suffix = uuid.uuid4().hex[:8]
    rate, leases = f"py-rate-{suffix}", f"py-leases-{suffix}"

    # A policy of two limits: 3 per minute and a bucket of 5.
    policy = SeveralLimitsPolicy(
        name=rate,
        limits=[
            FixedWindowLimit(
                name="per-minute",
                algorithm=FixedWindowLimitAlgorithm.FIXED_WINDOW,
                limit=3,
                window_ms=60_000,
            ),
            TokenBucketLimit(
                name="burst",
                algorithm=TokenBucketLimitAlgorithm.TOKEN_BUCKET,
                capacity=5,
                refill_tokens=1,
                refill_period_ms=60_000,
            ),
        ],
    )
    r = create_policy.sync_detailed(client=admin, body=policy)
    check("create a policy of several limits", r.status_code == 201, r.content)
    check(
        "the answer is a typed policy of several limits",
        isinstance(r.parsed, SeveralLimitsPolicy) and len(r.parsed.limits) == 2,
        r.parsed,
    )

    # Acquire until denied: the window admits 3.
    ticket = None
    answers = []
    for _ in range(10):
        a = acquire.sync(client=client, body=AcquireRequest(policy=rate, key="user-1"))
        check("acquire", isinstance(a, AcquireResponse), a)
        answers.append(a.allowed)
        if not a.allowed:
            check("denied with a retry", a.retry_after_ms > 0 and a.remaining == 0, a)
            break
        ticket = a.ticket
    check("acquire until denied: 3 allowed, then denied", answers == [True, True, True, False], answers)
    check("an allowed acquire has a ticket", isinstance(ticket, str) and ticket, ticket)

    p = peek.sync(client=client, body=AcquireRequest(policy=rate, key="user-1"))
    check("peek answers denied", isinstance(p, AcquireResponse) and not p.allowed, p)

    f = refund.sync(
        client=client,
        body=RefundRequest(policy=rate, key="user-1", cost=1, ticket=ticket),
    )
    check("refund with the ticket gives 1 back", isinstance(f, AcquireResponse) and f.refunded == 1, f)
    p = peek.sync(client=client, body=AcquireRequest(policy=rate, key="user-1"))
    check("peek after the refund answers allowed", isinstance(p, AcquireResponse) and p.allowed, p)

    # Replace the policy (PUT, name from the path) and read it back.
    r = replace_policy.sync_detailed(
        name=rate,
        client=admin,
        body=SeveralLimitsPolicyReplacement(limits=policy.limits, description="from Python"),
    )
    check("replace the policy", r.status_code == 200, r.content)
    got = read_policy.sync(name=rate, client=admin)
    check(
        "read it back as a typed policy",
        isinstance(got, SeveralLimitsPolicy) and got.description == "from Python",
        got,
    )

    # A concurrency policy: take a lease, release it.
    r = create_policy.sync_detailed(
        client=admin,
        body=ConcurrencyPolicy(
            name=leases,
            algorithm=ConcurrencyPolicyAlgorithm.CONCURRENCY,
            limit=1,
            lease_ms=30_000,
        ),
    )
    check("create a concurrency policy", r.status_code == 201 and isinstance(r.parsed, ConcurrencyPolicy), r.content)
    lease = take.sync(client=client, body=TakeLeaseRequest(policy=leases, key="job-1"))
    check("take a lease", isinstance(lease, TakeLeaseResponse) and lease.allowed and lease.lease, lease)
    second = take.sync(client=client, body=TakeLeaseRequest(policy=leases, key="job-1"))
    check("a second lease is denied", isinstance(second, TakeLeaseResponse) and not second.allowed, second)
    r = release.sync_detailed(id=lease.lease, client=client)
    check("release the lease", r.status_code == 204, r.content)
    again = take.sync(client=client, body=TakeLeaseRequest(policy=leases, key="job-1"))
    check("a lease again after the release", isinstance(again, TakeLeaseResponse) and again.allowed, again)
    release.sync_detailed(id=again.lease, client=client)

    page = list_policies.sync(client=admin)
    names = [p.name for p in page.policies] if isinstance(page, PolicyList) else page
    check("list the policies", isinstance(page, PolicyList) and rate in names and leases in names, names)

    for name in (rate, leases):
        r = delete_policy.sync_detailed(name=name, client=admin)
        check(f"delete {name}", r.status_code == 204, r.content)
    r = read_policy.sync_detailed(name=rate, client=admin)
    check("the policy is gone", r.status_code == 404, r.content)
    print("python scenario: passed")


if __name__ == "__main__":
    main()
