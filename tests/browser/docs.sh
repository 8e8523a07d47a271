#!/usr/bin/env bash
# Browser check of the Swagger UI at /docs/: a real (headless) Chromium loads the page from the
# release binary, the rendered DOM must show the API's operations under their tags, a screenshot
# is taken, and we prove that nothing the page (or the browser) does leaves the loopback interface.
#
# Usage (from anywhere; CI calls it from the repository root):  bash tests/browser/docs.sh
# Needs: target/release/ratelimiter (built beforehand), python3, and Debian's `chromium`, which is
# installed with apt-get when missing (as root; otherwise the script fails and says so). No
# browser is ever downloaded from anywhere else.
#
# How "no request leaves loopback" is proven, in three independent layers:
#   1. Static: the served /docs/ page and /docs/swagger-initializer.js are fetched and searched for
#      absolute (http://, https:// or protocol-relative //) URLs pointing at any host other than
#      the loopback; there must be none (assets are vendored and referenced relatively, and the
#      spec is loaded from /openapi.json on the same origin).
#   2. Enforced: Chromium runs with --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", so
#      every host name except 127.0.0.1 resolves to "not found" inside the browser (no DNS query
#      is even made), plus --no-proxy-server so no proxy from the environment can resolve names
#      for it, plus --disable-quic.
#   3. Observed: each Chromium run writes a NetLog (--log-net-log), which records every URL
#      request, socket connect and UDP send. We assert that
#        - every TCP connection attempt went to a loopback address;
#        - no UDP datagram was sent to a non-loopback address (Chromium does a UDP connect() to a
#          public IPv6 address to probe IPv6 reachability; connect() on a datagram socket only
#          picks a route and sends nothing, so that is allowed, but a send is not);
#        - no request initiated by the page (initiator = our origin) targets another host;
#        - the page's own requests (/docs/..., /openapi.json) do appear, so the log is real.
#      Chromium itself still *tries* some background requests (update, account and autofill
#      services) despite --disable-background-networking etc.; those are listed as refused by the
#      resolver rule, and layer 3 shows none of them got a connection.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
ROOT=$(pwd)

PASSED=0
SERVICE_PID=""
WORK=""

cleanup() {
    local status=$?
    if [ -n "$SERVICE_PID" ] && kill -0 "$SERVICE_PID" 2>/dev/null; then
        kill "$SERVICE_PID" 2>/dev/null || true
        wait "$SERVICE_PID" 2>/dev/null || true
    fi
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        rm -rf "$WORK"
    fi
    if [ "$PASSED" -ne 1 ]; then
        echo "browser: 0 passed, 1 failed"
        [ "$status" -eq 0 ] && status=1
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    echo "browser: FAIL: $*" >&2
    exit 1
}

show_log() { # show_log TITLE FILE
    if [ -s "$2" ]; then
        echo "---- $1 ($2, last 40 lines) ----" >&2
        tail -n 40 "$2" >&2
        echo "---- end of $1 ----" >&2
    fi
}

command -v python3 >/dev/null 2>&1 || fail "python3 is needed (port picking, HTTP fetches, checks)"

# --- Chromium: Debian's package only --------------------------------------------------------
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        fail "chromium is not installed and this is not root: run 'apt-get update && apt-get install -y chromium' as root"
    fi
    echo "==> installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    # Try with the current package lists first; refresh them when that fails (none yet, or stale).
    if ! apt-get install -y chromium; then
        apt-get update || fail "apt-get update failed"
        apt-get install -y chromium || fail "apt-get install -y chromium failed"
    fi
    command -v chromium >/dev/null 2>&1 || fail "chromium still not found after apt-get install"
fi
CHROMIUM=$(command -v chromium)
echo "==> $("$CHROMIUM" --version 2>/dev/null || echo chromium)"

BIN="$ROOT/target/release/ratelimiter"
[ -x "$BIN" ] || fail "$BIN not found: build it first with 'cargo build --release'"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ratelimiter-browser.XXXXXX")

# --- the service on a free loopback port ----------------------------------------------------
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
BASE="http://127.0.0.1:$PORT"

