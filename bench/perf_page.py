#!/usr/bin/env python3
"""Render docs/performance.md's tables from the committed result files in bench/results/.

    python3 bench/perf_page.py --write      # rewrite the generated tables in docs/performance.md
    python3 bench/perf_page.py --check      # exit 1 with a diff when the page and the files disagree
    python3 bench/perf_page.py --self-test  # --check passes on a copy, and fails once a number changes
    python3 bench/perf_page.py --list       # which result file each table comes from
    python3 bench/perf_page.py --ci         # what .ci/run runs: --self-test, then --check (about 2 s)

A generated table sits between two markers on the page:

    <!-- perf:table acquire -->
    ... written by this script: which file and date, then the table ...
    <!-- /perf:table -->

and everything outside the markers is written by hand. For each table this script picks the
latest result file (by the time the run started, which each file records) that answers its
question; smoke and quick runs (smoke-*, quick-*) never count. So a newly committed run changes
the page at the next --write, and --check fails until it has been written.

Python's standard library only. Nothing is measured here: it only reads JSON.
"""

import argparse
import datetime
import difflib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PAGE = os.path.join(ROOT, "docs", "performance.md")
ALGORITHMS = ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra"]
TWO = "token_bucket+fixed_window"
SPREAD = 100_000
BEGIN = re.compile(r"^<!-- perf:table ([a-z_]+) -->$")
END = "<!-- /perf:table -->"


# ---------------------------------------------------------------------------------------------
# Result files


class Result:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        with open(path) as f:
            self.data = json.load(f)
        self.started = started(self.data, self.name)

    def caption(self, command):
        when = self.started.strftime("%Y-%m-%d %H:%M UTC")
        return f"From [`bench/results/{self.name}`](../bench/results/{self.name}) (started {when}), made by `{command}`."


def started(data, name):
    """When the run started: run.py writes `started` (ISO 8601), overrides.py and policies.py
    `when` (2026-12-01T215230Z), script_cost.py `started` with +0000; the file name otherwise."""
    text = data.get("started") or data.get("when") if isinstance(data, dict) else None
    candidates = [text] if text else []
    m = re.search(r"\d{4}-\d\d-\d\dT\d{6}Z", name)
    if m:
        candidates.append(m.group(0))
    for t in candidates:
        for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H%M%SZ"):
            try:
                d = datetime.datetime.strptime(t.replace("+00:00", "+0000"), fmt)
                return d.replace(tzinfo=None) if d.tzinfo is None else d.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            except ValueError:
                continue
    raise SystemExit(f"perf_page: {name}: no start time (neither `started`, `when` nor a time in its name)")


def load_results(directory):
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        name = os.path.basename(path)
        if name.startswith(("smoke-", "quick-")):
            continue
        out.append(Result(path))
    return out


def latest(results, answers, what):
    found = [r for r in results if answers(r.name, r.data)]
    if not found:
        raise SystemExit(f"perf_page: no result file in bench/results/ answers {what}")
    return max(found, key=lambda r: (r.started, r.name))


def two_latest(results, answers, what):
    found = sorted((r for r in results if answers(r.name, r.data)), key=lambda r: (r.started, r.name))
    if not found:
        raise SystemExit(f"perf_page: no result file in bench/results/ answers {what}")
    return found[-1], (found[-2] if len(found) > 1 else None)


def cell(data, algorithm, keys=SPREAD, connections=50):
    return next((r for r in data.get("rows") or [] if r["algorithm"] == algorithm and r["keys"] == keys
                 and r["connections"] == connections), None)


def full_run(name, data):
    """A default bench/run.py run: the HTTP cells of every algorithm with the bare handler and the
    cluster beside them."""
    return (re.fullmatch(r"\d{4}-\d\d-\d\dT\d{6}Z\.json", name) is not None
            and all(cell(data, a) and cell(data, a).get("bare") and cell(data, a).get("cluster")
                    and "redis_cpu_us" in cell(data, a)["redis"] for a in ALGORITHMS))


