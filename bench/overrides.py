#!/usr/bin/env python3
"""Per-customer overrides at issue 24's scale, measured from outside.

    python3 bench/overrides.py            # 100,000 exact + 500 prefix + 500 cidr (about 5 minutes)
    python3 bench/overrides.py --quick    # 2,000 exact + 50 + 50, short rounds (CI's smoke, < 1 min)

It starts two private redis-servers on free loopback ports and the release binary on them (built
first unless --no-build). On the first it creates two token-bucket policies, `bench-ovr` and
`bench-plain`, and gives `bench-ovr` the overrides through the API (each a `limits` override of
the policy's capacity: a decision of an overridden subject still goes to Redis, as the policy's
own do); the second holds the same two policies and no override. It measures:

- the bulk writes: POST /v1/policies/bench-ovr/overrides over --threads keep-alive connections;
- a new instance: launch to /readyz 200, and to `resolve` of an overridden key showing its
  override; and its resident memory (VmRSS) then, on the first Redis (the overrides) against
  the second (none), --ready-runs times, alternately;
- propagation: an override created through instance A, polled on three other instances through
  `GET /v1/policies/bench-ovr/resolve` until it shows: one with the defaults (the change log
  every `redis.policy_refresh_ms` = 250 ms, and the announcement on the denial cache's channel),
  one without the denial cache (the log alone), one that reads the log only every minute (the
  announcement alone); --propagation-runs times, median and max;
- acquires per second on one instance, with wrk at --connections: `bench-plain` (no override at
  all) beside `bench-ovr` for keys without an override (the common case) and keys with one,
  --rounds interleaved rounds (the order rotated each round, so that the machine's noise falls
  on all three alike), each ratio against `bench-plain`;
- the index lookup alone: `cargo bench --bench overrides` (criterion, 100,000 exact keys, 1,000
  prefixes and 1,000 ranges), read from target/criterion (skipped with --no-cargo-bench, and by
  --quick).

Everything listens on 127.0.0.1 and is stopped at the end. Prints a table and writes the results
as JSON under bench/results/ (overrides-<time>.json), with the machine's load average, since
other work on the same cores moves every figure.
"""

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the load benchmark's helpers: processes, ports, Redis, HTTP, wrk)

OVR, PLAIN = "bench-ovr", "bench-plain"
# The policies' own limit (it admits nearly everything, so the allowed path, the one that writes,
# is measured), and the capacity an override gives its subjects instead.
POLICY = {"algorithm": "token_bucket", **run.POLICIES["token_bucket"]}
OVERRIDE_LIMITS = {"limits": {OVR: {"capacity": 900_000_000}}}
# Subjects: c<i> have an exact override, k<i> have none (neither matches a prefix or a range).
SPREAD = 100_000
# The instances' logs, removed at the end (kept only to say why an instance exited early).
LOGS = []


def exact_match(i):
    return {"key": f"c{i}"}


def prefix_match(i):
    return {"prefix": f"tenant-{i}-"}


def cidr_match(i):
    return {"cidr": f"10.{i // 256}.{i % 256}.0/24"}


def load_average():
    with open("/proc/loadavg") as f:
        one, five, fifteen = f.read().split()[:3]
    return {"1m": float(one), "5m": float(five), "15m": float(fifteen), "cores": os.cpu_count()}


