#!/usr/bin/env python3
"""What each decision script costs inside Redis, one revision's beside another's, in one run.

    python3 bench/script_cost.py                          # main's scripts beside the work tree's
    python3 bench/script_cost.py --before v1 --after main --rounds 9
    python3 bench/script_cost.py --smoke                  # a few seconds: checks it still runs

Each side's scripts are exactly what its binary sends to Redis (`ratelimiter --print-script`),
so the binary is built from each revision: the work tree's with `cargo build`, any other
revision's from `git archive` into a temporary directory, with its own target directory
(target/script-cost/, a full debug build the first time, cached by commit afterwards).

It starts its own redis-server on a free loopback port, loads both sides' scripts, and measures
each algorithm's one-limit acquire, the two-limit script of bench/run.py, and the classic token
bucket (bench/classic_token_bucket.lua) and `return 1` as yardsticks: `redis-benchmark` calling
EVALSHA (50 connections, keys drawn from 100,000 subjects as in bench/run.py), reading
`usec_per_call` from INFO commandstats after CONFIG RESETSTAT. Every script is warmed up first
(its keys exist, as in steady state), then measured once per round, the rounds interleaving all
scripts of both sides, so that the machine's noise (2 cores shared with other builds) falls on
both alike: read the medians and the per-round ratios after / before, not single samples.

Besides the allowed path that bench/run.py measures, it measures the sliding log's denials:
acquires on 1,000 subjects whose logs are full (10 per hour), of one unit (the denial a flood
repeats) and of five (a search for the retry time).

It prints a table and writes it as JSON under bench/results/ (script-cost-<time>.json).
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# One source for the policies, their script arguments and key layout, and the Redis helpers.
from run import (  # noqa: E402
    LIMITS, POLICIES, SPREAD, TWO, Processes, fail, limit_args, load_script, need, redis_cli,
    script_call, start_redis,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
WORKTREE = "worktree"
ALGORITHMS = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra"]

# The sliding log's denials: full logs of DENIED_LIMIT per hour on DENIED_SPREAD subjects, asked
# for one unit and for DENIED_SEARCH units.
DENIED_LIMIT = 10
DENIED_SPREAD = 1_000
DENIED_SEARCH = 5


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()


def binary(rev, keep):
    """A ratelimiter binary of `rev` (or of the work tree), copied to `keep`."""
    if rev == WORKTREE:
        subprocess.run(["cargo", "build", "--quiet", "--bin", "ratelimiter"], cwd=ROOT, check=True)
        path = os.path.join(keep, "worktree-ratelimiter")
        shutil.copy2(os.path.join(ROOT, "target", "debug", "ratelimiter"), path)
        changed = " with uncommitted changes" if git("status", "--porcelain", "--", "lua", "src") else ""
        return path, f"{WORKTREE} at {git('rev-parse', 'HEAD')}{changed}"
    commit = git("rev-parse", "--verify", rev + "^{commit}")
    cache = os.path.join(ROOT, "target", "script-cost", commit[:12], "ratelimiter")
    if not os.path.exists(cache):
        print(f"building {rev} ({commit[:12]}) in target/script-cost/ (the first time builds every dependency)",
              file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="ratelimiter-rev-") as src:
            archive = subprocess.run(["git", "-C", ROOT, "archive", commit], capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
            env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target", "script-cost", "build"))
            subprocess.run(["cargo", "build", "--quiet", "--bin", "ratelimiter"], cwd=src, env=env, check=True)
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            shutil.copy2(os.path.join(env["CARGO_TARGET_DIR"], "debug", "ratelimiter"), cache)
    return cache, commit


def acquire_source(path, label):
    algorithms = ",".join(algorithm for _, algorithm, _ in LIMITS[label])
    return subprocess.run([path, "--print-script", algorithms], capture_output=True, text=True, check=True).stdout


def usec_per_call(port, sha, keys, args, calls, spread):
    """Redis's own time per EVALSHA of the script, over `calls` calls on keys drawn from `spread`."""
    redis_cli(port, "CONFIG", "RESETSTAT")
    subprocess.run(
        ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(calls), "-r", str(spread), "-q",
         "EVALSHA", sha, str(len(keys)), *keys, *map(str, args)],
        capture_output=True, check=True)
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            if int(fields["calls"]) != calls or int(fields.get("failed_calls", 0)):
                fail(f"EVALSHA ran {fields['calls']} of {calls} calls, {fields.get('failed_calls')} failed")
            return float(fields["usec_per_call"])
    fail("INFO commandstats has no evalsha line")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="main", help="revision whose scripts are the baseline (default main)")
    ap.add_argument("--after", default=WORKTREE, help=f"revision measured against it (default {WORKTREE}: the "
                    "work tree as it stands, uncommitted changes included)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--calls", type=int, default=100_000, help="calls per script and round (default 100,000)")
    ap.add_argument("--smoke", action="store_true", help="1 round of 2,000 calls, to check that it runs")
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    opts = ap.parse_args()
    if opts.smoke:
        opts.rounds, opts.calls = 1, 2_000
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        need(tool, "redis-server")

    began = time.monotonic()
    results = {
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000"),
        "rounds": opts.rounds, "calls": opts.calls, "connections": 50, "cores": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="ratelimiter-script-cost-") as keep:
        # The other revision first, the work tree last, so that target/debug/ratelimiter is left
        # as the work tree's.
        sides = {}
        for side, rev in sorted((("before", opts.before), ("after", opts.after)), key=lambda s: s[1] == WORKTREE):
            sides[side] = binary(rev, keep)
        results["before"], results["after"] = sides["before"][1], sides["after"][1]
        try:
            port = start_redis(procs)
            # name -> (sha, keys, args, spread)
            scripts = {}
            for label in ALGORITHMS + [TWO]:
                for side, (path, _) in sides.items():
                    sha = load_script(port, acquire_source(path, label))
                    keys, args = script_call(label, f"cost-{side}-{label}", "k__rand_int__")
                    scripts[f"{label}/{side}"] = (sha, keys, args, SPREAD)
            for side, (path, _) in sides.items():
                sha = load_script(port, acquire_source(path, "sliding_window_log"))
                for cost in (1, DENIED_SEARCH):
                    keys = [f"rl:{{denied-{side}:k__rand_int__}}:sliding_window_log"]
                    args = [cost, "", DENIED_LIMIT, 3_600_000_000]
                    scripts[f"sliding_window_log denied, cost {cost}/{side}"] = (sha, keys, args, DENIED_SPREAD)
            with open(os.path.join(BENCH, "classic_token_bucket.lua")) as f:
                # Its ARGV: capacity, refill_tokens, refill_period_us, cost.
                scripts["classic_token_bucket"] = (load_script(port, f.read()), ["classic:{k__rand_int__}"],
                                                   limit_args("token_bucket", POLICIES["token_bucket"]) + [1], SPREAD)
            scripts["return_1"] = (load_script(port, "return 1"), ["x"], [], SPREAD)

            # Steady state: every key a round will touch already holds state, and every denied
            # log is full (each of its subjects asked far more than DENIED_LIMIT times).
            for name, (sha, keys, args, spread) in scripts.items():
                usec_per_call(port, sha, keys, args, max(opts.calls, 50 * spread if "denied" in name else 0), spread)
            samples = {name: [] for name in scripts}
            for _ in range(opts.rounds):
                for name, (sha, keys, args, spread) in scripts.items():
                    samples[name].append(usec_per_call(port, sha, keys, args, opts.calls, spread))
        finally:
            procs.stop_all()
    results["loadavg_after"] = os.getloadavg()
    results["seconds"] = round(time.monotonic() - began, 1)
    results["samples_usec"] = samples
    results["median_usec"] = {name: statistics.median(v) for name, v in samples.items()}
    compared = {}
    for name in samples:
        if name.endswith("/after"):
            label = name[: -len("/after")]
            ratios = [a / b for a, b in zip(samples[name], samples[label + "/before"])]
            compared[label] = {
                "before_usec": statistics.median(samples[label + "/before"]),
                "after_usec": statistics.median(samples[name]),
                "ratio_median": statistics.median(ratios),
                "ratio_rounds": ratios,
            }
    results["after_vs_before"] = compared
    classic = samples["classic_token_bucket"]
    results["vs_classic"] = {label: {side: statistics.median([x / c for x, c in zip(samples[f"{label}/{side}"], classic)])
                                     for side in ("before", "after")}
                             for label in compared if "denied" not in label}

    print(f"script cost inside Redis, usec per call (median of {opts.rounds} interleaved rounds of "
          f"{opts.calls:,} calls)\nbefore: {results['before']}\nafter:  {results['after']}\n")
    print(f"{'script':36} {'before':>7} {'after':>7} {'after/before':>12}  per round")
    for label, c in compared.items():
        rounds = " ".join(f"{r:.2f}" for r in c["ratio_rounds"])
        print(f"{label:36} {c['before_usec']:7.2f} {c['after_usec']:7.2f} {c['ratio_median']:12.2f}  {rounds}")
    for name in ("classic_token_bucket", "return_1"):
        print(f"{name:36} {results['median_usec'][name]:7.2f}  rounds: "
              + " ".join(f"{x:.2f}" for x in samples[name]))
    print("\n/ classic bucket (median of per-round ratios): "
          + ", ".join(f"{label} {v['before']:.2f} -> {v['after']:.2f}" for label, v in results["vs_classic"].items()))

    os.makedirs(opts.out, exist_ok=True)
    stamp = results["started"].replace(":", "").replace("+0000", "Z")
    path = os.path.join(opts.out, f"{'smoke-' if opts.smoke else ''}script-cost-{stamp}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwritten to {os.path.relpath(path, ROOT)} in {results['seconds']} s")


if __name__ == "__main__":
    main()