# ---------------------------------------------------------------------------------------------
# Formatting


def n(v):
    return f"{v:,.0f}"


def r2(v):
    return f"{v:.2f}"


def us(v):
    return f"{v:.1f}"


def met(ok):
    return "met" if ok else "**missed**"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def spread(values, fmt=r2):
    values = [v for v in values if v is not None]
    return f"{fmt(min(values))}–{fmt(max(values))}"


# ---------------------------------------------------------------------------------------------
# The tables: each returns (the result files it read, its lines)


def t_sources(results):
    """Every file the page's other tables read, with the machine it records."""
    used = {}
    for name, (_, render) in TABLES.items():
        if name == "sources":
            continue
        for r in render(results)[0]:
            used[r.name] = r
    rows = []
    for r in sorted(used.values(), key=lambda r: (r.started, r.name)):
        d = r.data
        machine = d.get("machine") or {}
        cores = machine.get("cores") or d.get("cores") or (d.get("load_before") or {}).get("cores") or "not recorded"
        load = d.get("load_before") or {}
        load = f"{load['1m']:.2f}" if "1m" in load else (f"{d['loadavg_before'][0]:.2f}" if d.get("loadavg_before") else "not recorded")
        redis = machine.get("redis", "not recorded")
        secs = f"{d['seconds']:.0f} s" if isinstance(d.get("seconds"), (int, float)) else "not recorded"
        rows.append([f"`{r.name}`", r.started.strftime("%Y-%m-%d %H:%M"), cores, redis, load, secs])
    return list(used.values()), table(["result file", "started (UTC)", "cores", "Redis", "load average (1 min) before", "run took"], rows)


def t_acquire(results):
    r = latest(results, full_run, "acquire against EVALSHA")
    d = r.data
    rows = []
    for a in ALGORITHMS + [TWO]:
        c = cell(d, a)
        if not c:
            continue
        rows.append([f"`{a}`", n(c["redis"]["rps"]), r2(c["redis"]["p99_ms"]), n(c["evalsha"]["rps"]),
                     r2(c["evalsha"]["p99_ms"]), f"**{r2(c['redis_vs_evalsha'])}**",
                     us(c["redis"]["redis_cpu_us"]), us(c["evalsha"]["redis_cpu_us"]),
                     met(c["redis_vs_evalsha"] >= 0.6)])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["policy", "acquire on one Redis /s", "p99 ms", "`EVALSHA` /s", "p99 ms", "acquire / `EVALSHA`",
                    "Redis CPU µs per decision, acquire", "… by `EVALSHA`", "target ≥ 0.6"], rows)
    return [r], lines


def t_classic(results):
    r = latest(results, lambda n_, d: full_run(n_, d) and cell(d, "token_bucket").get("classic"),
               "acquire against the classic script")
    d = r.data
    rows = []
    for conns in (1, 50, 256):
        c = cell(d, "token_bucket", connections=conns)
        if not c or not c.get("classic"):
            continue
        rows.append([conns, n(c["redis"]["rps"]), r2(c["redis"]["p99_ms"]), n(c["unbatched"]["rps"]),
                     r2(c["unbatched"]["p99_ms"]), n(c["classic"]["rps"]), r2(c["classic"]["p99_ms"]),
                     f"**{r2(c['redis_vs_classic'])}**", met(c["redis_vs_classic"] >= 1.0) if conns == 50 else "",
                     r2(c["unbatched_vs_classic"]),
                     f"{us(c['redis']['redis_cpu_us'])} / {us(c['unbatched']['redis_cpu_us'])} / {us(c['classic']['redis_cpu_us'])}"])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["connections", "acquire /s (batches, the default)", "p99 ms", "acquire /s, `redis.batch_max` = 1",
                    "p99 ms", "classic script `EVALSHA` /s", "p99 ms", "acquire / classic", "target ≥ 1.0 at 50",
                    "unbatched / classic",
                    "Redis CPU µs per decision: batches / unbatched / classic"], rows)
    return [r], lines


