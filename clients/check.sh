#!/usr/bin/env bash
# Generated clients, proved: a Python client (openapi-python-client) and a TypeScript client
# (openapi-typescript's types with the openapi-fetch runtime) generated from the committed
# openapi/openapi.json, each run through clients/{python,typescript}/scenario.* against the
# release binary on the embedded store: create a policy of several limits, acquire until denied,
# peek, refund with the ticket, replace and read it, take and release a lease of a concurrency
# policy, list, delete. Fails if either generator prints anything but its progress lines (a
# warning, a schema it could not parse, an endpoint left out), if the TypeScript scenario does
# not type-check against the generated types, or if a scenario step gets an unexpected answer.
#
#   bash clients/check.sh [BINARY]     (default: $RATELIMITER_BIN, else target/release/ratelimiter)
#
# Needs python3 with venv (Debian: apt-get install -y python3-venv), node 20 or later with npm
# (Debian: apt-get install -y nodejs npm) and curl. Installs openapi-python-client into
# target/clients-venv and the npm packages pinned in clients/typescript/package-lock.json.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

OPC_VERSION=0.29.1
DATEUTIL_VERSION=2.9.0.post0
VENV=target/clients-venv
BIN=${1:-${RATELIMITER_BIN:-target/release/ratelimiter}}
SPEC=$PWD/openapi/openapi.json

die() { echo "clients/check.sh: $*" >&2; exit 1; }

[[ -x $BIN ]] || die "$BIN not found: build it with 'cargo build --release', or pass a binary"
command -v curl >/dev/null || die "curl not found: apt-get install -y curl"
command -v python3 >/dev/null || die "python3 not found: apt-get install -y python3 python3-venv"
python3 -c 'import ensurepip' 2>/dev/null || die "python3 has no venv support: apt-get install -y python3-venv"
command -v node >/dev/null || die "node not found: apt-get install -y nodejs npm (Node 20 or later)"
command -v npm >/dev/null || die "npm not found: apt-get install -y npm"
node_version=$(node --version)
node_major=${node_version#v}
[[ ${node_major%%.*} -ge 20 ]] 2>/dev/null || die "node $node_version is too old: install Node 20 or later"

WORK=$(mktemp -d)
SERVICE_PID=
cleanup() {
    if [[ -n $SERVICE_PID ]]; then
        kill "$SERVICE_PID" 2>/dev/null && wait "$SERVICE_PID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Fails unless every line of generator output file $2 matches the progress pattern $3.
only_progress() {
    local generator=$1 log=$2 pattern=$3
    if grep -v -E "$pattern" "$log" | grep -q -v '^[[:space:]]*$'; then
        echo "clients/check.sh: $generator printed more than its progress (a warning, or a schema it could not parse):" >&2
        cat "$log" >&2
        exit 1
    fi
}

# --- Python: openapi-python-client, exactly pinned, in a virtualenv reused across runs -----
if [[ ! -x $VENV/bin/openapi-python-client ]] \
    || [[ "$("$VENV/bin/openapi-python-client" --version 2>/dev/null)" != *"$OPC_VERSION"* ]]; then
    echo "==> installing openapi-python-client==$OPC_VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "openapi-python-client==$OPC_VERSION" "python-dateutil==$DATEUTIL_VERSION"
fi
echo "==> generating the Python client ($("$VENV/bin/openapi-python-client" --version))"
# The generator formats its output with ruff, installed beside it: on PATH, or it warns.
PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/openapi-python-client" generate --path "$SPEC" \
    --output-path "$WORK/python/ratelimiter_client" --meta none >"$WORK/python-gen.log" 2>&1 \
    || { cat "$WORK/python-gen.log" >&2; die "openapi-python-client failed"; }
cat "$WORK/python-gen.log"
only_progress openapi-python-client "$WORK/python-gen.log" '^Generating '
for module in policies/create_policy policies/replace_policy policies/read_policy \
    policies/list_policies policies/delete_policy decisions/acquire decisions/peek \
    decisions/refund leases/take leases/release; do
    [[ -f $WORK/python/ratelimiter_client/api/$module.py ]] \
        || die "the Python client has no $module: the generator left an endpoint out"
done

# --- TypeScript: openapi-typescript types, openapi-fetch, tsc and tsx from package-lock.json --
echo "==> npm ci (clients/typescript)"
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
echo "==> generating the TypeScript types"
(cd clients/typescript && npx --no-install openapi-typescript "$SPEC" --output generated/schema.d.ts) \
    >"$WORK/ts-gen.log" 2>&1 || { cat "$WORK/ts-gen.log" >&2; die "openapi-typescript failed"; }
cat "$WORK/ts-gen.log"
only_progress openapi-typescript "$WORK/ts-gen.log" '^(✨ openapi-typescript [0-9.]+|🚀 .* → .*generated/schema\.d\.ts \[[0-9.]+m?s\])$'
echo "==> type-checking clients/typescript/scenario.ts against the generated types"
(cd clients/typescript && npx --no-install tsc -p .)

# --- The service: the release binary, embedded store, free loopback port, tokens set ---------
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
ADMIN_TOKEN=clients-check-admin
CLIENT_TOKEN=clients-check-client
RATELIMITER__SERVER__BIND="127.0.0.1:$PORT" \
    RATELIMITER__AUTH__ADMIN_TOKENS=$ADMIN_TOKEN \
    RATELIMITER__AUTH__CLIENT_TOKENS=$CLIENT_TOKEN \
    "$BIN" >"$WORK/service.log" 2>&1 &
SERVICE_PID=$!
for _ in $(seq 100); do
    curl -sf --max-time 2 "$URL/readyz" >/dev/null && break
    kill -0 "$SERVICE_PID" 2>/dev/null || { cat "$WORK/service.log" >&2; die "the service exited at start-up"; }
    sleep 0.1
done
curl -sf --max-time 2 "$URL/readyz" >/dev/null \
    || { cat "$WORK/service.log" >&2; die "the service is not ready after 10 s"; }
echo "==> ratelimiter ($BIN) ready at $URL"

passed=0
failed=()
run() {
    local name=$1
    shift
    echo "--- $name"
    if timeout 120 "$@"; then
        passed=$((passed + 1))
    else
        echo "--- $name FAILED (exit status $?)" >&2
        failed+=("$name")
    fi
}
run "python scenario" env PYTHONPATH="$WORK/python" "$VENV/bin/python" clients/python/scenario.py \
    "$URL" "$ADMIN_TOKEN" "$CLIENT_TOKEN"
run "typescript scenario" bash -c 'cd clients/typescript && exec npx --no-install tsx scenario.ts "$@"' \
    tsx "$URL" "$ADMIN_TOKEN" "$CLIENT_TOKEN"

echo "clients: $passed passed, ${#failed[@]} failed${failed[*]:+ (${failed[*]})}"
[[ ${#failed[@]} -eq 0 ]]
