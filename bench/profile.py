#!/usr/bin/env python3
"""Where an acquire's time goes: perf profiles of the service and of Redis under load.

    python3 bench/profile.py                       # token_bucket on Redis, 50 connections
    python3 bench/profile.py --store embedded      # the embedded store (no Redis)
    python3 bench/profile.py --batch-max 1         # every decision sent alone
    python3 bench/profile.py --store cluster       # a 3-master Redis Cluster
    python3 bench/profile.py --load grpc1          # ShouldRateLimit over gRPC, one descriptor a call

It builds the release binary, starts its own redis-server (unless --store embedded) and the
service on loopback ports, drives POST /v1/acquire with wrk (keys drawn from 100,000 subjects)
and, while wrk runs, samples the service and Redis with `perf record` (installed with apt as
linux-perf when missing). It writes, per process, the share of samples by object (kernel, the
binary, libc, ...) and the top symbols under bench/results/<time>-profile-<what>.txt, with the
throughput of the run, and each process's CPU time per request (service, each Redis; from
/proc), which shows where the machine's two cores went, and each process's context switches per
request (all its threads, from /proc). With --load grpc1 or grpc2 the load is ShouldRateLimit
calls of one or two descriptors (bench/grpc_load.rs, over 2 HTTP/2 connections) on the policies
of bench/run.py's gRPC section, instead of POST /v1/acquire. perf needs the kernel's permission
(perf_event_paranoid <= 1, or root).
"""

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (the benchmark's helpers: processes, wrk, Redis)


def cpu_seconds(pid):
    """User and system CPU time of process `pid`, all threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_pid(port):
    return int(dict(l.split(":", 1) for l in bench.redis_cli(port, "INFO", "server").splitlines()
                    if ":" in l)["process_id"])


def context_switches(pid):
    """Voluntary and involuntary context switches of all of process `pid`'s threads so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total


def perf_record(pid, seconds, out):
    return subprocess.Popen(["perf", "record", "-F", "999", "-p", str(pid), "-o", out, "--", "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summary(data, top):
    """Shares of samples by object, then the top symbols, from `perf report`."""
    def report(*sort):
        out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", ",".join(sort)],
                             capture_output=True, text=True)
        return [l for l in out.stdout.splitlines() if l.strip() and not l.startswith("#")]
    lines = ["# by object:"] + report("dso")[:8] + [f"# top {top} symbols:"] + report("sym")[:top]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=["redis", "embedded", "cluster"], default="redis")
    ap.add_argument("--algorithm", default="token_bucket", choices=bench.ALGORITHMS)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--batch-max", type=int, default=None, help="redis.batch_max of the service (default: its own)")
    ap.add_argument("--load", choices=["http", "grpc1", "grpc2"], default="http",
                    help="POST /v1/acquire with wrk, or ShouldRateLimit of one or two descriptors (default http)")
    ap.add_argument("--top", type=int, default=40, help="symbols listed per process")
    ap.add_argument("--no-build", action="store_true")
    opts = ap.parse_args()
    for tool, package in [("wrk", "wrk"), ("redis-server", "redis-server"), ("perf", "linux-perf")]:
        bench.need(tool, package)
    if not opts.no_build:
        subprocess.check_call(["cargo", "build", "--release", "--quiet"], cwd=bench.ROOT)
        if opts.load != "http":
            subprocess.check_call(["cargo", "build", "--release", "--quiet", "--example", "grpc_load"], cwd=bench.ROOT)
    binary = os.path.join(bench.ROOT, "target", "release", "ratelimiter")
    grpc_binary = os.path.join(bench.ROOT, "target", "release", "examples", "grpc_load")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=bench.ROOT, capture_output=True,
                            text=True).stdout.strip()
    procs = bench.Processes()
    sections = []
    try:
        redis_port = bench.start_redis(procs) if opts.store == "redis" else None
        cluster = bench.start_cluster(procs) if opts.store == "cluster" else None
        extra = {} if opts.batch_max is None else {"RATELIMITER__REDIS__BATCH_MAX": str(opts.batch_max)}
        grpc_port = bench.free_port()
        if opts.load != "http":
            extra.update(bench.grpc_bind(grpc_port))
        base, service = bench.start_service(procs, binary, redis_port, 16, cluster=cluster, extra=extra)
        if opts.load != "http":
            bench.create_grpc_policies(base)
        targets = {"service": service.pid}
        if redis_port:
            targets["redis"] = redis_pid(redis_port)
        for i, node in enumerate((cluster or "").split(",") if cluster else []):
            targets[f"redis-master-{i + 1}"] = redis_pid(int(node.rsplit(":", 1)[1]))
        policy = bench.policy_name(opts.algorithm)
        script = os.path.join(bench.BENCH, "wrk.lua")

        def load(seconds):
            if opts.load == "http":
                return bench.wrk(base + "/v1/acquire", opts.connections, seconds, script, [policy, bench.SPREAD])
            keys = [key for _, key in bench.GRPC_POLICIES[:1 if opts.load == "grpc1" else 2]]
            return bench.grpc_load(grpc_binary, grpc_port, opts.connections, min(2, opts.connections), seconds, 0,
                                   keys)

        # Warm up, so that the profile sees the steady state.
        load(2)
        cpu = bench.redis_cpu_s(redis_port) if redis_port else 0.0
        cpu_before = {name: cpu_seconds(pid) for name, pid in targets.items()}
        switches_before = {name: context_switches(pid) for name, pid in targets.items()}
        tmp = tempfile.mkdtemp(prefix="ratelimiter-perf-")
        recorders = {name: perf_record(pid, opts.seconds, os.path.join(tmp, f"{name}.data"))
                     for name, pid in targets.items()}
        result = {}
        running = threading.Thread(target=lambda: result.update(load(opts.seconds)))
        running.start()
        running.join()
        for r in recorders.values():
            r.wait()
        requests = max(1, result.get("calls_total", result["requests"]))
        redis_us = ((bench.redis_cpu_s(redis_port) - cpu) * 1e6 / requests) if redis_port else None
        # The sampling itself costs a little CPU in each process: compare runs of this script.
        per_request = {name: (cpu_seconds(pid) - cpu_before[name]) * 1e6 / requests
                       for name, pid in targets.items()}
        switches = {name: (context_switches(pid) - switches_before[name]) / requests
                    for name, pid in targets.items()}
        sections.append("# CPU per request (us, user + system, from /proc; the run's wall time is "
                        f"{opts.seconds} s on {os.cpu_count()} cores): "
                        + ", ".join(f"{name} {us:.2f}" for name, us in per_request.items())
                        + f", all {sum(per_request.values()):.2f}\n"
                        + "# context switches per request (all threads, from /proc): "
                        + ", ".join(f"{name} {n:.2f}" for name, n in switches.items()) + "\n")
        for name in targets:
            sections.append(f"## {name}\n" + summary(os.path.join(tmp, f"{name}.data"), opts.top))
    finally:
        procs.stop_all()
    what = (f"{opts.store}-{opts.algorithm}" + ("" if opts.batch_max is None else f"-batch{opts.batch_max}")
            + ("" if opts.load == "http" else f"-{opts.load}"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    path = os.path.join(bench.BENCH, "results", f"{stamp}-profile-{what}.txt")
    if opts.load == "http":
        during = f"wrk -c{opts.connections} -d{opts.seconds}s, POST /v1/acquire, {opts.store} store, {opts.algorithm}"
    else:
        during = (f"grpc_load --concurrency {opts.connections} --connections {min(2, opts.connections)} --duration "
                  f"{opts.seconds}, ShouldRateLimit of {opts.load[-1]} descriptor(s), {opts.store} store, token_bucket")
    head = (f"# perf record -F 999 of each process during {during}, {bench.SPREAD:,} keys; release build at commit "
            f"{commit}\n"
            f"# {result['rps']:.0f} {'acquires' if opts.load == 'http' else 'calls'}/s, p99 {result['p99_ms']:.2f} ms"
            + (f"; Redis CPU {redis_us:.2f} us per decision (INFO cpu)" if redis_us is not None else "")
            + f"; redis.batch_max {opts.batch_max if opts.batch_max is not None else 'default'}\n")
    with open(path, "w") as f:
        f.write(head + "\n".join(sections))
    print(head + "\n".join(sections))
    print(f"written to {os.path.relpath(path, bench.ROOT)}")


if __name__ == "__main__":
    main()
