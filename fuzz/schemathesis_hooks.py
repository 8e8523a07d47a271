"""Schemathesis hooks for fuzz/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

The API's spec states in prose a few rules JSON Schema cannot express, and the server answers
422 (or 400) when a request breaks them. Left alone, schema-valid ("positive") cases that break
them by chance would fail `positive_data_acceptance` although the server is right. So positive
cases are brought within these rules, and only these; negative cases are touched only to keep
them off the fixed policies (below), which changes no violation (a fixed name is a valid name, so
the violation is elsewhere), so `negative_data_rejection` still sees every violation
Schemathesis generates.

- A PUT body's `name`, when given, equals the path's name.
- The limits of a policy have distinct names.
- The `key` of an acquire, peek, report, refund, reset or lease is at most 256 bytes of UTF-8,
  a policy's `description` at most 1,024, and its `descriptor`'s `domain`, entry keys and values
  at most 256 each (the schema's `maxLength` counts characters).
- A policy is of one kind: taking a lease of a rate policy, and an acquire, peek, report, refund
  or reset on a concurrency policy, are 422 naming `policy`, which the schema cannot say (both
  kinds of call take any policy name); and a lease's `cost` above its policy's `limit` is a 422
  naming `cost`. The policy a positive case names may be a fixed one (FUZZ_FIXED_POLICIES: names
  Schemathesis generates, such as "0" or "a") or one a policy write of this run created, of
  either kind, so the hook asks the service (GET /v1/policies/{name}, FUZZ_BASE_URL): a positive
  take that names a rate policy, or a concurrency policy whose `limit` is below its `cost`, is
  sent to the first of FUZZ_LEASE_POLICIES ("exports", whose `limit` is the largest a `cost` may
  be); a positive decision that names a concurrency policy is sent to the rate policy "a" (a
  GCRA whose quota holds any cost the schema allows). A policy that does not exist is left
  alone: the 404 is documented.
- A refund's `ticket`, when given, is one this service issued for the same policy and key (422
  otherwise). A generated one never is, so a positive refund gets a real ticket instead: the
  hook reports the refund's `cost` for its policy and key (FUZZ_BASE_URL) and sends the report's
  `ticket`, so that refunds with tickets are exercised for real. When the report gives no ticket
  (no such policy, and the refund is a 404 whatever it carries; or a subject already at its debt
  bound, where a report records nothing), the ticket is left out.
- Renewing or releasing a lease needs a lease id that the service granted; a generated one never
  is (a 404 for a renewal, a 204 that touches nothing for a release, both documented). So that
  renewals and releases of live leases are exercised too, every other positive renewal and
  release outside the stateful phase gets a real id: the hook takes a lease of FUZZ_LEASE_HOOK_POLICY
  for a subject of its own (FUZZ_BASE_URL). The stateful phase is left alone: its ids come from
  the `Location` of the takes it made. For it to have takes to follow, a positive take of the
  stateful phase that names no existing policy is sent to "exports" (a random name almost never
  exists, and there is no link from a policy's creation to a take), and its `lease_ms`, and a
  stateful renewal's, is raised to at least STATEFUL_LEASE_MS: a lease that expires before the
  scenario's next step is gone, as it should be, and ensure_resource_availability would take that
  404 for a lease lost at once.
- A take's `lease_ms` above its policy's `max_lease_ms` is a 422 naming `lease_ms` the schema
  cannot foresee: such a take is sent to LEASE_POLICIES[0], which allows a day (the schema's
  bound). A renewal's `lease_ms` is held to the same bound by its lease's policy, which the hook
  does not look up: renewals of real ids are of LEASE_HOOK_POLICY, which allows a day too; and a
  policy's `max_lease_ms` below its `lease_ms` is raised to it.
- A policy's `tiers` name its limits (a policy of one limit: the policy's name) and, for each,
  fields of that limit's algorithm within their bounds; a concurrency policy has none (422
  naming `tiers`). A generated tier never fits, so a positive rate policy's tiers are rebuilt,
  under their generated names (at most MAX_TIERS), each setting one field of one of its limits
  to the limit's own value (within its bounds by construction); a concurrency policy's are
  dropped.
- Overrides (`/v1/policies/{name}/overrides[/{id}]`, `/resolve`) need a rate policy that exists;
  a `tier` that is one of its tiers; `limits` that name its limits and their algorithms' fields;
  a `cidr` without host bits; an `expires_at` in the future and at most a year ahead; a `reason`
  of at most 1,024 bytes and a `key` or `prefix` of at most 256; a `PUT` body's `id` equal to the
  path's. None of that is JSON Schema's to say, so positive cases are brought within it: the
  `cidr` is replaced by a range of 10.0.0.0/8, `expires_at` is an hour ahead, texts are cut to
  their bytes, `tier` and `limits` are rebuilt from the policy the case names (asked of the
  service). A positive case naming a concurrency policy, or a `tier` its policy lacks, is sent
  to FUZZ_OVERRIDE_POLICY (a policy with tiers, created by fuzz/schemathesis.sh); so is every
  other one naming no policy outside the stateful phase, and every one in it (so that the links
  from a creation's `Location` to GET/PUT/DELETE of `{id}` have creations to follow). Every
  other positive case on one override (`{id}`) outside the stateful phase gets a real id: the
  hook creates an override of FUZZ_OVERRIDE_POLICY for a key of its own, gives a generated
  `If-Match` that override's real ETag instead, leaves out every other `If-None-Match` (which
  never holds for a replacement), and keeps the override's match in a replacement (a generated
  match is often another override's: 409), so that replacements and deletions are made for
  real, not only refused with 412 or 409, which are right but test nothing more. Override writes never
  name a fixed policy (they would change the quotas the decisions rely on): those are sent to
  FUZZ_OVERRIDE_POLICY too, negative cases included (a fixed name is a valid one).
- A calendar limit's `calendar.time_zone` is a name of the IANA database built into the
  service (422 naming it otherwise), which the schema leaves a string rather than list some 600
  names. A generated name almost never is one, so a positive policy's calendars whose zone is
  not one of ZONES (compared without regard to ASCII case, as the service does) get one of them,
  chosen by the generated name's length.
- The policies fuzz/schemathesis.sh creates for the decisions to hit (FUZZ_FIXED_POLICIES) are
  not replaced or deleted: their quotas are the largest there is, so that any cost the schema
  allows fits them (an acquire's or peek's cost above the policy's own quota is a 422 the schema
  cannot foresee). Negative writes are kept off them too: Schemathesis reuses names it has seen
  in answers (the policy list, lease ids), and a case negative only in a way the server may
  ignore, such as a `Content-Type` on a `DELETE` without a body, would delete one.
"""

