#!/usr/bin/env bash
# The monitoring bundle tested for real (issue 25): `promtool check rules` and `promtool test
# rules` on deploy/prometheus/, then deploy/prometheus/live_check.py, which starts a private
# redis-server, a small Redis Cluster, the service, and a real Prometheus scraping it under
# generated load (HTTP and gRPC, denials, leases, overrides, a fail-open period with Redis
# stopped and restarted, an instance stopped), and evaluates every dashboard query and every
# rule through Prometheus's HTTP API. Everything listens on 127.0.0.1 and is stopped at the end.
#
#   bash deploy/prometheus/check.sh   (RATELIMITER_BIN overrides target/release/ratelimiter;
#                                      LIVE_CHECK_KEEP=1 keeps the logs of a failed live run)
#
# promtool and prometheus come from Debian's `prometheus` package, installed here (loudly) when
# missing. The gRPC client is the virtualenv of tests/grpc_python/run.sh, target/grpc-python-venv,
# from the same pinned requirements, reused while they are unchanged.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
BIN=${RATELIMITER_BIN:-target/release/ratelimiter}
VENV=target/grpc-python-venv
REQUIREMENTS=tests/grpc_python/requirements.txt
RULES=deploy/prometheus/ratelimiter.rules.yml
RULE_TESTS=deploy/prometheus/ratelimiter.rules.test.yml
DASHBOARD=deploy/grafana/ratelimiter.json
PENDING=deploy/prometheus/pending-metrics.txt

die() { echo "deploy/prometheus/check.sh: $*" >&2; exit 1; }

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "==> promtool or prometheus is missing: INSTALLING Debian's prometheus package" >&2
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update ||
    die "apt-get update failed: install promtool and prometheus with 'apt-get install -y prometheus'"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus ||
    die "could not install Debian's prometheus package: 'apt-get install -y prometheus'"
  # The package's service is not wanted here (and does not start without systemd anyway).
fi
for tool in promtool prometheus redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: apt-get install -y prometheus redis-server python3"
done

echo "==> promtool check rules $RULES"
promtool check rules "$RULES"
echo "==> promtool test rules $RULE_TESTS"
promtool test rules "$RULE_TESTS"
# promtool tests only the alerts a test names: every alert of the rules must have one.
untested=()
for alert in $(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$RULES"); do
  grep -Eq "^ *alertname: *$alert *\$" "$RULE_TESTS" || untested+=("$alert")
done
[ ${#untested[@]} -eq 0 ] || die "alerts without a unit test in $RULE_TESTS: ${untested[*]}"

if [ ! -x "$BIN" ]; then
  echo "==> $BIN not found: building it (cargo build --release --locked)"
  cargo build --release --locked
fi

if ! cmp -s "$REQUIREMENTS" "$VENV/installed-requirements.txt"; then
  echo "==> installing the gRPC client ($REQUIREMENTS) into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" ||
    die "'python3 -m venv' failed: on Debian install its venv module with 'apt-get install -y python3-venv'"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$REQUIREMENTS" || die "pip could not install $REQUIREMENTS (is PyPI reachable?)"
  cp "$REQUIREMENTS" "$VENV/installed-requirements.txt"
fi
"$VENV/bin/python" -c 'import grpc, envoy_data_plane.envoy.service.ratelimit.v3' ||
  die "the gRPC client does not import: remove $VENV and run again"

echo "==> live check: the dashboard's queries and the rules against a real Prometheus"
# Bounded: a run takes about a minute; ten would mean something hangs (the check stops what it
# started when timeout sends it SIGTERM).
timeout 600 "$VENV/bin/python" deploy/prometheus/live_check.py --bin "$(readlink -f "$BIN")" --prometheus "$(command -v prometheus)" \
  --rules "$RULES" --dashboard "$DASHBOARD" --pending "$PENDING"