def t_embedded(results):
    r = latest(results, full_run, "embedded against /healthz")
    d = r.data
    rows = []
    for a in ALGORITHMS + [TWO]:
        c = cell(d, a)
        if not c:
            continue
        rows.append([f"`{a}`", n(c["embedded"]["rps"]), r2(c["embedded"]["p99_ms"]), n(c["healthz"]["rps"]),
                     n(c["bare"]["rps"]), f"**{r2(c['embedded_vs_healthz'])}**", met(c["embedded_vs_healthz"] >= 0.9),
                     r2(c["healthz_vs_bare"]), met(c["healthz_vs_bare"] >= 0.9)])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["policy", "acquire on the embedded store /s", "p99 ms", "`GET /healthz` /s", "bare actix-web /s",
                    "embedded / `/healthz`", "target ≥ 0.9", "`/healthz` / bare", "target ≥ 0.9"], rows)
    return [r], lines


def t_cluster(results):
    r = latest(results, full_run, "the cluster against one Redis")
    d = r.data
    rows = []
    for a in ALGORITHMS + [TWO]:
        c = cell(d, a)
        if not c or not c.get("cluster"):
            continue
        ratio = c["cluster"]["rps"] / c["redis"]["rps"]
        rows.append([f"`{a}`", n(c["redis"]["rps"]), r2(c["redis"]["p99_ms"]), n(c["cluster"]["rps"]),
                     r2(c["cluster"]["p99_ms"]), f"**{r2(ratio)}**", met(ratio >= 0.9)])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["policy", "one Redis /s", "p99 ms", "3-master cluster /s", "p99 ms", "cluster / one Redis",
                    "target ≥ 0.9"], rows)
    return [r], lines


def t_scripts(results):
    r = latest(results, lambda n_, d: full_run(n_, d) and d.get("script_cost_samples")
               and "classic_token_bucket" in d.get("script_cost_usec", {}), "script costs")
    d = r.data
    costs, samples = d["script_cost_usec"], d["script_cost_samples"]
    classic = costs["classic_token_bucket"]
    rows = []
    for name in ALGORITHMS + [TWO, "classic_token_bucket", "return_1"]:
        if name not in costs:
            continue
        label = {"classic_token_bucket": "the classic token bucket (`bench/classic_token_bucket.lua`)",
                 "return_1": "a script that only returns 1"}.get(name, f"`{name}`")
        if name in ALGORITHMS:
            factor = 0.6 if name == "gcra" else 1.0
            target = f"≤ {factor} × classic: {met(costs[name] <= factor * classic)}"
        elif name == TWO:
            two = d.get("two_limits_vs_one") or {}
            target = (f"≤ 1.5 × `token_bucket`: {r2(two['script_cost'])}, {met(two['script_cost'] < 1.5)}"
                      if "script_cost" in two else "")
        else:
            target = ""
        rows.append([label, f"{costs[name]:.2f}", spread(samples.get(name, [costs[name]])),
                     f"**{r2(costs[name] / classic)}**", target])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["script", "µs per call inside Redis (median)", "rounds", "/ classic", "target"], rows)
    return [r], lines


def t_log_denied(results):
    r = latest(results, lambda n_, d: n_.startswith("script-cost-") and "median_usec" in d,
               "the denied sliding log's cost")
    d = r.data
    med, samples = d["median_usec"], d["samples_usec"]
    classic = med["classic_token_bucket"]
    names = [("sliding_window_log/after", "`sliding_window_log`, allowed"),
             ("sliding_window_log denied, cost 1/after", "`sliding_window_log`, denied, 1 unit of a full log of 10"),
             ("sliding_window_log denied, cost 5/after", "`sliding_window_log`, denied, 5 units of a full log of 10"),
             ("classic_token_bucket", "the classic token bucket"),
             ("return_1", "a script that only returns 1")]
    rows = [[label, f"{med[k]:.2f}", spread(samples[k]), f"**{r2(med[k] / classic)}**"]
            for k, label in names if k in med]
    lines = [r.caption("python3 bench/script_cost.py"), ""]
    lines += table(["script", "µs per call inside Redis (median)", "rounds", "/ classic"], rows)
    return [r], lines


