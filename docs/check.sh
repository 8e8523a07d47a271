#!/usr/bin/env bash
# The docs test, as CI runs it: the checker's own tests, then every runnable example of
# README.md, CHANGELOG.md and docs/ against the given release binary, and every link.
#   docs/check.sh target/release/ratelimiter
# Needs python3 (3.11), bash, curl, jq and redis-server (Debian: apt-get install -y curl jq redis-server).
set -euo pipefail
binary=${1:?usage: docs/check.sh PATH-TO-RELEASE-BINARY}
cd "$(dirname "$0")/.."
for tool in python3 curl jq redis-server; do
  command -v "$tool" >/dev/null || { echo "docs/check.sh: $tool is not on PATH (Debian: apt-get install -y $tool)" >&2; exit 1; }
done
RATELIMITER_BINARY="$binary" python3 -m unittest docs/check_test.py
python3 docs/check.py --binary "$binary" --redis-server "$(command -v redis-server)"