def start_instance(procs, binary, redis_port, extra=None):
    """Launches the service; answers (base URL, child, seconds from launch to /readyz 200)."""
    port = run.free_port()
    env = dict(os.environ, RUST_LOG="warn", RATELIMITER__SERVER__BIND=f"127.0.0.1:{port}",
               RATELIMITER__REDIS__URL=f"redis://127.0.0.1:{redis_port}", **(extra or {}))
    env.pop("RATELIMITER_CONFIG", None)
    log = tempfile.NamedTemporaryFile(prefix="ratelimiter-bench-overrides-", suffix=".log", delete=False)
    LOGS.append(log.name)
    started = time.monotonic()
    # Its log kept (warnings only), so that an instance that exits early says why.
    child = run.subprocess.Popen([binary], env=env, stdout=run.subprocess.DEVNULL, stderr=log)
    procs.children.append(child)
    base = f"http://127.0.0.1:{port}"
    deadline = started + 120
    while True:
        try:
            if run.http("GET", base + "/readyz")[0] == 200:
                break
        except OSError:
            pass
        if child.poll() is not None:
            log.flush()
            with open(log.name, errors="replace") as f:
                tail = f.read()[-2000:]
            run.fail(f"the service exited with {child.returncode} before it was ready:\n{tail}")
        if time.monotonic() > deadline:
            run.fail("the service was not ready within 120 s")
        time.sleep(0.005)
    return base, child, time.monotonic() - started


def stop(child):
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=15)
    except run.subprocess.TimeoutExpired:
        child.kill()


def resolve(base, key, conn=None):
    """`resolve` of `key` on bench-ovr: (status, decided_by or None)."""
    if conn is None:
        status, body = run.http("GET", f"{base}/v1/policies/{OVR}/resolve?key={key}")
    else:
        conn.request("GET", f"/v1/policies/{OVR}/resolve?key={key}")
        r = conn.getresponse()
        status, body = r.status, r.read()
    if status != 200:
        return status, None
    return status, json.loads(body).get("decided_by")


def create_policies(base):
    for name in (OVR, PLAIN):
        status, body = run.http("PUT", f"{base}/v1/policies/{name}", POLICY)
        if status not in (200, 201):
            run.fail(f"creating {name}: {status} {body!r}")