import datetime
import ipaddress
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request

import schemathesis

KEY_BYTES = 256
DESCRIPTION_BYTES = 1024
DESCRIPTOR_TEXT_BYTES = 256
FIXED = frozenset(os.environ.get("FUZZ_FIXED_POLICIES", "").split())
BASE_URL = os.environ.get("FUZZ_BASE_URL", "").rstrip("/")
# The operations whose body names a subject: `policy` and `key`.
DECISIONS = frozenset(["/v1/acquire", "/v1/peek", "/v1/report", "/v1/refund", "/v1/reset"])
# The fixed concurrency policies, and the one whose leases the hook takes for renewals and
# releases of real ids (not among the fixed names Schemathesis generates).
LEASE_POLICIES = sorted(os.environ.get("FUZZ_LEASE_POLICIES", "").split())
LEASE_HOOK_POLICY = os.environ.get("FUZZ_LEASE_HOOK_POLICY", "")
# The operations on one lease, by its id.
LEASE_PATHS = frozenset(["/v1/leases/{id}", "/v1/leases/{id}/renew"])
_lease_cases = 0
STATEFUL_LEASE_MS = 60_000
# The policy with tiers (created by fuzz/schemathesis.sh) whose overrides the hook creates for
# cases on one override, and to which it sends override cases that name no usable policy.
OVERRIDE_POLICY = os.environ.get("FUZZ_OVERRIDE_POLICY", "")
# The operations on a policy's overrides, and the writes among them (method, path).
OVERRIDE_PATHS = frozenset(["/v1/policies/{name}/overrides", "/v1/policies/{name}/overrides/{id}",
                            "/v1/policies/{name}/resolve"])
