#!/usr/bin/env bash
# Runs every example against a private ratelimiter (embedded store) on a free loopback port.
# Usage: bash examples/run.sh   (RATELIMITER_BIN overrides target/release/ratelimiter)
set -uo pipefail

cd "$(dirname "$0")/.."
BIN=${RATELIMITER_BIN:-target/release/ratelimiter}

die() { echo "examples/run.sh: $*" >&2; exit 1; }

[ -x "$BIN" ] || die "$BIN not found: build it with 'cargo build --release'"
command -v curl >/dev/null || die "curl not found: apt-get install -y curl"
command -v python3 >/dev/null || die "python3 not found: apt-get install -y python3"
command -v node >/dev/null || die "node not found: apt-get install -y nodejs (Node 20 or later)"
command -v java >/dev/null || die "java not found: apt-get install -y default-jdk-headless (Java 17 or later)"
node_version=$(node --version)
node_major=${node_version#v}
[ "${node_major%%.*}" -ge 20 ] 2>/dev/null || die "node $node_version is too old: install Node 20 or later"

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export RATELIMITER_URL="http://127.0.0.1:$PORT"
LOG=$(mktemp)

RATELIMITER__SERVER__BIND="127.0.0.1:$PORT" "$BIN" >"$LOG" 2>&1 &
SERVICE_PID=$!
stop_service() {
  kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
  rm -f "$LOG"
}
trap stop_service EXIT
trap 'exit 130' INT TERM

for _ in $(seq 100); do
  curl -sf --max-time 2 "$RATELIMITER_URL/readyz" >/dev/null && break
  kill -0 "$SERVICE_PID" 2>/dev/null || { cat "$LOG" >&2; die "the service exited at start-up"; }
  sleep 0.1
done
curl -sf --max-time 2 "$RATELIMITER_URL/readyz" >/dev/null || { cat "$LOG" >&2; die "the service is not ready after 10 s"; }
echo "ratelimiter ready at $RATELIMITER_URL"

passed=0
failed=()
run() {
  local name=$1; shift
  echo "--- $name"
  if timeout 60 "$@"; then
    passed=$((passed + 1))
  else
    echo "--- $name FAILED (exit code $?)" >&2
    failed+=("$name")
  fi
}

run curl.sh            bash examples/curl.sh
run python_client.py   python3 examples/python_client.py
run metered.py         python3 examples/metered.py
run leases.py          python3 examples/leases.py
run overrides.py       python3 examples/overrides.py
run calendar_quotas.py python3 examples/calendar_quotas.py
run reservations.py    python3 examples/reservations.py
run node_client.mjs    node examples/node_client.mjs
run JavaClient.java    java examples/JavaClient.java
run middleware_test.py python3 examples/middleware_test.py

echo "examples: $passed passed, ${#failed[@]} failed${failed[*]:+ (${failed[*]})}"
[ ${#failed[@]} -eq 0 ]
