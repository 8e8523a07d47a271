#!/usr/bin/env python3
"""Policies at scale: many policies on one Redis, measured from outside.

    python3 bench/policies.py                  # 50,000 policies (about 2 minutes)
    python3 bench/policies.py --count 2000     # a quick look

It starts its own redis-server on a free loopback port and the release binary on it (built
first unless --no-build), creates COUNT policies through the API, then measures:

- start-up: how long a new instance takes from launch to /readyz 200 (it loads every policy in
  pages of 500, each a Redis call with its own deadline);
- propagation: how long a PUT through one instance takes to be in force on the other (polled
  through the acquire answer's Policy-ETag);
- idle cost: Redis commands and Redis CPU time per second while two instances sit idle;
- the paged list: GET /v1/policies pages of 1,000 until the end.

Everything listens on 127.0.0.1 and is stopped at the end. Prints a table and writes it as JSON
under bench/results/.
"""

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the load benchmark's helpers: processes, ports, Redis, HTTP)


def redis_info(port, section):
    out = run.subprocess.run(
        ["redis-cli", "-p", str(port), "INFO", section], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split(":", 1) for line in out.splitlines() if ":" in line)


def create_all(base, count, threads=16):
    """Creates `count` policies through the API over keep-alive connections."""
    host, port = base.removeprefix("http://").split(":")

    def create(indices):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        for i in indices:
            body = json.dumps({"name": f"p{i:06d}", "algorithm": "fixed_window", "limit": 100, "window_ms": 60_000})
            conn.request("POST", "/v1/policies", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 201:
                run.fail(f"creating policy {i}: HTTP {r.status}")
        conn.close()

    chunks = [range(t, count, threads) for t in range(threads)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, chunks))


def start_service(procs, binary, redis_port, count):
    port = run.free_port()
    env = dict(
        os.environ,
        RATELIMITER__SERVER__BIND=f"127.0.0.1:{port}",
        RATELIMITER__REDIS__URL=f"redis://127.0.0.1:{redis_port}",
        RATELIMITER__LIMITS__MAX_POLICIES=str(max(count, 1) + 10),
        RUST_LOG="warn",
    )
    started = time.monotonic()
    procs.start([binary], env=env)
    base = f"http://127.0.0.1:{port}"
    run.wait_until(lambda: run.http("GET", base + "/readyz")[0] == 200, "the service", timeout=120)
    return base, time.monotonic() - started


def policy_etag(base, name):
    req = run.urllib.request.Request(
        base + "/v1/acquire",
        data=json.dumps({"policy": name, "key": "k"}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with run.urllib.request.urlopen(req, timeout=10) as r:
            return r.headers.get("Policy-ETag")
    except run.urllib.error.HTTPError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--out", default=os.path.join(run.BENCH, "results"))
    args = parser.parse_args()
    run.need("redis-server", "redis-server")
    if not args.no_build:
        run.subprocess.check_call(["cargo", "build", "--release", "--locked"], cwd=run.ROOT)
    binary = os.path.join(run.ROOT, "target", "release", "ratelimiter")

    procs = run.Processes()
    try:
        redis_port = run.free_port()
        procs.start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        run.wait_until(
            lambda: run.subprocess.run(["redis-cli", "-p", str(redis_port), "PING"], capture_output=True).returncode == 0,
            "redis-server",
        )
        a, _ = start_service(procs, binary, redis_port, args.count)
        t = time.monotonic()
        create_all(a, args.count)
        create_s = time.monotonic() - t

        b, startup_s = start_service(procs, binary, redis_port, args.count)

        # Propagation: a change through A, in force on B.
        runs = []
        for i in range(10):
            name = f"p{(i * 7919) % args.count:06d}"
            body = json.dumps({"algorithm": "fixed_window", "limit": 200 + i, "window_ms": 60_000}).encode()
            req = run.urllib.request.Request(
                a + f"/v1/policies/{name}", data=body, method="PUT", headers={"Content-Type": "application/json"}
            )
            with run.urllib.request.urlopen(req, timeout=10) as r:
                etag = r.headers.get("ETag")
            t = time.monotonic()
            while policy_etag(b, name) != etag:
                if time.monotonic() - t > 10:
                    run.fail(f"{name} not in force on B after 10 s")
                time.sleep(0.005)
            runs.append(time.monotonic() - t)
            time.sleep(0.1)

        # Idle cost with two instances following 50,000 policies.
        time.sleep(1)
        cmd0, cpu0 = redis_info(redis_port, "commandstats"), redis_info(redis_port, "cpu")
        idle_s = 10
        time.sleep(idle_s)
        cmd1, cpu1 = redis_info(redis_port, "commandstats"), redis_info(redis_port, "cpu")

        def total_calls(info):
            return sum(int(v.split("calls=")[1].split(",")[0]) for k, v in info.items() if k.startswith("cmdstat_"))

        def cpu(info):
            return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

        idle_commands = (total_calls(cmd1) - total_calls(cmd0)) / idle_s
        idle_cpu = (cpu(cpu1) - cpu(cpu0)) / idle_s * 100

        # The paged list.
        t = time.monotonic()
        listed, cursor, pages = 0, None, 0
        while True:
            url = b + "/v1/policies?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            page = json.loads(run.http("GET", url)[1])
            listed += len(page["policies"])
            pages += 1
            cursor = page.get("next_cursor")
            if not cursor:
                break
        list_s = time.monotonic() - t
    finally:
        procs.stop_all()

    runs.sort()
    result = {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ"),
        "policies": args.count,
        "create_per_s": round(args.count / create_s),
        "new_instance_ready_s": round(startup_s, 2),
        "propagation_ms": {"median": round(runs[len(runs) // 2] * 1000), "max": round(runs[-1] * 1000)},
        "idle_redis_commands_per_s": round(idle_commands, 1),
        "idle_redis_cpu_percent": round(idle_cpu, 2),
        "list": {"policies": listed, "pages": pages, "seconds": round(list_s, 2)},
    }
    print(json.dumps(result, indent=2))
    if listed != args.count:
        run.fail(f"the paged list returned {listed} policies, not {args.count}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"policies-{result['when']}.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