# Drop any RATELIMITER__* settings from the caller's environment: the docs need only the
# defaults (embedded store, no auth), and this keeps the run independent of any Redis.
unset_args=()
while IFS= read -r name; do
    unset_args+=(-u "$name")
done < <(compgen -e | grep '^RATELIMITER__' || true)

echo "==> starting $BIN on 127.0.0.1:$PORT"
env "${unset_args[@]}" RATELIMITER__SERVER__BIND="127.0.0.1:$PORT" "$BIN" >"$WORK/service.log" 2>&1 &
SERVICE_PID=$!

# fetch URL [OUT]: GET over loopback with no proxy; prints the body (or writes it to OUT).
fetch() {
    python3 - "$@" <<'EOF'
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(sys.argv[1], timeout=5) as r:
    body = r.read()
if len(sys.argv) > 2:
    open(sys.argv[2], "wb").write(body)
else:
    sys.stdout.buffer.write(body)
EOF
}

ready=0
for _ in $(seq 1 150); do # up to ~30 s
    if ! kill -0 "$SERVICE_PID" 2>/dev/null; then
        show_log "service log" "$WORK/service.log"
        fail "the service exited before becoming ready"
    fi
    if fetch "$BASE/readyz" >/dev/null 2>&1; then
        ready=1
        break
    fi
    sleep 0.2
done
if [ "$ready" -ne 1 ]; then
    show_log "service log" "$WORK/service.log"
    fail "$BASE/readyz did not answer 200 within 30 s"
fi
echo "==> service ready"

# --- layer 1: no absolute URL to another host in the served page and initializer ------------
fetch "$BASE/docs/" "$WORK/index.html" || fail "GET /docs/ failed"
fetch "$BASE/docs/swagger-initializer.js" "$WORK/swagger-initializer.js" ||
    fail "GET /docs/swagger-initializer.js failed"
fetch "$BASE/openapi.json" "$WORK/openapi.json" || fail "GET /openapi.json failed"

python3 - "$WORK/index.html" "$WORK/swagger-initializer.js" <<'EOF' || fail "the served docs reference other hosts (see above)"
import re, sys
LOOPBACK = {"127.0.0.1", "localhost", "[::1]"}
bad = []
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8", errors="replace").read()
    # Absolute URLs, and protocol-relative ones in attributes or string literals ("//host/...").
    for m in re.finditer(r"""(?:\bhttps?:|(?<=["'(=]))//([^/\s"'<>)?#]+)""", text, re.I):
        host = m.group(1).rsplit("@", 1)[-1]
        host = host if host.startswith("[") else host.split(":")[0]
        if host.lower() not in LOOPBACK:
            bad.append(f"{path.rsplit('/', 1)[-1]}: {m.group(0)}")
