#!/usr/bin/env bash
# Property-based API fuzzing of the ratelimiter with Schemathesis, against its own OpenAPI
# document (/openapi.json). Runs the prebuilt release binary with the embedded store on a free
# loopback port; exits non-zero when Schemathesis reports any failure or error.
#
#   bash fuzz/schemathesis.sh
#
# Environment:
#   RATELIMITER_BIN        binary to run (default target/release/ratelimiter)
#   SCHEMATHESIS_EXAMPLES  max test cases per operation and phase (default 50)
#   SCHEMATHESIS_SEED      random seed (default fixed, for reproducible CI; "random" for none)
#   SCHEMATHESIS_CHECKS    comma-separated checks (default below)
set -euo pipefail

cd "$(dirname "$0")/.."

ST_VERSION=4.32.5
VENV=target/schemathesis-venv
BIN=${RATELIMITER_BIN:-target/release/ratelimiter}
EXAMPLES=${SCHEMATHESIS_EXAMPLES:-50}
SEED=${SCHEMATHESIS_SEED:-20240601}
# Checks: server errors; conformance of status, content type, headers and body to the spec;
# negative_data_rejection (anything off the schema is refused with a 4xx) and
# positive_data_acceptance (anything the schema allows is accepted), which hold because the
# policy schema is one closed object per algorithm (`additionalProperties: false`) and every
# bound comes from the same constants as the server's checks (an override is one closed object
# per thing it sets, so "exactly one of tier, limits, unlimited, block" is the schema's too).
# What JSON Schema cannot say (a PUT body's name equal to the path's, distinct limit names,
# lengths in bytes, a cost within the policy's own quota, a refund's ticket issued for its own
# policy and key, tiers naming the policy's own limits, an override's tier being one of its
# policy's, a range without host bits, an expiry within a year) is kept out of positive cases by
# fuzz/schemathesis_hooks.py, which says why for each; 412 (a precondition
# that does not hold) counts as an acceptance, see fuzz/schemathesis.toml. Then the stateful
# checks, over links Schemathesis infers (POST's Location to GET/PUT/DELETE): use_after_free (a
# deleted policy is gone) and ensure_resource_availability (a created one is there at once);
# and the HTTP checks, unsupported_method (405 with Allow), allow_header_conformance (Allow
# names the documented methods) and missing_required_header.
# Left out: ignored_auth and object_level_authorization, which need credentials: this run sets
# no tokens, and the spec marks auth optional (`security: [{}, {bearer}]`), so they would test
# nothing.
# Schemathesis warns that PUT and DELETE "mostly rejected generated data": most generated writes
# name an ETag that is no policy's (or override's) version (412) or a policy or override that
# does not exist (404), as they should. That the lease and override operations were exercised
# with real data, not only refused, is checked after the run (below).
# Crashes / transport errors (connection reset, timeouts, invalid responses) are always reported
# by Schemathesis as errors and make it exit non-zero regardless of the checks chosen.
CHECKS=${SCHEMATHESIS_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,positive_data_acceptance,use_after_free,ensure_resource_availability,unsupported_method,allow_header_conformance,missing_required_header}

if [[ ! -x $BIN ]]; then
    echo "schemathesis.sh: $BIN not found; build it first (cargo build --release)" >&2
    exit 2
fi

# --- Schemathesis, in a reusable virtualenv under target/ ----------------------------------
if [[ ! -x $VENV/bin/st ]] || [[ "$("$VENV/bin/st" --version 2>/dev/null)" != *"$ST_VERSION"* ]]; then
    echo "==> installing schemathesis==$ST_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
"$VENV/bin/st" --version

# --- The service, on a free loopback port -------------------------------------------------
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
BASE="http://127.0.0.1:$PORT"
WORK=$(mktemp -d)
LOG=$WORK/ratelimiter.log