def write_overrides(base, matches, threads):
    """POSTs one `limits` override per match over `threads` keep-alive connections; answers the
    seconds it took and how many writes were sent again because the store did not answer within
    its deadline (503, outcome unknown: a 409 for the same match afterwards means the first one
    took effect)."""
    host, port = base.removeprefix("http://").split(":")

    def write(chunk):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        again = 0
        for m in chunk:
            body = json.dumps({"match": m, **OVERRIDE_LIMITS})
            for attempt in range(10):
                conn.request("POST", f"/v1/policies/{OVR}/overrides", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                answer = r.read()
                if r.status == 201 or (r.status == 409 and attempt > 0 and b"override-conflict" in answer):
                    break
                if r.status != 503:
                    run.fail(f"creating the override of {m}: HTTP {r.status} {answer[:300]!r}")
                again += 1
                time.sleep(0.05)
            else:
                run.fail(f"creating the override of {m}: 503 ten times: {answer[:300]!r}")
        conn.close()
        return again

    started = time.monotonic()
    chunks = [matches[t::threads] for t in range(threads)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        again = sum(pool.map(write, chunks))
    return time.monotonic() - started, again


def commandstats(port):
    """Calls of each Redis command so far."""
    out = {}
    for line in run.redis_cli(port, "INFO", "commandstats").splitlines():
        name, _, stats = line.partition(":")
        if name.startswith("cmdstat_"):
            out[name.removeprefix("cmdstat_")] = int(stats.split("calls=")[1].split(",")[0])
    return out


def new_instance(procs, binary, redis_port, extra, key, overridden):
    """A fresh instance: seconds to /readyz, seconds until `resolve` of `key` answers as expected
    (its override when `overridden`, the policy otherwise), and its VmRSS (MiB) a second later."""
    base, child, ready_s = start_instance(procs, binary, redis_port, extra)
    started = time.monotonic() - ready_s
    while True:
        status, by = resolve(base, key)
        if status == 200 and (by != "policy") == overridden:
            break
        if time.monotonic() - started > 120:
            run.fail(f"resolve of {key} on a new instance: {status} {by} after 120 s")
        time.sleep(0.005)
    loaded_s = time.monotonic() - started
    time.sleep(1)
    rss = run.rss_mib(child.pid)
    stop(child)
    return {"ready_s": ready_s, "loaded_s": loaded_s, "rss_mib": rss}


def propagation(a, followers, runs, stamp):
    """Creates `runs` overrides through A, one at a time; for each, how long (ms) from sending the
    write until each follower's `resolve` shows it."""
    conns = {name: http.client.HTTPConnection(*base.removeprefix("http://").split(":"), timeout=10)
             for name, base in followers.items()}
    seen = {name: [] for name in followers}
    write_ms = []
    for i in range(runs):
        key = f"prop-{stamp}-{i}"
        started = time.monotonic()
        status, body = run.http("POST", f"{a}/v1/policies/{OVR}/overrides", {"match": {"key": key}, **OVERRIDE_LIMITS})
        write_ms.append((time.monotonic() - started) * 1000)
        if status != 201:
            run.fail(f"creating the override of {key}: HTTP {status} {body[:300]!r}")
        waiting = set(followers)
        while waiting:
            for name in list(waiting):
                _, by = resolve(None, key, conns[name])
                if by not in (None, "policy"):
                    seen[name].append((time.monotonic() - started) * 1000)
                    waiting.discard(name)
            if time.monotonic() - started > 70:
                run.fail(f"{key} not in force on {sorted(waiting)} after 70 s")
            time.sleep(0.001)
        # Away from the previous write's refresh, at a random phase of the followers' log polls
        # (a fixed step would sample a few phases only).
        time.sleep(random.uniform(0.1, 0.35))
    for c in conns.values():
        c.close()

    def summary(xs):
        xs = sorted(xs)
        return {"median_ms": round(statistics.median(xs), 1), "max_ms": round(xs[-1], 1),
                "min_ms": round(xs[0], 1), "runs": [round(x, 1) for x in xs]}

    return {"write_on_a": summary(write_ms), **{name: summary(v) for name, v in seen.items()}}


def acquire_rounds(base, pid, redis_port, connections, duration, rounds):
    """Interleaved wrk runs of the three cells; answers each cell's runs, each with the CPU time
    per acquire of the service (`pid`) and of Redis, and Redis's script calls per acquire (how
    well decisions share a batch)."""
    script = os.path.join(run.BENCH, "wrk_keys.lua")
    cells = {
        "plain": (PLAIN, "k"),
        "ovr_without": (OVR, "k"),
        "ovr_with": (OVR, "c"),
    }
    names = list(cells)
    for name in names:  # warm-up: the subjects' state exists, the connections are open
        policy, prefix = cells[name]
        run.wrk(base + "/v1/acquire", connections, 1, script, [policy, prefix, SPREAD])
    results = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            policy, prefix = cells[name]
            calls = run.script_calls(redis_port)
            w = run.with_cpu(lambda: run.wrk(base + "/v1/acquire", connections, duration, script,
                                             [policy, prefix, SPREAD]), pid, redis_port)
            w["script_calls_per_acquire"] = (run.script_calls(redis_port) - calls) / max(1, w["requests"])
            if w["errors"]:
                run.fail(f"{name}: {w['errors']} errors or non-2xx answers")
            results[name].append(w)
    return results


def symbol_shares(data):
    """Each symbol's share (%) of a perf recording's samples, self time."""
    out = run.subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "sym"],
                             capture_output=True, text=True).stdout
    shares = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].endswith("%"):
            try:
                shares[parts[1].strip()] = shares.get(parts[1].strip(), 0.0) + float(parts[0].rstrip("%"))
            except ValueError:
                pass
    return shares