OVERRIDE_WRITES = frozenset([("POST", "/v1/policies/{name}/overrides"),
                             ("PUT", "/v1/policies/{name}/overrides/{id}"),
                             ("DELETE", "/v1/policies/{name}/overrides/{id}")])
REASON_BYTES = 1024
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_TIERS = 64
# The fields of each rate algorithm a tier or an override's `limits` may change.
ALGORITHM_FIELDS = {
    "token_bucket": ("capacity", "refill_tokens", "refill_period_ms"),
    "gcra": ("rate", "period_ms", "burst"),
    "fixed_window": ("limit", "window_ms"),
    "sliding_window_log": ("limit", "window_ms"),
    "sliding_window_counter": ("limit", "window_ms"),
}
_override_cases = 0


def _utf8_prefix(text, limit):
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def _real_ticket(policy, key, cost):
    """The ticket of a report of `cost` units for `policy`'s `key`, or None when there is none."""
    if not BASE_URL:
        return None
    body = json.dumps({"policy": policy, "key": key, "cost": cost}).encode()
    request = urllib.request.Request(f"{BASE_URL}/v1/report", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read()).get("ticket")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _policy(name):
    """The policy document named `name`, or None when there is none (or no answer)."""
    if not BASE_URL or not isinstance(name, str):
        return None
    url = f"{BASE_URL}/v1/policies/{urllib.parse.quote(name, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _real_lease():
    """The id of a lease of LEASE_HOOK_POLICY, for a subject no other case uses, or None."""
    if not BASE_URL or not LEASE_HOOK_POLICY:
        return None
    key = f"hook-{os.getpid()}-{_lease_cases}"
    body = json.dumps({"policy": LEASE_HOOK_POLICY, "key": key}).encode()
    request = urllib.request.Request(f"{BASE_URL}/v1/leases", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read()).get("lease")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _hook_match():
    """The match of the override the hook creates for the current case: a key of its own."""
    return {"key": f"hook-{os.getpid()}-{_override_cases}"}


def _real_override():
    """The id and ETag of a new override of OVERRIDE_POLICY, for a key no other case uses, or
    None."""
    if not BASE_URL or not OVERRIDE_POLICY:
        return None
    body = {"match": _hook_match(), "tier": "pro"}
    request = urllib.request.Request(f"{BASE_URL}/v1/policies/{OVERRIDE_POLICY}/overrides",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read()).get("id"), response.headers.get("ETag")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None


def _rate_limits(policy):
    """A rate policy document's limits as (name, algorithm, {field: value}), in its order."""
    if isinstance(policy.get("limits"), list) and len(policy["limits"]) > 1:
        limits = [(l.get("name"), l.get("algorithm"), l) for l in policy["limits"]
                  if isinstance(l, dict)]
    elif isinstance(policy.get("limits"), list):
        # A policy of one limit names it after itself, in either form.
        limits = [(policy.get("name"), l.get("algorithm"), l) for l in policy["limits"]
                  if isinstance(l, dict)]
    else:
        limits = [(policy.get("name"), policy.get("algorithm"), policy)]
    out = []
    for name, algorithm, doc in limits:
        fields = {f: doc[f] for f in ALGORITHM_FIELDS.get(algorithm, ())
                  if isinstance(doc.get(f), int) and not isinstance(doc.get(f), bool)}
        if isinstance(name, str) and fields:
            out.append((name, algorithm, fields))
    return out