RL_PID=
cleanup() {
    if [[ -n $RL_PID ]] && kill -0 "$RL_PID" 2>/dev/null; then
        kill "$RL_PID" 2>/dev/null || true
        wait "$RL_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> starting $BIN on $BASE"
# Open auth (no tokens configured), embedded in-process store; never a real Redis. Refunds
# without a ticket are accepted (limits.ticketless_refunds): the schema's `ticket` is optional,
# as it is for a service with that setting, and the hooks leave it out when no real one can be
# had (a subject at its debt bound gets none); tests/api/tickets.rs holds the default's 422.
env -u RATELIMITER__AUTH__ADMIN_TOKENS -u RATELIMITER__AUTH__CLIENT_TOKENS \
    -u RATELIMITER__AUTH__SETTLE_TOKENS RATELIMITER__LIMITS__TICKETLESS_REFUNDS=true \
    RATELIMITER__SERVER__BIND="127.0.0.1:$PORT" RUST_LOG="${RUST_LOG:-warn}" \
    "$BIN" >"$LOG" 2>&1 &
RL_PID=$!

ready=
for _ in $(seq 1 100); do
    if ! kill -0 "$RL_PID" 2>/dev/null; then
        echo "schemathesis.sh: ratelimiter exited during startup:" >&2
        cat "$LOG" >&2
        exit 2
    fi
    if curl -fsS -o /dev/null --max-time 1 "$BASE/readyz"; then
        ready=1
        break
    fi
    sleep 0.1
done
if [[ -z $ready ]]; then
    echo "schemathesis.sh: $BASE/readyz not ready after 10 s:" >&2
    cat "$LOG" >&2
    exit 2
fi

# --- Policies for the decisions to hit ------------------------------------------------------
# "api-per-user" (acquire, peek), "llm-tokens" (report, refund) and "login-failures" (reset) are
# the policies named in the spec's examples, so the examples phase of every decision hits an
# existing policy; the other names are among those Schemathesis generates for `policy` (random
# names get 404, which is documented); "exports" (leases) likewise. Every quota is the largest the schema allows for `cost`,
# so a schema-valid acquire or peek always fits; sliding_window_log (at most 10,000) is left out
# for that reason. Reports of large costs put subjects into debt, so later acquires and peeks of
# the same subjects can be denied, and the denials' fields are checked too. "A" has several
# limits, so the `limits`, `violated` and per-limit `units` fields of the answers are checked;
# "0" is in shadow mode, so `shadow` and `would_allow` are. "exports" is a concurrency policy whose
# `limit` is the largest a lease's `cost` may be, so any schema-valid take fits it (and takes of
# one subject that fill it are denied, which checks the denials' fields); its leases last 10
# minutes, longer than the run, so a lease the stateful phase takes is still there when it
# renews or releases it. "fuzz-lease-ids" (FUZZ_LEASE_HOOK_POLICY) is the hooks' own, never a
# generated name: they take its leases to give positive renewals and releases real ids. The hooks
# keep writes off these names, give positive refunds a real ticket (FUZZ_BASE_URL), and send
# positive lease takes that name a rate policy to "exports" (and decisions that name "exports"
# to "a"): each kind of call refuses the other kind of policy with a 422 the schema cannot say.
create_policy() {
    local code
    code=$(curl -sS -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' \
        -X PUT "$BASE/v1/policies/$1" -d "$2")
    if [[ $code != 200 && $code != 201 ]]; then
        echo "schemathesis.sh: creating policy $1 failed with $code: $(cat "$WORK/body")" >&2
        exit 2
    fi
}
FIXED_POLICIES="api-per-user llm-tokens login-failures login a A 0 exports fuzz-lease-ids fuzz-plans"
LEASE_POLICIES="exports fuzz-lease-ids"
LEASE_HOOK_POLICY=fuzz-lease-ids
create_policy api-per-user '{"name":"api-per-user","algorithm":"token_bucket","capacity":1000000000,"refill_tokens":1000000000,"refill_period_ms":1000}'
create_policy llm-tokens '{"name":"llm-tokens","algorithm":"token_bucket","capacity":1000000000,"refill_tokens":1000000000,"refill_period_ms":60000}'
create_policy login-failures '{"name":"login-failures","algorithm":"fixed_window","limit":1000000000,"window_ms":900000}'
create_policy login '{"name":"login","algorithm":"fixed_window","limit":1000000000,"window_ms":60000}'
create_policy a '{"name":"a","algorithm":"gcra","rate":1000000000,"period_ms":1000,"burst":1000000000}'
create_policy A '{"name":"A","limits":[{"name":"burst","algorithm":"token_bucket","capacity":1000000000,"refill_tokens":1000,"refill_period_ms":1000},{"name":"daily","algorithm":"sliding_window_counter","limit":1000000000,"window_ms":86400000}]}'
create_policy 0 '{"name":"0","algorithm":"sliding_window_counter","limit":1000000000,"window_ms":1000,"mode":"shadow"}'
create_policy exports '{"name":"exports","algorithm":"concurrency","limit":10000,"lease_ms":600000,"max_lease_ms":86400000}'
create_policy fuzz-lease-ids '{"name":"fuzz-lease-ids","algorithm":"concurrency","limit":10000,"lease_ms":600000,"max_lease_ms":86400000}'

# --- Overrides, with real data ------------------------------------------------------------------
# "fuzz-plans" (FUZZ_OVERRIDE_POLICY) is a policy of two limits with tiers, and overrides of each
# kind (an exact key with a tier, a prefix with limits, a range unlimited, a key blocked until a
# time): the hooks send override cases that name no usable policy to it and give cases on one
# override real ids of it (see fuzz/schemathesis_hooks.py), so that reads, replacements,
# deletions and resolves meet real overrides, and the listing pages over more than one.
OVERRIDE_POLICY=fuzz-plans
# Its quotas are the largest there is, in every tier and override too, for the same reason as
# the other fixed policies': Schemathesis reuses the names it sees in answers, so decisions name
# it, and any cost the schema allows must fit whatever limits the subject is decided with.
create_policy fuzz-plans '{"name":"fuzz-plans","limits":[{"name":"burst","algorithm":"token_bucket","capacity":1000000000,"refill_tokens":1000,"refill_period_ms":1000},{"name":"daily","algorithm":"fixed_window","limit":1000000000,"window_ms":86400000}],"tiers":{"pro":{"burst":{"refill_tokens":10000}},"enterprise":{"burst":{"refill_tokens":100000},"daily":{"window_ms":3600000}}}}'
create_override() {
    local code
    code=$(curl -sS -o "$WORK/body" -w '%{http_code}' -H 'Content-Type: application/json' \
        -X POST "$BASE/v1/policies/$OVERRIDE_POLICY/overrides" -d "$1")
    if [[ $code != 201 ]]; then
        echo "schemathesis.sh: creating override $1 failed with $code: $(cat "$WORK/body")" >&2
        exit 2
    fi
}
tomorrow=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
create_override '{"match":{"key":"acme-corp"},"tier":"pro","reason":"enterprise plan"}'
create_override '{"match":{"prefix":"acme-"},"limits":{"daily":{"window_ms":60000}}}'
create_override '{"match":{"cidr":"203.0.113.0/24"},"unlimited":true}'
create_override "{\"match\":{\"key\":\"abuser\"},\"block\":true,\"expires_at\":\"$tomorrow\"}"

# --- Schemathesis ---------------------------------------------------------------------------
seed_args=()
if [[ $SEED != random ]]; then
    seed_args=(--seed "$SEED")
fi

# Run from target/schemathesis so its crash cache (.schemathesis/, for `st replay <id>`) and the
# JUnit report stay out of the work tree.
ST_DIR=target/schemathesis
mkdir -p "$ST_DIR"
ST="$PWD/$VENV/bin/st"
HOOKS="$PWD/fuzz/schemathesis_hooks.py"
CONFIG="$PWD/fuzz/schemathesis.toml"

echo "==> schemathesis: $BASE/openapi.json, checks $CHECKS, max $EXAMPLES examples"
set +e
(cd "$ST_DIR" && FUZZ_FIXED_POLICIES=$FIXED_POLICIES FUZZ_LEASE_POLICIES=$LEASE_POLICIES \
    FUZZ_LEASE_HOOK_POLICY=$LEASE_HOOK_POLICY FUZZ_OVERRIDE_POLICY=$OVERRIDE_POLICY \
    FUZZ_BASE_URL=$BASE FUZZ_TALLY="$WORK/tally" SCHEMATHESIS_HOOKS="$HOOKS" \
    "$ST" --config-file "$CONFIG" run "$BASE/openapi.json" \
    --checks "$CHECKS" \
    --max-examples "$EXAMPLES" \
    "${seed_args[@]}" \
    --request-timeout 10 \
    --generation-database none \
    --no-color \
    --report junit --report-dir report \
    </dev/null)
status=$?
set -e

if ! kill -0 "$RL_PID" 2>/dev/null; then
    echo "schemathesis.sh: ratelimiter died during the run:" >&2
    tail -n 50 "$LOG" >&2
    [[ $status -eq 0 ]] && status=1
fi

# The lease operations must have been exercised for real, not only with ids that name no lease:
# the service's own counters say whether leases were granted, renewed and released.
if [[ $status -eq 0 ]]; then
    curl -fsS --max-time 5 "$BASE/metrics" >"$WORK/metrics" || { echo "schemathesis.sh: GET /metrics failed" >&2; status=1; }
    for event in granted denied renewed released; do
        count=$(awk -v e="event=\"$event\"" '/^ratelimiter_leases_total\{/ && index($0, e) { n += $NF } END { print n + 0 }' "$WORK/metrics")
        echo "==> leases $event: $count"
        if [[ $count -eq 0 ]]; then
            echo "schemathesis.sh: no lease was $event during the run: the lease operations were not exercised" >&2
            status=1
        fi
    done
fi

# The override operations too: each answered 2xx at least once (FUZZ_TALLY, written by the
# hooks), so each met a policy and an override that exist; and the hooks' and the stateful
# phase's creations are there beside the four made above.
if [[ $status -eq 0 ]]; then
    for op in "GET /v1/policies/{name}/overrides" "POST /v1/policies/{name}/overrides" \
        "GET /v1/policies/{name}/overrides/{id}" "PUT /v1/policies/{name}/overrides/{id}" \
        "DELETE /v1/policies/{name}/overrides/{id}" "GET /v1/policies/{name}/resolve"; do
        ok=$(grep -cF "$op 2" "$WORK/tally" || true)
        echo "==> $op: $ok answered 2xx of $(grep -cF "$op " "$WORK/tally" || true)"
        if [[ $ok -eq 0 ]]; then
            echo "schemathesis.sh: $op never succeeded: it was not exercised with real data" >&2
            status=1
        fi
    done
    count=0
    cursor=
    while :; do
        curl -fsS --max-time 5 "$BASE/v1/policies/$OVERRIDE_POLICY/overrides?limit=1000${cursor:+&cursor=$cursor}" >"$WORK/page" ||
            { echo "schemathesis.sh: listing the overrides of $OVERRIDE_POLICY failed" >&2; status=1; break; }
        read -r n cursor < <(python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); print(len(p["overrides"]), p.get("next_cursor", ""))' "$WORK/page")
        count=$((count + n))
        [[ -z $cursor ]] && break
    done
    echo "==> overrides of $OVERRIDE_POLICY after the run: $count"
    if [[ $status -eq 0 && $count -le 4 ]]; then
        echo "schemathesis.sh: no override was created during the run: the override operations were not exercised" >&2
        status=1
    fi
fi

if [[ $status -ne 0 ]]; then
    echo "schemathesis.sh: FAILED (schemathesis exit $status); JUnit report in $ST_DIR/report; replay with: (cd $ST_DIR && $ST replay <id>)" >&2
else
    echo "schemathesis.sh: passed"
fi
exit "$status"