def t_flood(results):
    r = latest(results, lambda n_, d: full_run(n_, d) and d.get("flood"), "the hot-key flood")
    f = r.data["flood"]
    rows = []
    for key, label in (("cached", "with the denial cache (the default)"),
                       ("uncached", "without (`limits.denial_cache = false`)")):
        x = f[key]
        rows.append([label, n(x["rps"]), r2(x["p99_ms"]), f"{x['calls_per_100_acquires']:.3f}",
                     f"{n(x['script_calls'])} for {n(x['requests'])}"])
    per_100 = f["cached"]["calls_per_100_acquires"]
    rows.append(["with / without", f"**{r2(f['cached']['rps'] / f['uncached']['rps'])}**", "", "",
                 f"target < 1 call per 100 with the cache: {met(per_100 < 1)}"])
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["hot-key flood, 256 connections, one Redis", "acquires /s", "p99 ms",
                    "Redis script calls per 100 acquires", "calls for acquires"], rows)
    return [r], lines


def t_memory(results):
    r = latest(results, lambda n_, d: full_run(n_, d) and d.get("memory"), "memory per subject")
    m = r.data["memory"]
    ok = m["subjects"] >= 1_000_000 and m["rss_full_mib"] < 300 and m["subjects_after_expiry"] == 0
    rows = [["subjects held", n(m["subjects"])],
            ["resident memory, idle before them", f"{m['rss_idle_mib']:.1f} MiB"],
            ["resident memory with them", f"{m['rss_full_mib']:.1f} MiB"],
            ["**per subject**", f"**{m['bytes_per_subject']:.0f} bytes**"],
            ["subjects left once they expired", n(m["subjects_after_expiry"])],
            ["resident memory after they expired", f"{m['rss_after_expiry_mib']:.1f} MiB"],
            ["target: 1,000,000 subjects in under 300 MB, reclaimed when they expire", met(ok)]]
    lines = [r.caption("python3 bench/run.py"), ""]
    lines += table(["embedded store", "measured"], rows)
    return [r], lines


def grpc_file(name, data):
    return bool((data.get("grpc") or {}).get("summary"))


def t_grpc(results):
    r, other = two_latest(results, grpc_file, "gRPC")
    summary = r.data["grpc"]["summary"]
    limit = r.data["grpc"]["settings"]["envoy_timeout_ms"]
    before = {(s["store"], s["connections"]): s for s in (other.data["grpc"]["summary"] if other else [])}
    rows = []
    for s in summary:
        one, two, h = s["grpc_1"], s["grpc_2"], s["http"]
        o = before.get((s["store"], s["connections"]))
        bracket = lambda k: f" ({r2(o[k])})" if o else ""
        slow = one["slow"] + two["slow"]
        calls = one["requests"] + two["requests"]
        rows.append([s["store"], s["connections"], n(one["rps"]), r2(one["p99_ms"]), n(two["rps"]),
                     r2(two["p99_ms"]), n(h["rps"]), r2(h["p99_ms"]),
                     f"**{r2(s['grpc_1_vs_http'])}**{bracket('grpc_1_vs_http')}",
                     f"{r2(s['grpc_2_vs_grpc_1'])}{bracket('grpc_2_vs_grpc_1')}",
                     f"{us(one['service_cpu_us'])} / {us(h['service_cpu_us'])}",
                     f"{100 * slow / calls:.2f} %" if calls else "0",
                     met(max(one["worst_p99_ms"], two["worst_p99_ms"]) < limit)])
    lines = [r.caption("python3 bench/run.py --grpc-only")]
    if other:
        lines[0] += f" Ratios in brackets: the run before it, [`bench/results/{other.name}`](../bench/results/{other.name})."
    lines.append("")
    lines += table(["store", "in flight", "gRPC, 1 descriptor /s", "p99 ms", "gRPC, 2 descriptors /s", "p99 ms",
                    "HTTP acquire /s", "p99 ms", "1 descriptor / HTTP", "2 / 1 descriptor",
                    "service CPU µs per call, gRPC / HTTP", f"gRPC calls over {limit} ms",
                    f"every round's p99 < {limit} ms"], rows)
    return [r] + ([other] if other else []), lines


