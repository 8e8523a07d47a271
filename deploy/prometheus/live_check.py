"""The dashboard and the rules against a real Prometheus that scraped a real service.

Run by deploy/prometheus/check.sh (which checks the tools and builds the binary), with the
Python of the gRPC client's virtualenv (grpcio and envoy-data-plane; the rest is stdlib):

  python live_check.py --bin target/release/ratelimiter --prometheus prometheus \
      --rules deploy/prometheus/ratelimiter.rules.yml --dashboard deploy/grafana/ratelimiter.json \
      --pending deploy/prometheus/pending-metrics.txt

It starts, all on 127.0.0.1 and free ports: a private redis-server, a Redis Cluster of three
masters, two instances of the service on the Redis (job `ratelimiter`) and one on the Cluster
(job `ratelimiter-cluster`), and Prometheus scraping them every second with the rules loaded
and evaluated every second. It drives load over HTTP and gRPC (allowed, denied and near-limit
acquires; a policy of several limits with tiers and overrides; a shadow policy; leases; a
fail-open period with Redis stopped and restarted from its own snapshot; one instance stopped),
then asks Prometheus (/api/v1/query) for every dashboard target, with the template variables
substituted, and for every recording and alert rule, and fails naming each panel or rule whose
query errors or returns no series. An alert's expression returns series only while it fires, so
an alert is judged by the metrics it reads (each selector in it must return series) and by
Prometheus's own evaluation of it (health `ok`); the alerts the load must set off (fail-open,
degraded, store errors, breaker open, instance down) must have been pending or firing.

Metrics named in the pending file (one a line, `#` comments) are allowed to be missing: a query
whose only missing inputs are pending metrics is reported as waiting, not failed. A pending
metric that does exist fails the check, so that the file is emptied as the metrics land.
Everything it started is stopped at the end, failure or not.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitServiceSyncStub,
)

# The alerts the generated load must set off (pending or firing at some point of the run).
EXPECTED_ALERTS = [
    "RatelimiterFailOpen",
    "RatelimiterDegradedDecisions",
    "RatelimiterStoreErrors",
    "RatelimiterCircuitBreakerOpen",
    "RatelimiterInstanceDown",
]

# What the dashboard's variables stand for in the queries: every job and every policy (as
# Grafana's "All" with allValue ".*"), and a rate interval longer than the run, so that a counter
# that moved only during the outage still has a rate.
VARIABLES = {"$__rate_interval": "3m", "$__interval": "15s", "$__range": "3m", "$job": ".*", "$policy": ".*"}

PROCS = []  # (name, Popen) of everything started, stopped in reverse order
WORK = tempfile.mkdtemp(prefix="ratelimiter-live-check-")


def log(msg):
    print(f"live_check: {msg}", flush=True)


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 6379:
            return port


def free_cluster_port():
    """A free port whose cluster bus port (10,000 above it) is free too, as Redis Cluster needs."""
    while True:
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def start(name, argv, env=None):
    out = open(os.path.join(WORK, f"{name}.log"), "wb")
    # No stdin: a child that reads the terminal would stop the whole run when it is in the
    # background (SIGTTIN).
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=WORK)
    PROCS.append((name, proc))
    return proc


def stop(proc, sig=signal.SIGTERM, timeout=15):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all():
    for _, proc in reversed(PROCS):
        stop(proc)


def tail(name, lines=30):
    try:
        with open(os.path.join(WORK, f"{name}.log"), errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_for(what, check, proc=None, name=None, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"live_check: {what}: the process exited ({proc.returncode}):\n{tail(name)}")
        time.sleep(0.1)
    raise SystemExit(f"live_check: {what} after {timeout:.0f} s" + (f":\n{tail(name)}" if name else ""))


def http(method, url, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        # No answer (a connection closed under load, a timeout): counted by the load's summary;
        # what this check judges is what Prometheus saw, not each request.
        return 0, {"decided_by": f"no answer ({getattr(e, 'reason', e)})"}
    return status, json.loads(raw) if raw else None


def redis_cli(port, *args):
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=10
    ).stdout.strip()


# --- The parts ------------------------------------------------------------------------------


def start_redis(name, port, *extra):
    os.makedirs(os.path.join(WORK, name), exist_ok=True)
    proc = start(
        name,
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", os.path.join(WORK, name), "--dbfilename", "dump.rdb", *extra],
    )
    wait_for(f"redis-server {name} on {port} is not answering", lambda: redis_cli(port, "ping") == "PONG", proc, name)
    return proc


def start_cluster():
    ports = []
    while len(ports) < 3:
        port = free_cluster_port()
        if port not in ports:
            ports.append(port)
    for i, port in enumerate(ports):
        start_redis(f"cluster-{i}", port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000")
    made = subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0",
         "--cluster-yes"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        raise SystemExit(f"live_check: redis-cli --cluster create failed:\n{made.stdout}{made.stderr}")
    wait_for("the Redis Cluster is not ok", lambda: "cluster_state:ok" in redis_cli(ports[0], "cluster", "info"))
    return ports


class Instance:
    def __init__(self, name, binary, store_env):
        self.name = name
        self.http_port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RATELIMITER__")}
        env.update(store_env)
        env.update({
            "RATELIMITER__SERVER__BIND": f"127.0.0.1:{self.http_port}",
            "RATELIMITER__GRPC__BIND": self.grpc,
            "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
        })
        self.proc = start(name, [binary], env)
        wait_for(f"{name} is not ready", lambda: http("GET", self.url + "/readyz")[0] == 200, self.proc, name, 30)
        self.target = f"127.0.0.1:{self.http_port}"


def start_prometheus(binary, rules, targets):
    port = free_port()
    config = os.path.join(WORK, "prometheus.yml")
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: [{', '.join(repr(t) for t in ts)}]\n"
        for job, ts in targets.items())
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {json.dumps(os.path.abspath(rules))}\nscrape_configs:\n{jobs}")
    proc = start("prometheus", [
        binary, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(WORK, 'tsdb')}",
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"])
    base = f"http://127.0.0.1:{port}"
    wait_for("Prometheus is not ready", lambda: urllib.request.urlopen(base + "/-/ready", timeout=2).status == 200,
             proc, "prometheus", 30)
    return base


# --- The load -------------------------------------------------------------------------------

POLICIES = [
    # Denied quickly, near-limit on the way (fixed window of 5 a minute).
    {"name": "login", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000},
    # Sustained traffic with some denials; decided locally while Redis is away.
    {"name": "search", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 20, "refill_period_ms": 1000,
     "fail_mode": "local"},
    # Several limits, tiers and overrides.
    {"name": "api",
     "limits": [{"name": "minute", "algorithm": "gcra", "rate": 30, "period_ms": 60000, "burst": 10},
                {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}],
     "tiers": {"pro": {"minute": {"rate": 600, "burst": 100}},
               "enterprise": {"minute": {"rate": 6000, "burst": 1000}, "daily": {"limit": 5000000}}}},
    # Shadow mode: allowed, would-be denials counted.
    {"name": "shadowed", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "mode": "shadow"},
    # Leases.
    {"name": "exports", "algorithm": "concurrency", "limit": 3, "lease_ms": 60000},
    # Served over gRPC (Envoy's protocol), per remote address.
    {"name": "edge", "algorithm": "sliding_window_counter", "limit": 10, "window_ms": 60000,
     "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}},
]

OVERRIDES = [
    {"match": {"key": "acme"}, "tier": "enterprise", "reason": "live check"},
    {"match": {"prefix": "partner-"}, "limits": {"daily": {"limit": 1000000}}},
    {"match": {"key": "abuser"}, "block": True},
    {"match": {"key": "healthcheck"}, "unlimited": True},
]


def setup_policies(url):
    for doc in POLICIES:
        status, body = http("POST", url + "/v1/policies", doc)
        if status != 201:
            raise SystemExit(f"live_check: creating policy {doc['name']}: {status} {body}")
    for doc in OVERRIDES:
        status, body = http("POST", url + "/v1/policies/api/overrides", doc)
        if status != 201:
            raise SystemExit(f"live_check: creating override {doc}: {status} {body}")


def grpc_calls(target, count, key_base):
    channel = grpc.insecure_channel(target)
    stub = RateLimitServiceSyncStub(channel)
    codes = {}
    for i in range(count):
        req = RateLimitRequest(domain="edge", descriptors=[
            RateLimitDescriptor(entries=[RateLimitDescriptorEntry(key="remote_address", value=f"{key_base}-{i % 3}")]),
            RateLimitDescriptor(entries=[RateLimitDescriptorEntry(key="unmatched", value="x")]),
        ])
        try:
            code = str(stub.should_rate_limit(req).overall_code)
        except grpc.RpcError as e:  # an answer too (unavailable while Redis is away, etc.)
            code = str(e.code())
        codes[f"grpc {code}"] = codes.get(f"grpc {code}", 0) + 1
    channel.close()
    return codes


def one_round(url, round_no):
    """A round of HTTP decisions of every kind; returns the answers' decided_by counts."""
    seen = {}

    def acquire(policy, key, cost=1):
        status, body = http("POST", url + "/v1/acquire", {"policy": policy, "key": key, "cost": cost})
        by = body.get("decided_by", f"status {status}") if isinstance(body, dict) else f"status {status}"
        seen[by] = seen.get(by, 0) + 1

    for i in range(3):
        acquire("login", f"user-{i}")  # 5 a minute each: near-limit, then denied
    for i in range(8):
        acquire("search", f"s-{i % 2}", cost=3)
    for key in ("alice", "bob", "acme", "partner-1", "abuser", "healthcheck"):
        acquire("api", key)
    acquire("shadowed", "someone")
    status, body = http("POST", url + "/v1/leases", {"policy": "exports", "key": "tenant", "lease_ms": 60000})
    if status == 201 and round_no % 2 and body.get("lease"):
        http("DELETE", f"{url}/v1/leases/{body['lease']}")
    http("POST", url + "/v1/peek", {"policy": "api", "key": "alice"})
    return seen


