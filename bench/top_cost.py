#!/usr/bin/env python3
"""What the top offenders cost Redis (service::top, lua/top.lua): the fold script's time per call
and what one policy's summaries hold in Redis at their largest.

    python3 bench/top_cost.py                  # k = 128 and 1024, about 20 seconds
    python3 bench/top_cost.py --subjects 128 --minutes 5

It starts its own redis-server on a free loopback port and calls lua/top.lua as an instance's
fold does: once per fold, carrying k subjects per dimension (3 k in all), every subject new (a
flood of distinct subjects, the worst case: every entry evicts one), `--folds` folds per minute
(2 instances folding once a second: 120), for `--minutes` minutes (61: the longest window and the
minute in progress). It reports the script's usec_per_call (INFO commandstats), the commands it
runs inside per call, and MEMORY USAGE summed over the policy's keys. Nothing but that Redis is
touched; it is stopped at the end.
"""

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Resp:
    """Just enough RESP2 for this script."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self.read()

    def line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 16)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(1 << 16)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data.decode()
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")


def measure(port, subjects, folds, minutes, pool):
    r = Resp(port)
    r.call("FLUSHALL")
    r.call("CONFIG", "RESETSTAT")
    with open(os.path.join(ROOT, "lua", "top.lua"), "rb") as f:
        sha = r.call("SCRIPT", "LOAD", f.read())
    rng = random.Random(1)
    started = time.monotonic()
    calls = 0
    seq = 0
    for minute in range(29_000_000, 29_000_000 + minutes):
        keys = [f"rl:{{top/api}}:{minute}:{p}" for p in "danm"]
        for _ in range(folds):
            # The capacity, the TTL, then the fold's id (one instance, increasing numbers).
            seq += 1
            args = [subjects, 3720, "00000000000000b1", seq]
            for _ in range(3):
                args += [subjects, 0, subjects]
                for _ in range(subjects):
                    args += [f"user-{rng.randrange(pool or 10**9):09d}", 1]
            r.call("EVALSHA", sha, 4, *keys, *args)
            calls += 1
    elapsed = time.monotonic() - started
    stats = {}
    for line in r.call("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            stats[name] = dict(kv.split("=") for kv in fields.split(","))
    inner = sum(int(s["calls"]) for n, s in stats.items() if n not in ("evalsha", "script|load", "flushall",
                                                                       "config|resetstat", "info"))
    memory = 0
    cursor = "0"
    nkeys = 0
    while True:
        cursor, batch = r.call("SCAN", cursor, "MATCH", "rl:{top/api}:*", "COUNT", 1000)
        for k in batch:
            memory += r.call("MEMORY", "USAGE", k, "SAMPLES", 0)
            nkeys += 1
        if cursor == "0":
            break
    encoding = r.call("OBJECT", "ENCODING", f"rl:{{top/api}}:{29_000_000}:d")
    return {
        "subjects": subjects,
        "calls": calls,
        "usec_per_call": float(stats["evalsha"]["usec_per_call"]),
        "inner_commands_per_call": inner / calls,
        "wall_s": round(elapsed, 1),
        "keys": nkeys,
        "memory_bytes": memory,
        "zset_encoding": encoding,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subjects", default="128,1024", help="capacities k to measure (default 128,1024)")
    ap.add_argument("--folds", type=int, default=120, help="folds per minute (default 120: 2 instances, 1/s)")
    ap.add_argument("--minutes", type=int, default=61, help="minutes folded (default 61)")
    ap.add_argument("--pool", type=int, default=0,
                    help="draw subjects from this many (default 0: every subject new, the worst case)")
    opts = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server is missing: apt-get install -y redis-server")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="top-cost-")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                Resp(port).call("PING")
                break
            except OSError:
                time.sleep(0.05)
        for k in [int(x) for x in opts.subjects.split(",")]:
            m = measure(port, k, opts.folds, opts.minutes, opts.pool)
            drawn = f"of {opts.pool}" if opts.pool else "new"
            print(f"k={m['subjects']}: {m['calls']} folds of 3k subjects ({drawn}); {m['usec_per_call']:.0f} us per "
                  f"fold call in Redis, {m['inner_commands_per_call']:.0f} commands inside; {m['keys']} keys, "
                  f"{m['memory_bytes'] / 1e6:.2f} MB for one policy's {opts.minutes} minutes "
                  f"({m['zset_encoding']}); {m['wall_s']} s")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