def overrides_file(name, data):
    return name.startswith("overrides-") and not (data.get("settings") or {}).get("quick") and "acquire_ratio" in data


def t_overrides(results):
    r = latest(results, overrides_file, "overrides at scale")
    d = r.data
    o = d["overrides"]
    w = d["writes"]
    ni = d["new_instance"]
    p = d["propagation"]
    a = d["acquire"]
    ratio = d["acquire_ratio"]
    rounds = d["settings"]["rounds"]
    lk = d["lookup_ns"]
    rows = [
        ["writes through the API, 16 connections",
         f"{n(w['per_s'])}/s ({n(w['count'])} in {w['seconds']:.0f} s; {us(w['service_cpu_us_per_write'])} µs of "
         f"service CPU and {us(w['redis_cpu_us_per_write'])} µs of Redis's each)", ""],
        ["Redis memory",
         f"{d['redis_used_memory_mib']['with']:.1f} MiB (about "
         f"{n((d['redis_used_memory_mib']['with'] - d['redis_used_memory_mib']['without']) * 2**20 / (o['exact'] + o['prefix'] + o['cidr']))}"
         f" bytes per override)", f"{d['redis_used_memory_mib']['without']:.1f} MiB"],
        ["a new instance: `/readyz` 200 and the overrides in force",
         f"{ni['with']['overrides_in_force_s']:.2f} s", f"{ni['without']['overrides_in_force_s']:.2f} s"],
        ["a new instance's resident memory",
         f"{ni['with']['rss_mib']:.0f} MiB (**{n(ni['rss_per_override_bytes'])} bytes per override**)",
         f"{ni['without']['rss_mib']:.0f} MiB"],
        ["a write through one instance in force on another (announced, the default)",
         f"{p['defaults']['median_ms']:.1f} ms median, {p['defaults']['max_ms']:.1f} ms max", ""],
        ["… on an instance without the announcements (the change log only)",
         f"{p['log_only']['median_ms']:.1f} ms median, {p['log_only']['max_ms']:.1f} ms max", ""],
        [f"acquires/s, keys without an override (median of {rounds} rounds)",
         f"**{ratio['ovr_without']['of_medians']:.3f}** of the policy without overrides (rounds' median "
         f"{ratio['ovr_without']['median_per_round']:.3f}, {spread(ratio['ovr_without']['per_round'])}); "
         f"{us(a['ovr_without']['service_cpu_us_median'])} µs of service CPU", f"1 ({n(a['plain']['rps_median'])}/s, "
         f"{us(a['plain']['service_cpu_us_median'])} µs)"],
        [f"acquires/s, keys with an override",
         f"**{ratio['ovr_with']['of_medians']:.3f}** (rounds' median {ratio['ovr_with']['median_per_round']:.3f}, "
         f"{spread(ratio['ovr_with']['per_round'])}); {us(a['ovr_with']['service_cpu_us_median'])} µs", ""],
        ["finding the override (criterion, ns)",
         f"exact {lk['exact_hit']:.0f} for one key repeated, {lk['exact_hit_spread']:.0f} for 100,000 keys in turn; "
         f"prefix {lk['prefix_hit']:.0f}; range {lk['range_hit_v4']:.0f} (IPv4), {lk['range_hit_v6']:.0f} (IPv6); "
         f"a miss {lk['miss_key']:.0f} (key), {lk['miss_v4']:.0f} (IPv4), {lk['miss_v6']:.0f} (IPv6)",
         f"{spread([v for k, v in lk.items() if k.endswith('_no_overrides')], fmt=lambda v: f'{v:.0f}')}"],
    ]
    lines = [r.caption("python3 bench/overrides.py"), ""]
    lines += table(["one Redis, a policy with", f"{n(o['exact'])} exact, {n(o['prefix'])} prefix and {n(o['cidr'])} range overrides",
                    "none"], rows)
    return [r], lines