def profile_cells(base, pid, redis_port, connections, seconds, path):
    """perf profiles of the service (`pid`) during a run of each cell, twice in turn; writes to
    `path` the symbols whose share of the samples differs most between keys with an override and
    the policy without any, with the keys without an override beside them."""
    script = os.path.join(run.BENCH, "wrk_keys.lua")
    cells = [("plain", PLAIN, "k"), ("ovr_with", OVR, "c"), ("ovr_without", OVR, "k")]
    tmp = tempfile.mkdtemp(prefix="ratelimiter-perf-")
    shares = {name: [] for name, _, _ in cells}
    lines = []
    for rep in range(2):
        for name, policy, prefix in cells:
            data = os.path.join(tmp, f"{name}-{rep}.data")
            recorder = run.subprocess.Popen(["perf", "record", "-F", "999", "-p", str(pid), "-o", data, "--", "sleep",
                                             str(seconds + 1)], stdout=run.subprocess.DEVNULL,
                                            stderr=run.subprocess.DEVNULL)
            time.sleep(0.3)
            w = run.with_cpu(lambda: run.wrk(base + "/v1/acquire", connections, seconds, script,
                                             [policy, prefix, SPREAD]), pid, redis_port)
            recorder.wait()
            shares[name].append(symbol_shares(data))
            lines.append(f"# {name} run {rep + 1}: {w['rps']:,.0f} acquires/s, service CPU {w['service_cpu_us']:.1f} µs "
                         f"per acquire (perf running)")

    def mean(name, symbol):
        return sum(s.get(symbol, 0.0) for s in shares[name]) / len(shares[name])

    symbols = set().union(*shares["plain"], *shares["ovr_with"])
    ranked = sorted(symbols, key=lambda sym: mean("plain", sym) - mean("ovr_with", sym))
    lines.append("# self time, % of the service's samples (mean of 2 runs): keys with an override minus the policy "
                 "without any; then the plain policy, keys with, keys without an override")
    for sym in ranked[:25] + ["..."] + ranked[-8:]:
        if sym == "...":
            lines.append("...")
            continue
        lines.append(f"{mean('ovr_with', sym) - mean('plain', sym):+6.2f} {mean('plain', sym):6.2f} "
                     f"{mean('ovr_with', sym):6.2f} {mean('ovr_without', sym):6.2f}  {sym[:140]}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def criterion_lookups(skip):
    """ns per lookup from `cargo bench --bench overrides` (run unless `skip`, then read from
    target/criterion either way)."""
    if not skip:
        run.subprocess.check_call(["cargo", "bench", "--locked", "--bench", "overrides", "--",
                                   "--warm-up-time", "1", "--measurement-time", "3"], cwd=run.ROOT,
                                  stdout=run.subprocess.DEVNULL)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(run.ROOT, "target"))
    out = {}
    directory = os.path.join(target, "criterion", "find")
    if not os.path.isdir(directory):
        return None
    for case in sorted(os.listdir(directory)):
        path = os.path.join(directory, case, "new", "estimates.json")
        if os.path.exists(path):
            with open(path) as f:
                est = json.load(f)
            out[case] = round(est["median"]["point_estimate"], 1)
    return out or None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exact", type=int, default=100_000, help="exact overrides (default 100,000)")
    ap.add_argument("--prefix", type=int, default=500, help="prefix overrides (default 500)")
    ap.add_argument("--cidr", type=int, default=500, help="cidr overrides (default 500)")
    ap.add_argument("--threads", type=int, default=16, help="connections writing the overrides (default 16)")
    ap.add_argument("--ready-runs", type=int, default=3, help="new instances of each kind (default 3)")
    ap.add_argument("--propagation-runs", type=int, default=20, help="writes timed to the others (default 20)")
    ap.add_argument("--connections", type=int, default=50, help="wrk's connections (default 50)")
    ap.add_argument("--duration", type=int, default=5, help="seconds per acquire run (default 5)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved acquire rounds (default 5)")
    ap.add_argument("--quick", action="store_true",
                    help="2,000 exact, 50 prefix, 50 cidr, 1 new instance each, 5 propagations, 2 rounds of 2 s, "
                         "no cargo bench: checks that the table comes out (CI)")
    ap.add_argument("--profile", action="store_true",
                    help="perf profiles of the service for each kind of key afterwards (perf_event_paranoid <= 1 or root)")
    ap.add_argument("--no-cargo-bench", action="store_true", help="read the last criterion results, do not run it")
    ap.add_argument("--no-build", action="store_true", help="use the existing target/release binary")
    ap.add_argument("--out", default=os.path.join(run.BENCH, "results"))
    opts = ap.parse_args()
    if opts.quick:
        opts.exact, opts.prefix, opts.cidr = min(opts.exact, 2_000), min(opts.prefix, 50), min(opts.cidr, 50)
        opts.ready_runs, opts.propagation_runs, opts.rounds, opts.duration = 1, 5, 2, 2
        opts.no_cargo_bench = True
    if opts.exact > SPREAD or opts.prefix > 1_000 or opts.cidr > 1_000 or opts.exact < 1:
        run.fail("--exact is 1 to 100,000, --prefix and --cidr at most 1,000 each")
    for tool, package in [("wrk", "wrk"), ("redis-server", "redis-server"), ("redis-cli", "redis-server")]:
        run.need(tool, package)
    if opts.profile:
        run.need("perf", "linux-perf")
    if not opts.no_build:
        run.subprocess.check_call(["cargo", "build", "--release", "--locked", "--quiet"], cwd=run.ROOT)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(run.ROOT, "target"))
    binary = os.path.join(target, "release", "ratelimiter")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    # Room for the propagation's writes above the exact keys (the default cap is 100,000).
    caps = {"RATELIMITER__LIMITS__MAX_EXACT_OVERRIDES": str(opts.exact + opts.propagation_runs + 10),
            "RATELIMITER__LIMITS__MAX_PATTERN_OVERRIDES": str(max(1_000, opts.prefix + opts.cidr))}
    result = {"when": stamp, "load_before": load_average(),
              "overrides": {"exact": opts.exact, "prefix": opts.prefix, "cidr": opts.cidr},
              "settings": {"connections": opts.connections, "duration_s": opts.duration, "rounds": opts.rounds,
                           "threads": opts.threads, "quick": opts.quick}}

    procs = run.Processes()
    try:
        with_port, without_port = run.start_redis(procs), run.start_redis(procs)
        a, a_child, _ = start_instance(procs, binary, with_port, caps)
        create_policies(a)
        p, p_child, _ = start_instance(procs, binary, without_port, caps)
        create_policies(p)
        stop(p_child)

        matches = ([exact_match(i) for i in range(1, opts.exact + 1)] + [prefix_match(i) for i in range(opts.prefix)]
                   + [cidr_match(i) for i in range(opts.cidr)])
        print(f"bench: writing {len(matches)} overrides", file=sys.stderr)
        before, cpu = commandstats(with_port), run.redis_cpu_s(with_port)
        a_cpu = run.cpu_s(a_child.pid)
        write_s, again = write_overrides(a, matches, opts.threads)
        # Let the refreshes the writes' announcements started finish, then count what they cost.
        time.sleep(2)
        after = commandstats(with_port)
        result["writes"] = {
            "count": len(matches), "seconds": round(write_s, 2), "per_s": round(len(matches) / write_s),
            "sent_again_after_503": again,
            "redis_cpu_us_per_write": round((run.redis_cpu_s(with_port) - cpu) * 1e6 / len(matches), 1),
            "service_cpu_us_per_write": round((run.cpu_s(a_child.pid) - a_cpu) * 1e6 / len(matches), 1),
            "redis_calls_per_write": {k: round((v - before.get(k, 0)) / len(matches), 3)
                                      for k, v in sorted(after.items()) if v - before.get(k, 0) >= len(matches) / 100},
        }
        result["redis_used_memory_mib"] = {
            "with": round(int(redis_info(with_port)["used_memory"]) / 2**20, 1),
            "without": round(int(redis_info(without_port)["used_memory"]) / 2**20, 1),
        }
        result["writer_rss_mib"] = round(run.rss_mib(a_child.pid), 1)

        print("bench: new instances", file=sys.stderr)
        last = f"c{opts.exact}"
        news = {"with": [], "without": []}
        for _ in range(opts.ready_runs):
            news["with"].append(new_instance(procs, binary, with_port, caps, last, True))
            news["without"].append(new_instance(procs, binary, without_port, caps, last, False))
        result["new_instance"] = {
            kind: {
                "ready_s": round(statistics.median(r["ready_s"] for r in runs_), 3),
                "overrides_in_force_s": round(statistics.median(r["loaded_s"] for r in runs_), 3),
                "rss_mib": round(statistics.median(r["rss_mib"] for r in runs_), 1),
                "runs": runs_,
            }
            for kind, runs_ in news.items()
        }
        result["new_instance"]["rss_per_override_bytes"] = round(
            (result["new_instance"]["with"]["rss_mib"] - result["new_instance"]["without"]["rss_mib"]) * 2**20
            / len(matches))

        print("bench: propagation", file=sys.stderr)
        followers, children = {}, []
        for name, extra in [("defaults", {}),
                            ("log_only", {"RATELIMITER__LIMITS__DENIAL_CACHE": "false"}),
                            ("announcement_only", {"RATELIMITER__REDIS__POLICY_REFRESH_MS": "60000"})]:
            base, child, _ = start_instance(procs, binary, with_port, {**caps, **extra})
            # Loaded: the last override of the bulk is in force there.
            run.wait_until(lambda: resolve(base, last)[1] not in (None, "policy"), f"the {name} follower", 120)
            followers[name] = base
            children.append(child)
        result["propagation"] = propagation(a, followers, opts.propagation_runs, stamp)
        for child in children:
            stop(child)

        print("bench: acquires", file=sys.stderr)
        cells = acquire_rounds(a, a_child.pid, with_port, opts.connections, opts.duration, opts.rounds)
        medians = {name: statistics.median(w["rps"] for w in ws) for name, ws in cells.items()}
        result["acquire"] = {
            name: {"rps_median": round(medians[name]), "rps_runs": [round(w["rps"]) for w in ws],
                   "p99_ms_median": round(statistics.median(w["p99_ms"] for w in ws), 2),
                   "service_cpu_us_median": round(statistics.median(w["service_cpu_us"] for w in ws), 1),
                   "redis_cpu_us_median": round(statistics.median(w["redis_cpu_us"] for w in ws), 1),
                   "script_calls_per_acquire": round(statistics.median(w["script_calls_per_acquire"] for w in ws), 3)}
            for name, ws in cells.items()
        }
        # Per round too: the two cells of one round share the machine's state of that moment.
        per_round = {name: [round(cells[name][r]["rps"] / cells["plain"][r]["rps"], 3) for r in range(opts.rounds)]
                     for name in ("ovr_without", "ovr_with")}
        result["acquire_ratio"] = {
            name: {"of_medians": round(medians[name] / medians["plain"], 3), "per_round": per_round[name],
                   "median_per_round": round(statistics.median(per_round[name]), 3)}
            for name in ("ovr_without", "ovr_with")
        }
        result["writer_rss_after_load_mib"] = round(run.rss_mib(a_child.pid), 1)
        if opts.profile:
            print("bench: profiles", file=sys.stderr)
            os.makedirs(opts.out, exist_ok=True)
            result["profile"] = os.path.relpath(profile_cells(
                a, a_child.pid, with_port, opts.connections, opts.duration,
                os.path.join(opts.out, f"{stamp}-profile-overrides.txt")), run.ROOT)
    finally:
        procs.stop_all()
        for path in LOGS:
            os.unlink(path)

    result["lookup_ns"] = criterion_lookups(opts.no_cargo_bench)
    result["load_after"] = load_average()
    report(result)
    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, f"{'quick-' if opts.quick else ''}overrides-{stamp}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwritten to {os.path.relpath(path, run.ROOT)}")
    for name, r in result["acquire_ratio"].items():
        if r["of_medians"] < 0.95 and not opts.quick:
            print(f"bench: {name} / plain = {r['of_medians']} is below the target of 0.95", file=sys.stderr)