def _valid_changes(policy, n):
    """Changes valid for `policy` (a tier's or an override's `limits`): the `n`th (cycling) of
    its limits' fields set to the limit's own value; None when it has no rate limit."""
    choices = [(name, field, value) for name, _, fields in _rate_limits(policy)
               for field, value in fields.items()]
    if not choices:
        return None
    name, field, value = choices[n % len(choices)]
    return {name: {field: value}}


def _rebuild_tiers(body, name):
    """A positive policy write's `tiers`, made valid for its own limits (see the module doc);
    `name` is the policy's, which a flat policy's one limit is named after."""
    tiers = body.get("tiers")
    if not isinstance(tiers, dict):
        return
    if body.get("algorithm") == "concurrency":
        del body["tiers"]
        return
    names = list(tiers)[:MAX_TIERS]
    rebuilt = {}
    for i, tier in enumerate(names):
        changes = _valid_changes({**body, "name": body.get("name", name)}, i)
        if changes is None:
            break
        # Tier names follow the policy names' pattern, which the schema states only in prose.
        rebuilt[tier if NAME.fullmatch(tier) else f"tier-{i}"] = changes
    if rebuilt or not names:
        body["tiers"] = rebuilt
    else:
        del body["tiers"]


def _override_body_in_rules(body, policy, path_id):
    """A positive override body brought within the rules JSON Schema cannot say (module doc),
    for `policy` (its document); False when `policy` cannot take it as it is (no such tier)."""
    if isinstance(body.get("id"), str):
        # A creation's `id` is the service's to choose; a replacement's is the path's.
        if path_id is None:
            del body["id"]
        else:
            body["id"] = path_id
    m = body.get("match")
    if isinstance(m, dict):
        body["match"] = m = dict(m)
        for member in ("key", "prefix"):
            if isinstance(m.get(member), str):
                m[member] = _utf8_prefix(m[member], KEY_BYTES)
        if isinstance(m.get("cidr"), str):
            try:
                net = ipaddress.ip_network(m["cidr"], strict=True)
                valid = "/" in m["cidr"] and not (net.version == 6 and net.prefixlen >= 96
                                                  and net.network_address.ipv4_mapped)
            except ValueError:
                valid = False
            if not valid:
                m["cidr"] = f"10.{len(m['cidr']) % 256}.0.0/16"
    if isinstance(body.get("expires_at"), str):
        at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        body["expires_at"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(body.get("reason"), str):
        body["reason"] = _utf8_prefix(body["reason"], REASON_BYTES)
    if isinstance(body.get("tier"), str):
        tiers = sorted(policy.get("tiers") or {})
        if not tiers:
            return False
        if body["tier"] not in tiers:
            body["tier"] = tiers[len(body["tier"]) % len(tiers)]
    if isinstance(body.get("limits"), dict):
        changes = _valid_changes(policy, len(body["limits"]))
        if changes is None:
            return False
        body["limits"] = changes
    return True


def _overrides_in_rules(case, method, path, body, stateful):
    """A positive case on a policy's overrides, made to name a usable policy (module doc)."""
    global _override_cases
    params = case.path_parameters
    if not params or not OVERRIDE_POLICY:
        return
    _override_cases += 1
    if path == "/v1/policies/{name}/overrides/{id}" and not stateful and _override_cases % 2 == 0:
        real = _real_override()
        if real is not None and real[0]:
            params["name"], params["id"] = OVERRIDE_POLICY, real[0]
            # A generated `If-Match` is never the new override's version, and `If-None-Match: *`
            # never holds for a replacement (412s, which are right but test nothing more): the
            # real ETag instead, and every other `If-None-Match` left out.
            headers = case.headers
            if headers and real[1] and headers.get("If-Match") not in (None, "*"):
                headers["If-Match"] = real[1]
            if headers and "If-None-Match" in headers and _override_cases % 4 == 0:
                del headers["If-None-Match"]
            # Its replacement keeps its match (a generated one is often another override's, a
            # 409), so that what it sets is what changes.
            if method == "PUT" and body is not None and isinstance(body.get("match"), dict):
                body["match"] = _hook_match()
    if path == "/v1/policies/{name}/resolve" and isinstance(case.query, dict) \
            and isinstance(case.query.get("key"), str):
        case.query["key"] = _utf8_prefix(case.query["key"], KEY_BYTES)
    policy = _policy(params.get("name"))
    if (policy is None and (stateful or _override_cases % 2 == 1)) \
            or (policy is not None and policy.get("algorithm") == "concurrency"):
        params["name"] = OVERRIDE_POLICY
        policy = _policy(OVERRIDE_POLICY)
    if policy is None or body is None or method not in ("POST", "PUT"):
        return
    if not _override_body_in_rules(body, policy, params.get("id")):
        params["name"] = OVERRIDE_POLICY
        policy = _policy(OVERRIDE_POLICY)
        if policy is not None:
            _override_body_in_rules(body, policy, params.get("id"))


# Zones of the IANA database, with and without daylight saving, north and south, whole and
# fractional offsets.
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Adelaide",
         "Asia/Tokyo", "America/Sao_Paulo", "Pacific/Chatham")