def t_policies(results):
    r = latest(results, lambda n_, d: n_.startswith("policies-") and "propagation_ms" in d, "policies at scale")
    d = r.data
    rows = [["a new instance, from launch to `/readyz` 200", f"{d['new_instance_ready_s']:.2f} s"],
            ["a change through one instance in force on the other",
             f"median {d['propagation_ms']['median']} ms, at most {d['propagation_ms']['max']} ms"],
            ["Redis while two instances sit idle",
             f"{d['idle_redis_commands_per_s']:.0f} commands a second, {d['idle_redis_cpu_percent']:.1f} % of a core"],
            [f"`GET /v1/policies?limit=1000`, all {d['list']['pages']} pages", f"{d['list']['seconds']:.2f} s"],
            ["creating them through the API (16 clients)", f"{n(d['create_per_s'])} policies a second"]]
    lines = [r.caption("python3 bench/policies.py"), ""]
    lines += table([f"{n(d['policies'])} policies on one Redis", "measured"], rows)
    return [r], lines


# The A/B files record the two binaries' paths but not what differed between them: that is said
# here, once, for the ones the page shows (a later A/B of the same question goes in this list).
AB_QUESTIONS = [
    ("ab-2026-12-01T221553Z.json", "top offenders on (`top.subjects` 128, the default) against off (0)"),
    ("ab-2026-12-01T212507Z.json", "tracing on (`tracing.sample_ratio` 1.0, exporting to a local receiver) "
                                   "against a build without tracing, on a loaded machine"),
    ("ab-2026-12-02T042437Z.json", "the release profile's fat LTO (`lto = \"fat\"`, `codegen-units = 1`) "
                                   "against thin LTO (16 codegen units), on a loaded machine"),
]


def t_observability(results):
    by_name = {r.name: r for r in results}
    used, rows = [], []
    for name, label in AB_QUESTIONS:
        r = by_name.get(name)
        if r is None:
            raise SystemExit(f"perf_page: bench/results/{name} (named in AB_QUESTIONS) is missing")
        used.append(r)
        cells = {c["store"]: c for c in r.data["cells"]}
        row = [label]
        for store in ("embedded", "redis"):
            c = cells.get(store)
            if not c:
                row.append("not measured")
                continue
            row.append(f"**{r2(c['b_vs_a'])}** (rounds {spread(c['b_vs_a_rounds'])}); "
                       f"{us(c['B']['service_cpu_us'])} against {us(c['A']['service_cpu_us'])} µs")
        s = r.data["settings"]
        row.append(f"`{name}`, {s['rounds']} rounds of {s['duration_s']} s, {r.started.strftime('%Y-%m-%d %H:%M')}")
        rows.append(row)
    lines = ["Made by `python3 bench/run.py --against <binary> --no-build --algorithms token_bucket` "
             "(50 connections, 100,000 keys); each row's file is named in it.", ""]
    lines += table(["B against A", "embedded store: B/A acquires/s; service CPU per acquire, B against A",
                    "one Redis: the same", "result file"], rows)
    return used, lines