for b in bad:
    print("  external reference:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
echo "==> static check: /docs/ and swagger-initializer.js reference no other host"

# --- Chromium runs --------------------------------------------------------------------------
# run_chromium NAME EXTRA-ARGS...: fresh profile, NetLog at $WORK/NAME.netlog.json,
# stderr at $WORK/NAME.chromium.log; stdout goes to the caller.
run_chromium() {
    local name=$1
    shift
    local profile
    profile=$(mktemp -d "$WORK/profile-$name.XXXXXX")
    timeout 120 "$CHROMIUM" \
        --headless --no-sandbox --disable-gpu --disable-background-networking \
        --disable-component-update --disable-sync --no-first-run --disable-quic \
        --user-data-dir="$profile" \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --no-proxy-server \
        --log-net-log="$WORK/$name.netlog.json" \
        --virtual-time-budget=10000 \
        "$@" 2>"$WORK/$name.chromium.log"
}

echo "==> chromium --dump-dom $BASE/docs/"
if ! run_chromium dom --dump-dom "$BASE/docs/" >"$WORK/dom.html"; then
    show_log "chromium (dump-dom) log" "$WORK/dom.chromium.log"
    fail "chromium --dump-dom failed"
fi

# The rendered DOM must hold, for every operation of the spec, an element with class opblock
# (Swagger UI's operation block) under the section of each of its tags, showing its path
# (span.opblock-summary-path[data-path]) and method (class opblock-<method>). On top of what the
# spec says, the operations and tags this test is about are required by name, so an empty or
# shrunken spec cannot make the test pass.
python3 - "$WORK/dom.html" "$WORK/openapi.json" <<'EOF' || { cp "$WORK/dom.html" "$ROOT/target/docs-dom.html" 2>/dev/null && echo "  (rendered DOM kept at target/docs-dom.html)" >&2; fail "the rendered Swagger UI does not show the expected operations"; }
import json, sys
from html.parser import HTMLParser

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tag = None      # current tag section (data-tag of the .opblock-tag heading)
        self.tags = []       # tag headings, in order
        self.ops = []        # dicts: tag, method, path, id
    def handle_starttag(self, name, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if "opblock-tag" in classes and a.get("data-tag"):
            self.tag = a["data-tag"]
            self.tags.append(self.tag)
        elif "opblock" in classes:
            method = next((c[len("opblock-"):] for c in classes if c.startswith("opblock-")), None)
            self.ops.append({"tag": self.tag, "method": method, "path": None, "id": a.get("id")})
        elif "opblock-summary-path" in classes and self.ops and self.ops[-1]["path"] is None:
            self.ops[-1]["path"] = a.get("data-path")

dom = Dom()
dom.feed(open(sys.argv[1], encoding="utf-8").read())
rendered = {(o["tag"], o["method"], o["path"]) for o in dom.ops}

spec = json.load(open(sys.argv[2]))
expected = set()
for path, item in spec.get("paths", {}).items():
    for method, op in item.items():
        if method in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
            for tag in op.get("tags") or ["default"]:
                expected.add((tag, method, path))
# Required whatever the spec says.
must_paths = {"/v1/acquire", "/v1/peek", "/v1/report", "/v1/refund", "/v1/reset",
              "/v1/policies", "/v1/policies/{name}",
              "/v1/leases", "/v1/leases/{id}/renew", "/v1/leases/{id}",
              "/v1/policies/{name}/overrides", "/v1/policies/{name}/overrides/{id}",
              "/v1/policies/{name}/resolve"}
must_tags = {"decisions", "policies", "leases", "overrides", "operations"}
# The lease and override operations, each under its tag, in the spec and on the page.
must_ops = {("leases", "post", "/v1/leases"), ("leases", "post", "/v1/leases/{id}/renew"),
            ("leases", "delete", "/v1/leases/{id}"),
            ("overrides", "get", "/v1/policies/{name}/overrides"),
            ("overrides", "post", "/v1/policies/{name}/overrides"),
            ("overrides", "get", "/v1/policies/{name}/overrides/{id}"),
            ("overrides", "put", "/v1/policies/{name}/overrides/{id}"),
            ("overrides", "delete", "/v1/policies/{name}/overrides/{id}"),
            ("overrides", "get", "/v1/policies/{name}/resolve")}

problems = []
if not dom.ops:
    problems.append("no element with class 'opblock' at all: Swagger UI did not render operations")
for p in sorted(must_paths - {o["path"] for o in dom.ops}):
    problems.append(f"no rendered operation for path {p}")
for t in sorted(must_tags - set(dom.tags)):
    problems.append(f"no rendered tag section {t!r}")
for p in sorted(must_paths - {path for _, _, path in expected}):
    problems.append(f"/openapi.json has no operation for {p}")
for t, m, p in sorted(must_ops - expected):
    problems.append(f"/openapi.json has no operation {m.upper()} {p} under tag {t!r}")
for t, m, p in sorted(must_ops - rendered):
    problems.append(f"operation {m.upper()} {p} is not rendered under tag {t!r}")
for t, m, p in sorted(expected - rendered):
    problems.append(f"spec operation {m.upper()} {p} (tag {t}) is not rendered under its tag")
for o in dom.ops:
    if not o["path"] or not o["method"] or not o["tag"]:
        problems.append(f"incomplete opblock in DOM: {o}")

for p in problems:
    print("  " + p, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"==> DOM check: {len(dom.ops)} opblock elements under tags {', '.join(dom.tags)}:")
for o in dom.ops:
    print(f"      [{o['tag']}] {o['method'].upper():6} {o['path']}")
EOF

SHOT="$ROOT/target/docs-screenshot.png"
mkdir -p "$ROOT/target"
rm -f "$SHOT"
echo "==> chromium --screenshot (1280x2000) -> target/docs-screenshot.png"
if ! run_chromium shot --screenshot="$SHOT" --window-size=1280,2000 "$BASE/docs/" >"$WORK/shot.stdout"; then
    show_log "chromium (screenshot) log" "$WORK/shot.chromium.log"
    fail "chromium --screenshot failed"
fi
python3 - "$SHOT" <<'EOF' || fail "the screenshot is missing or trivial"
import os, struct, sys
path = sys.argv[1]
if not os.path.isfile(path):
    sys.exit(print(f"  {path} was not written", file=sys.stderr) or 1)
data = open(path, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(print("  not a PNG file", file=sys.stderr) or 1)
w, h = struct.unpack(">II", data[16:24])
# A blank 1280x2000 page compresses to a few KB; the rendered UI is far larger.
if len(data) < 30_000 or (w, h) != (1280, 2000):
    sys.exit(print(f"  {len(data)} bytes, {w}x{h}: expected a 1280x2000 PNG of at least 30000 bytes", file=sys.stderr) or 1)
print(f"==> screenshot: {w}x{h} PNG, {len(data)} bytes")
EOF

# --- layer 3: the NetLogs of both runs --------------------------------------------------------
python3 - "$PORT" "$WORK/dom.netlog.json" "$WORK/shot.netlog.json" <<'EOF' || fail "network check failed (see above)"
import ipaddress, json, sys
from urllib.parse import urlsplit

port = sys.argv[1]
origin = f"http://127.0.0.1:{port}"

def load(path):
    text = open(path, encoding="utf-8").read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # A NetLog cut short (browser killed) lacks its closing brackets.
        return json.loads(text.rstrip().rstrip(",") + "]}")

def is_loopback_host(host):
    host = (host or "").strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

def addr_host(addr):  # "127.0.0.1:80" or "[::1]:443"
    return addr.rsplit(":", 1)[0]

problems, internal, own = [], set(), set()
for path in sys.argv[2:]:
    log = load(path)
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    udp_remote = {}  # source id -> connected address
    for e in log["events"]:
        kind = types.get(e["type"], "")
        p = e.get("params") or {}
        src = e.get("source", {}).get("id")
        if kind in ("TCP_CONNECT_ATTEMPT", "TCP_CONNECT"):
            addr = p.get("address") or p.get("remote_address")
            if addr and not is_loopback_host(addr_host(addr)):
                problems.append(f"{kind} to {addr}")
        elif kind == "UDP_CONNECT" and p.get("address"):
            udp_remote[src] = p["address"]
        elif kind in ("UDP_BYTES_SENT", "UDP_SEND_ERROR"):
            addr = p.get("address") or udp_remote.get(src, "?")
            if not is_loopback_host(addr_host(addr)):
                problems.append(f"{kind} to {addr}")
        elif kind == "URL_REQUEST_START_JOB" and p.get("url"):
            url, initiator = p["url"], p.get("initiator", "")
            host = urlsplit(url).hostname
            if url.startswith(origin + "/"):
                own.add(urlsplit(url).path)
            elif is_loopback_host(host) or url.startswith(("data:", "blob:", "chrome:", "about:")):
                pass
            elif initiator == origin:
                problems.append(f"the page requested {url}")
            else:
                internal.add(host)

for needed in ("/docs/", "/docs/swagger-ui-bundle.js", "/docs/swagger-initializer.js", "/openapi.json"):
    if needed not in own:
        problems.append(f"NetLog has no request for {needed}: the log is not trustworthy")
for p in problems:
    print("  " + p, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"==> network check: {len(own)} distinct paths requested, all from {origin}; "
      "every TCP connection was to loopback")
if internal:
    print("    browser-internal requests refused by the resolver rule (no connection made): "
          + ", ".join(sorted(internal)))
EOF

PASSED=1
echo "browser: 1 passed, 0 failed"