def drive(instances, seconds, label):
    """Rounds on every instance, several at once (so that Redis batches form), for `seconds`."""
    end = time.monotonic() + seconds
    totals = {}
    rounds = 0
    with ThreadPoolExecutor(max_workers=4) as pool:
        while time.monotonic() < end:
            futures = [pool.submit(one_round, inst.url, rounds + j) for inst in instances for j in range(3)]
            futures += [pool.submit(grpc_calls, inst.grpc, 5, f"10.0.{rounds % 5}") for inst in instances]
            for f in futures:
                for k, v in f.result().items():
                    totals[k] = totals.get(k, 0) + v
            rounds += 1
    log(f"{label}: {rounds} rounds, answers {dict(sorted(totals.items()))}")


# --- The evaluation -------------------------------------------------------------------------

METRIC = re.compile(r"\b((?:ratelimiter[_:]|up\b)[A-Za-z0-9_:]*)(\{[^{}]*\})?")


def query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    return body["data"]["result"], None


def names_in(expr):
    return {m.group(1) for m in METRIC.finditer(expr) if m.group(1) != "up" or m.group(0).startswith("up")}


def base_name(name):
    return re.sub(r"_(bucket|sum|count)$", "", name)


def substitute(expr):
    for var in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(var, VARIABLES[var])
    return expr