TABLES = {
    "sources": ("the result files the page reads", t_sources),
    "acquire": ("acquire on one Redis against the EVALSHA ceiling", t_acquire),
    "classic": ("batches against the classic script's ceiling", t_classic),
    "embedded": ("the embedded store against /healthz", t_embedded),
    "cluster": ("a 3-master cluster against one Redis", t_cluster),
    "scripts": ("each script's cost inside Redis", t_scripts),
    "log_denied": ("the sliding log's denials inside Redis", t_log_denied),
    "flood": ("the hot-key flood and the denial cache", t_flood),
    "memory": ("memory per subject on the embedded store", t_memory),
    "grpc": ("Envoy's protocol over gRPC against HTTP", t_grpc),
    "overrides": ("overrides at scale", t_overrides),
    "policies": ("policies at scale", t_policies),
    "observability": ("what top offenders and tracing cost", t_observability),
}


# ---------------------------------------------------------------------------------------------
# The page


def render(page_text, results):
    """The page with every generated table rewritten; errors for unknown, unclosed or missing
    tables."""
    out, errors, seen = [], [], set()
    lines = page_text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = BEGIN.match(line)
        if line == END:
            errors.append(f"line {i + 1}: {END} without an opening marker")
        if not m:
            out.append(line)
            i += 1
            continue
        name = m.group(1)
        j = next((k for k in range(i + 1, len(lines)) if lines[k] == END or BEGIN.match(lines[k])), None)
        if j is None or lines[j] != END:
            errors.append(f"line {i + 1}: table {name!r} is not closed by {END}")
            out.extend(lines[i:])
            break
        if name not in TABLES:
            errors.append(f"line {i + 1}: unknown table {name!r} (known: {', '.join(TABLES)})")
            out.extend(lines[i:j + 1])
        else:
            if name in seen:
                errors.append(f"line {i + 1}: table {name!r} appears twice")
            seen.add(name)
            out.append(line)
            out.extend(TABLES[name][1](results)[1])
            out.append(END)
        i = j + 1
    for name in TABLES:
        if name not in seen:
            errors.append(f"table {name!r} ({TABLES[name][0]}) is not on the page: add "
                          f"<!-- perf:table {name} --> and {END}")
    return "\n".join(out), errors


def unlisted(directory):
    """Every committed result file must have its line in the history, bench/results/README.md."""
    history = os.path.join(directory, "README.md")
    if not os.path.exists(history):
        return [f"{os.path.relpath(history)} (the run-by-run history) is missing"]
    with open(history) as f:
        text = f.read()
    return [f"bench/results/{name} is not named in bench/results/README.md: add what the run measured"
            for name in sorted(os.listdir(directory))
            if name != "README.md" and not name.startswith(("smoke-", "quick-"))
            and not re.search(r"[`/]" + re.escape(name) + "`", text)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated tables in the page")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when the page differs from the files")
    mode.add_argument("--self-test", action="store_true", help="check that --check passes, and fails on a change")
    mode.add_argument("--list", action="store_true", help="print which result file each table comes from")
    mode.add_argument("--ci", action="store_true", help="--self-test, then --check of the committed page")
    ap.add_argument("--page", default=PAGE, help="the page (default docs/performance.md)")
    ap.add_argument("--results", default=RESULTS, help="the result files' directory (default bench/results)")
    opts = ap.parse_args(argv)
    if opts.self_test:
        return self_test()
    if opts.ci:
        return self_test() or main(["--check", "--page", opts.page, "--results", opts.results])
    results = load_results(opts.results)
    if opts.list:
        for name, (what, fn) in TABLES.items():
            print(f"{name:14} {what}: {', '.join(r.name for r in fn(results)[0])}")
        return 0
    with open(opts.page) as f:
        text = f.read()
    new, errors = render(text, results)
    for e in errors:
        print(f"perf_page: {os.path.relpath(opts.page)}: {e}", file=sys.stderr)
    if errors:
        return 1
    missing = unlisted(opts.results)
    for e in missing:
        print(f"perf_page: {e}", file=sys.stderr)
    if opts.write:
        if missing:
            return 1
        if new != text:
            with open(opts.page, "w") as f:
                f.write(new)
            print(f"perf_page: rewrote the tables of {os.path.relpath(opts.page)}")
        else:
            print(f"perf_page: {os.path.relpath(opts.page)} already agrees with bench/results/")
        return 0
    if new != text:
        sys.stdout.flush()
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   "docs/performance.md (committed)",
                                                   "docs/performance.md (from bench/results/)"))
        print(f"perf_page: {os.path.relpath(opts.page)} disagrees with bench/results/: run "
              f"`python3 bench/perf_page.py --write` (and read the prose around the tables that changed)",
              file=sys.stderr)
        return 1
    if missing:
        return 1
    print(f"perf_page: {os.path.relpath(opts.page)} agrees with bench/results/ ({len(TABLES)} tables)")
    return 0