def _zones_in_rules(body):
    """The calendars of a positive policy body (its own and its limits') given a real zone."""
    limits = body.get("limits")
    for doc in [body] + (limits if isinstance(limits, list) else []):
        calendar = doc.get("calendar") if isinstance(doc, dict) else None
        if isinstance(calendar, dict) and isinstance(calendar.get("time_zone"), str):
            zone = calendar["time_zone"]
            if zone.lower() not in {z.lower() for z in ZONES}:
                doc["calendar"] = dict(calendar, time_zone=ZONES[len(zone) % len(ZONES)])


def _distinct_names(limits):
    seen = set()
    for i, limit in enumerate(limits):
        if not isinstance(limit, dict) or not isinstance(limit.get("name"), str):
            continue
        name = limit["name"]
        n = i
        while name in seen:
            # Still a valid name: a valid one, cut to leave room, plus `-<n>`.
            name = f"{limit['name'][:60]}-{n}"
            n += 1
        limit["name"] = name
        seen.add(name)


def _descriptor_in_bytes(descriptor):
    """A policy's `descriptor` with its texts cut to DESCRIPTOR_TEXT_BYTES of UTF-8 (never to
    nothing: a character is at most 4 bytes)."""
    if not isinstance(descriptor, dict):
        return
    if isinstance(descriptor.get("domain"), str):
        descriptor["domain"] = _utf8_prefix(descriptor["domain"], DESCRIPTOR_TEXT_BYTES)
    entries = descriptor.get("entries")
    if isinstance(entries, list):
        # Generated entries may be one object twice: copy them first.
        entries = json.loads(json.dumps(entries))
        descriptor["entries"] = entries
        for entry in entries:
            for field in ("key", "value"):
                if isinstance(entry, dict) and isinstance(entry.get(field), str):
                    entry[field] = _utf8_prefix(entry[field], DESCRIPTOR_TEXT_BYTES)


