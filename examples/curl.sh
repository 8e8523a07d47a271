#!/usr/bin/env bash
# Acquire from a token bucket until denied, wait Retry-After, acquire again, clean up.
# Needs bash, curl, grep, sed. Usage: RATELIMITER_URL=http://127.0.0.1:8080 bash examples/curl.sh
set -euo pipefail

RL=${RATELIMITER_URL:-http://127.0.0.1:8080}
POLICY="example-curl-$$-$RANDOM"
KEY="user-42"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "curl.sh: FAIL: $*" >&2; exit 1; }

# call METHOD PATH [BODY]: prints the status; headers in $tmp/h, body in $tmp/b.
call() {
  curl -sS -X "$1" "$RL$2" ${3:+-d "$3"} -D "$tmp/h" -o "$tmp/b" -w '%{http_code}' \
    || fail "no answer from $RL$2"
}
header() { grep -i "^$1:" "$tmp/h" | head -n1 | sed 's/^[^:]*: *//' | tr -d '\r'; }
field()  { sed -n "s/.*\"$1\":\([a-z0-9]*\).*/\1/p" "$tmp/b"; }

# 3 tokens, refilled at 1 per 3 seconds: the fourth request waits up to 3 s (slow enough that
# no token comes back between the first three, however loaded the machine).
status=$(call POST /v1/policies "{\"name\":\"$POLICY\",\"algorithm\":\"token_bucket\",\"capacity\":3,\"refill_tokens\":1,\"refill_period_ms\":3000}")
[ "$status" = 201 ] || fail "create policy: expected 201, got $status: $(cat "$tmp/b")"
echo "created policy $POLICY (token bucket, 3 tokens, 1 per 3 s)"

acquire() {
  status=$(call POST /v1/acquire "{\"policy\":\"$POLICY\",\"key\":\"$KEY\",\"cost\":1}")
  [ "$status" = 200 ] || fail "acquire: expected 200, got $status: $(cat "$tmp/b")"
  [ -n "$(header RateLimit)" ] || fail "acquire: no RateLimit header"
  [ -n "$(header RateLimit-Policy)" ] || fail "acquire: no RateLimit-Policy header"
  allowed=$(field allowed); remaining=$(field remaining); retry_after_ms=$(field retry_after_ms)
  [ -n "$allowed" ] && [ -n "$remaining" ] && [ -n "$retry_after_ms" ] || fail "acquire: unexpected body: $(cat "$tmp/b")"
}

expected=2
for i in 1 2 3 4 5; do
  acquire
  [ "$allowed" = true ] || break
  [ "$remaining" = "$expected" ] || fail "acquire $i: remaining $remaining, expected $expected"
  echo "acquire $i: allowed, remaining=$remaining, RateLimit: $(header RateLimit)"
  expected=$((expected - 1))
done
[ "$allowed" = false ] || fail "never denied after $i acquires"
[ "$expected" = -1 ] || fail "denied after $((i - 1)) grants, expected 3"
retry_after=$(header Retry-After)
[ -n "$retry_after" ] || fail "denial without a Retry-After header"
[ "$retry_after_ms" -gt 0 ] || fail "denial with retry_after_ms=$retry_after_ms"
echo "acquire $i: denied, retry_after_ms=$retry_after_ms, Retry-After: $retry_after, RateLimit-Policy: $(header RateLimit-Policy)"

wait_ms=$retry_after_ms
sleep "$(printf '%d.%03d' $((wait_ms / 1000)) $((wait_ms % 1000)))"
acquire
[ "$allowed" = true ] || fail "still denied after waiting $wait_ms ms: $(cat "$tmp/b")"
echo "after sleeping $wait_ms ms: allowed, remaining=$remaining"

status=$(call DELETE "/v1/policies/$POLICY")
[ "$status" = 204 ] || fail "delete policy: expected 204, got $status: $(cat "$tmp/b")"
echo "deleted policy $POLICY"
echo "curl.sh: OK"