class Report:
    def __init__(self, prom, pending):
        self.prom, self.pending = prom, pending
        self.failures, self.waiting, self.checked = [], {}, 0
        self.derived = {}  # recording rule -> the pending metrics it waits for

    def judge(self, what, expr, need_series=True, record=None):
        """Evaluates `expr`; a failure unless it answers with series (or only pending inputs are missing)."""
        self.checked += 1
        result, error = query(self.prom, expr)
        if error:
            self.failures.append(f"{what}: the query fails: {error}\n    {expr}")
            return
        if result or not need_series:
            return
        missing = sorted({n for n in names_in(expr) if not query(self.prom, f"count({n})")[0]})
        unexplained = [n for n in missing if base_name(n) not in self.pending | set(self.derived)]
        if missing and not unexplained:
            for n in missing:
                for root in self.derived.get(n, [base_name(n)]):
                    self.waiting.setdefault(root, []).append(what)
            if record:
                # A recording rule that waits for pending metrics: so do the rules that read it.
                self.derived[record] = sorted({r for n in missing for r in self.derived.get(n, [base_name(n)])})
        else:
            self.failures.append(
                f"{what}: no series" + (f" (missing: {', '.join(unexplained)})" if unexplained else "")
                + f"\n    {expr}")


def evaluate(prom, dashboard_path, pending, started_at):
    report = Report(prom, pending)
    dashboard = json.load(open(dashboard_path))

    # The template variables' queries (label_values(selector, label)).
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
        if not m:
            report.failures.append(f"variable {var['name']}: not a label_values(selector, label) query: {q}")
            continue
        selector, label = substitute(m.group(1)), m.group(2)
        url = f"{prom}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
        values = json.load(urllib.request.urlopen(url, timeout=10))["data"]
        report.checked += 1
        if not values:
            report.failures.append(f"variable {var['name']}: {q} has no values")
        else:
            log(f"variable {var['name']}: {', '.join(values)}")

    # Every target of every panel.
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        report.failures.append(f"dashboard: panel ids are not unique: {ids}")
    for panel in panels:
        for target in panel["targets"]:
            unknown = set(re.findall(r"\$\w+", target["expr"])) - set(VARIABLES)
            if unknown:
                report.failures.append(f"panel \"{panel['title']}\" target {target['refId']}: "
                                       f"unknown variables {sorted(unknown)}")
            if target.get("datasource", {}).get("uid") != "${datasource}":
                report.failures.append(f"panel \"{panel['title']}\" target {target['refId']}: "
                                       "its datasource is not the ${datasource} variable")
            report.judge(f"panel \"{panel['title']}\" target {target['refId']}", substitute(target["expr"]))

    # Every rule, as Prometheus loaded and evaluated it.
    groups = json.load(urllib.request.urlopen(prom + "/api/v1/rules", timeout=10))["data"]["groups"]
    # Recording rules first: an alert reading one that waits for pending metrics waits too.
    rules = sorted((r for g in groups for r in g["rules"]), key=lambda r: r["type"] != "recording")
    if True:
        for rule in rules:
            name = rule["name"]
            what = f"{'alert' if rule['type'] == 'alerting' else 'recording rule'} {name}"
            if rule.get("health") != "ok":
                report.failures.append(f"{what}: Prometheus evaluates it with health {rule.get('health')}: "
                                       f"{rule.get('lastError')}")
            if rule["type"] == "alerting":
                notes = rule.get("annotations", {})
                absent = [k for k in ("summary", "description", "runbook") if not notes.get(k)]
                parts = [p for p in ("What it means", "What to check", "What to do")
                         if p not in notes.get("runbook", "")]
                if absent or parts:
                    report.failures.append(f"{what}: annotations missing: {', '.join(absent + parts)}")
            if rule["type"] == "recording":
                report.judge(what, rule["query"], record=name)
            else:
                report.judge(what, rule["query"], need_series=False)
                for m in METRIC.finditer(rule["query"]):
                    report.judge(f"{what}: its input {m.group(0)}", m.group(0))

    # Scrapes that failed during the run (the machine too busy to answer in 1 s, say).
    failed_scrapes, _ = query(prom, f"count_over_time((up == 0)[{int(time.time() - started_at) + 5}s:1s])")
    for s in failed_scrapes or []:
        log(f"scrapes that failed: {s['metric'].get('job')} {s['metric'].get('instance')}: {s['value'][1]}")

    # The alerts the load set off.
    window = f"{int(time.time() - started_at) + 5}s"
    seen, _ = query(prom, f"max_over_time(ALERTS[{window}])")
    active = sorted({(s["metric"]["alertname"], s["metric"]["alertstate"]) for s in seen or []})
    log("alerts pending or firing during the run: " + (", ".join(f"{a} ({s})" for a, s in active) or "none"))
    for alert in EXPECTED_ALERTS:
        if not any(a == alert for a, _ in active):
            report.failures.append(f"alert {alert}: never pending or firing, though the load should set it off")

    # The pending list is honest: a metric in it that exists must leave it.
    for name in sorted(pending):
        found, _ = query(prom, f'count({{__name__=~"{name}(_bucket|_sum|_count)?"}})')
        if found:
            report.failures.append(f"{name} exists now: remove it from the pending-metrics file, "
                                   "which re-arms the check for the panels and rules that read it")
    return report, len(panels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--prometheus", default="prometheus")
    parser.add_argument("--rules", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--pending", required=True)
    args = parser.parse_args()
    pending = set()
    if os.path.exists(args.pending):
        pending = {line.split("#")[0].strip() for line in open(args.pending)} - {""}

    started_at = time.time()
    redis_port = free_port()
    redis = start_redis("redis", redis_port)
    cluster = start_cluster()
    redis_env = {"RATELIMITER__REDIS__URL": f"redis://127.0.0.1:{redis_port}"}
    a = Instance("ratelimiter-a", args.bin, redis_env)
    b = Instance("ratelimiter-b", args.bin, redis_env)
    c = Instance("ratelimiter-cluster", args.bin,
                 {"RATELIMITER__REDIS__CLUSTER_NODES": ",".join(f"127.0.0.1:{p}" for p in cluster)})
    prom = start_prometheus(args.prometheus, args.rules,
                            {"ratelimiter": [a.target, b.target], "ratelimiter-cluster": [c.target]})
    prom_started = time.monotonic()
    log(f"Prometheus {prom}; service {a.url} and {b.url} on Redis :{redis_port}, {c.url} on the Cluster")

    setup_policies(a.url)
    setup_policies(c.url)
    wait_for("instance b does not see the policies",
             lambda: http("POST", b.url + "/v1/peek", {"policy": "api", "key": "x"})[0] == 200)
    drive([a, b, c], 12, "normal load")

    log("stopping instance b (an instance down)")
    stop(b.proc)

    log("stopping Redis (fail-open period; its snapshot is kept for the restart)")
    redis_cli(redis_port, "save")
    stop(redis)
    drive([a, c], 8, "Redis stopped")

    log("restarting Redis from its snapshot")
    start_redis("redis", redis_port)
    wait_for("instance a is not ready again after Redis came back",
             lambda: http("GET", a.url + "/readyz")[0] == 200, timeout=20)
    # Until Prometheus has 45 s of samples: the peers' comparison of the policy cache looks at
    # versions more than 30 s old.
    drive([a, c], max(10.0, 45.0 - (time.monotonic() - prom_started)), "Redis back")
    # The last scrapes and rule evaluations: each instance still running answered its latest
    # scrape (on a busy machine a scrape can miss its 1 s timeout, and a stale series answers
    # nothing).
    time.sleep(2)
    for inst in (a, c):
        wait_for(f"Prometheus cannot scrape {inst.name}",
                 lambda: query(prom, f'up{{instance="{inst.target}"}} == 1')[0], timeout=30)

    report, panels = evaluate(prom, args.dashboard, pending, started_at)
    for name, whats in sorted(report.waiting.items()):
        log(f"waiting for {name} (pending-metrics file): " + "; ".join(sorted(set(whats))))
    log(f"{report.checked} queries: {panels} panels, every rule and its inputs; "
        f"{len(report.failures)} failed, {sum(len(set(w)) for w in report.waiting.values())} waiting for pending metrics")
    for failure in report.failures:
        print(f"FAILED {failure}", flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    code = 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        code = main()
    finally:
        stop_all()
        if code == 0 or not os.environ.get("LIVE_CHECK_KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
        else:
            log(f"logs kept in {WORK}")
    sys.exit(code)