def self_test():
    """--check on a copy of the page and the files: it must pass as committed, and fail when a
    number changes in a result file, when a newer run is added, when a figure is edited on the
    page, and when a marker is lost."""
    failures = []

    def check(page, results, expect, what):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--check", "--page", page, "--results", results],
                           capture_output=True, text=True)
        ok = (p.returncode == 0) == expect
        print(f"self-test: {what}: --check exit {p.returncode} ({'as expected' if ok else 'WRONG'})", flush=True)
        if not ok:
            failures.append(what)
            print(p.stdout[-2000:] + p.stderr[-2000:])
        return p

    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results")
        shutil.copytree(RESULTS, results)
        page = os.path.join(tmp, "performance.md")
        shutil.copy(PAGE, page)
        check(page, results, True, "the committed page and files")

        acquire = latest(load_results(results), full_run, "acquire").path
        with open(acquire) as f:
            original = f.read()
        data = json.loads(original)
        cell(data, "token_bucket")["redis"]["rps"] += 1234
        changed = n(cell(data, "token_bucket")["redis"]["rps"])
        with open(acquire, "w") as f:
            json.dump(data, f)
        p = check(page, results, False, "token_bucket's acquires/s changed in " + os.path.basename(acquire))
        if p.returncode and not any(line.startswith("+") and changed in line for line in p.stdout.splitlines()):
            failures.append(f"the diff does not show the changed figure {changed}")
        with open(acquire, "w") as f:
            f.write(original)

        newer = json.loads(original)
        newer["started"] = "2099-01-01T00:00:00+00:00"
        cell(newer, "gcra")["redis_vs_evalsha"] = 0.123
        newer_path = os.path.join(results, "2099-01-01T000000Z.json")
        with open(newer_path, "w") as f:
            json.dump(newer, f)
        p = check(page, results, False, "a newer full run added")
        if p.returncode and "2099-01-01T000000Z.json" not in p.stdout:
            failures.append("the diff does not name the newer file")
        os.remove(newer_path)

        with open(page) as f:
            text = f.read()
        edited = re.sub(r"(\| `fixed_window` \| )([\d,]+)", lambda m: m.group(1) + "1" + m.group(2), text, count=1)
        if edited == text:
            failures.append("found no fixed_window row to edit on the page")
        with open(page, "w") as f:
            f.write(edited)
        check(page, results, False, "a figure edited by hand on the page")

        with open(page, "w") as f:
            f.write(text.replace(END, "", 1))
        check(page, results, False, "an end marker lost")

        with open(page, "w") as f:
            f.write(text)
        check(page, results, True, "the page restored")

        unnamed = os.path.join(results, "2099-01-01T000000Z-profile-unnamed.txt")
        with open(unnamed, "w") as f:
            f.write("a profile nobody wrote up\n")
        p = check(page, results, False, "a result file the history does not name")
        if p.returncode and "2099-01-01T000000Z-profile-unnamed.txt" not in p.stderr:
            failures.append("the error does not name the unlisted file")
        os.remove(unnamed)
    if failures:
        print("self-test FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    print("self-test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