def redis_info(port):
    out = run.redis_cli(port, "INFO", "memory")
    return dict(line.split(":", 1) for line in out.splitlines() if ":" in line)


def report(r):
    o = r["overrides"]
    print(f"\noverrides of one policy: {o['exact']:,} exact, {o['prefix']:,} prefix, {o['cidr']:,} cidr; "
          f"load average {r['load_before']['1m']} before, {r['load_after']['1m']} after, on {r['load_before']['cores']} cores")
    w = r["writes"]
    print(f"\nbulk writes      {w['count']:,} in {w['seconds']} s: {w['per_s']:,}/s "
          f"({r['settings']['threads']} connections, one instance; {w['sent_again_after_503']} sent again after a 503)")
    print(f"  per write: {w['service_cpu_us_per_write']} µs of the service's CPU, {w['redis_cpu_us_per_write']} µs of "
          f"Redis's; Redis calls " + ", ".join(f"{k} {v}" for k, v in w["redis_calls_per_write"].items()))
    print(f"redis memory     {r['redis_used_memory_mib']['with']} MiB with, {r['redis_used_memory_mib']['without']} MiB without")
    n = r["new_instance"]
    print("\nnew instance          with overrides   without")
    print(f"  /readyz 200         {n['with']['ready_s']:>10.3f} s   {n['without']['ready_s']:>7.3f} s")
    print(f"  override in force   {n['with']['overrides_in_force_s']:>10.3f} s   {n['without']['overrides_in_force_s']:>7.3f} s")
    print(f"  VmRSS               {n['with']['rss_mib']:>8.1f} MiB   {n['without']['rss_mib']:>5.1f} MiB"
          f"   ({n['rss_per_override_bytes']} bytes per override)")
    print("\npropagation (write through A, resolve on B)   median      max")
    names = {"write_on_a": "the write's answer on A", "defaults": "B with the defaults",
             "log_only": "B without the denial cache (log)", "announcement_only": "B reading the log every 60 s"}
    for key, label in names.items():
        p = r["propagation"][key]
        print(f"  {label:<40} {p['median_ms']:>7.1f} ms {p['max_ms']:>7.1f} ms")
    print(f"\nacquires/s at {r['settings']['connections']} connections, {r['settings']['rounds']} interleaved rounds "
          f"of {r['settings']['duration_s']} s")
    print(f"  {'':<34} {'median':>8} {'p99':>9} {'ratio':>6} {'per round':>9} {'cpu/acq':>8} {'redis':>6} {'calls':>6}")
    for name, label in [("plain", "policy without overrides"), ("ovr_without", "keys without an override"),
                        ("ovr_with", "keys with an override")]:
        a = r["acquire"][name]
        ratio = r["acquire_ratio"].get(name)
        ratios = f"{ratio['of_medians']:>6.3f} {ratio['median_per_round']:>9.3f}" if ratio else f"{'':>6} {'':>9}"
        print(f"  {label:<34} {a['rps_median']:>8,} {a['p99_ms_median']:>6.2f} ms {ratios} "
              f"{a['service_cpu_us_median']:>5.1f} µs {a['redis_cpu_us_median']:>4.1f} µs {a['script_calls_per_acquire']:>6.3f}")
    print("  (ratio: of the medians, and the median of each round's ratio; cpu/acq: the service's CPU time per acquire;"
          "\n   redis: Redis's; calls: Redis script calls per acquire)")
    if r["lookup_ns"]:
        print("\nindex lookup (criterion, 100,000 exact + 1,000 prefix + 1,000 ranges), ns median")
        for case, ns in r["lookup_ns"].items():
            print(f"  {case:<28} {ns:>8.1f}")


if __name__ == "__main__":
    main()