@schemathesis.hook
def before_call(context, case, kwargs):
    """Every case of every phase, as it is about to be sent (after the stateful phase's links
    have filled it in); Schemathesis revalidates what is changed here."""
    global _lease_cases
    meta = case.meta
    if meta is None:
        return
    method = case.operation.method.upper()
    path = case.operation.path
    body = case.body if isinstance(case.body, dict) else None

    if path == "/v1/policies/{name}" and method in ("PUT", "DELETE"):
        params = case.path_parameters
        if params and params.get("name") in FIXED:
            params["name"] = f"{params['name'][:60]}-w"
    if (method, path) in OVERRIDE_WRITES and OVERRIDE_POLICY:
        params = case.path_parameters
        if params and params.get("name") in FIXED:
            params["name"] = OVERRIDE_POLICY
    if not meta.generation.mode.is_positive:
        return
    stateful = meta.phase.name == "stateful"
    if path in OVERRIDE_PATHS:
        _overrides_in_rules(case, method, path, body, stateful)
        return

    if path == "/v1/policies/{name}" and method == "PUT":
        params = case.path_parameters
        if params and body is not None and isinstance(body.get("name"), str):
            body["name"] = params["name"]

    if path.startswith("/v1/policies") and body is not None:
        if isinstance(body.get("limits"), list):
            # Generated limits may be one object twice (an example's are): copy them first.
            body["limits"] = json.loads(json.dumps(body["limits"]))
            _distinct_names(body["limits"])
        _zones_in_rules(body)
        if isinstance(body.get("description"), str):
            body["description"] = _utf8_prefix(body["description"], DESCRIPTION_BYTES)
        _descriptor_in_bytes(body.get("descriptor"))
        _rebuild_tiers(body, (case.path_parameters or {}).get("name"))
        # A concurrency policy's `max_lease_ms` is at least its `lease_ms` (a 422 naming
        # `max_lease_ms` otherwise), which JSON Schema cannot say.
        lease, longest = body.get("lease_ms"), body.get("max_lease_ms")
        if isinstance(lease, (int, float)) and isinstance(longest, (int, float)) \
                and longest < lease:
            body["max_lease_ms"] = lease

    if (path in DECISIONS or path == "/v1/leases") and body is not None \
            and isinstance(body.get("key"), str):
        body["key"] = _utf8_prefix(body["key"], KEY_BYTES)

    if path in DECISIONS and body is not None:
        policy = _policy(body.get("policy"))
        if policy is not None and policy.get("algorithm") == "concurrency":
            body["policy"] = "a"
    if stateful and path in ("/v1/leases", "/v1/leases/{id}/renew") and body is not None \
            and isinstance(body.get("lease_ms"), (int, float)):
        body["lease_ms"] = max(body["lease_ms"], STATEFUL_LEASE_MS)
    if path == "/v1/leases" and body is not None and LEASE_POLICIES:
        policy = _policy(body.get("policy"))
        cost = body.get("cost")
        lease = body.get("lease_ms")
        if (policy is None and stateful) or (policy is not None and (
                policy.get("algorithm") != "concurrency"
                or (isinstance(cost, (int, float)) and cost > policy.get("limit", 0))
                or (isinstance(lease, (int, float))
                    and lease > policy.get("max_lease_ms", policy.get("lease_ms", 0))))):
            body["policy"] = LEASE_POLICIES[0]
    if path == "/v1/leases/{id}/renew" and body is not None \
            and isinstance(body.get("lease_ms"), (int, float)) and case.path_parameters:
        # A renewal may ask for at most its lease's policy's max_lease_ms, named in the id.
        parts = str(case.path_parameters.get("id", "")).split("~")
        policy = _policy(parts[1]) if len(parts) == 5 else None
        longest = policy.get("max_lease_ms") if policy else None
        if isinstance(longest, int) and body["lease_ms"] > longest:
            body["lease_ms"] = longest

    if path in LEASE_PATHS and not stateful and case.path_parameters:
        _lease_cases += 1
        if _lease_cases % 2 == 0:
            lease = _real_lease()
            if lease is not None:
                case.path_parameters["id"] = lease

    if path == "/v1/refund" and body is not None and isinstance(body.get("ticket"), str):
        ticket = _real_ticket(body.get("policy"), body.get("key"), body.get("cost"))
        if ticket is None:
            del body["ticket"]
        else:
            body["ticket"] = ticket


# Where every answer's method, path and status are written (FUZZ_TALLY), so that
# fuzz/schemathesis.sh can tell that an operation was exercised for real (answered 2xx), not only
# refused; the lease counters tell it for leases, nothing but this for overrides.
TALLY = os.environ.get("FUZZ_TALLY", "")


@schemathesis.hook
def after_call(context, case, response):
    if TALLY:
        with open(TALLY, "a", encoding="utf-8") as tally:
            tally.write(f"{case.operation.method.upper()} {case.operation.path} "
                        f"{response.status_code}\n")
