#!/usr/bin/env python3
"""Heap allocations per POST /v1/acquire, counted by valgrind's DHAT, for one binary or two side by side.

Each binary is started under `valgrind --tool=dhat` on the embedded store (no Redis), answers
exactly N acquires of one token-bucket policy over one keep-alive connection, and is stopped
with SIGTERM, after which DHAT prints the blocks and bytes the process allocated in all. Two
runs of different N (default 200 and 1,200) give the allocations of one acquire as the
difference divided by the difference of N, so start-up, policy creation and shutdown cancel
out. DHAT counts allocations, not time: the figures repeat from run to run whatever else the
machine is doing (a few blocks either way, from the background loop's ticks).

valgrind sees only the system allocator's calls, so the binaries must be built without
mimalloc: `cargo build --release --features system-allocator` (for an older version without
that feature, build it with the `#[global_allocator]` lines of `src/main.rs` removed).

    cargo build --release --features system-allocator
    python3 bench/allocs.py target/release/ratelimiter [BASELINE_BINARY]
"""

import argparse
import http.client
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

POLICY = {"name": "allocs", "algorithm": "token_bucket", "capacity": 1_000_000_000,
          "refill_tokens": 1_000_000_000, "refill_period_ms": 1_000}
TOTAL = re.compile(r"Total:\s+([\d,]+) bytes in ([\d,]+) blocks")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(conn, method, path, body=None):
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if payload else {}
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    response.read()
    return response.status


def run(binary, acquires):
    """(blocks, bytes) the process allocated while answering `acquires` acquires."""
    port = free_port()
    env = dict(os.environ, RUST_LOG="error", RATELIMITER__SERVER__BIND=f"127.0.0.1:{port}",
               RATELIMITER__SERVER__WORKERS="1")
    env.pop("RATELIMITER_CONFIG", None)
    env.pop("RATELIMITER__REDIS__URL", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dhat.out")
        child = subprocess.Popen(["valgrind", "--tool=dhat", f"--dhat-out-file={out}", binary],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    if request(conn, "GET", "/readyz") == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or child.poll() is not None:
                    sys.exit(f"{binary} did not become ready under valgrind")
                time.sleep(0.5)
            if request(conn, "PUT", "/v1/policies/allocs", POLICY) not in (200, 201):
                sys.exit("could not create the policy")
            body = {"policy": "allocs", "key": "k", "cost": 1}
            for _ in range(acquires):
                if request(conn, "POST", "/v1/acquire", body) != 200:
                    sys.exit("an acquire was not answered 200")
            conn.close()
        finally:
            child.send_signal(signal.SIGTERM)
            _, stderr = child.communicate(timeout=120)
    found = TOTAL.search(stderr)
    if not found:
        sys.exit(f"no DHAT total in valgrind's output:\n{stderr[-2000:]}")
    blocks, size = int(found.group(2).replace(",", "")), int(found.group(1).replace(",", ""))
    if blocks < 1_000:
        sys.exit(f"{binary} allocated {blocks} blocks in all: its allocator is not the system's "
                 "(build it with --features system-allocator)")
    return blocks, size


def per_acquire(binary, low, high):
    blocks_low, bytes_low = run(binary, low)
    blocks_high, bytes_high = run(binary, high)
    n = high - low
    return (blocks_high - blocks_low) / n, (bytes_high - bytes_low) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="the service binary (release build)")
    ap.add_argument("baseline", nargs="?", help="a second binary to count beside it")
    ap.add_argument("--low", type=int, default=200, help="acquires of the first run (default 200)")
    ap.add_argument("--high", type=int, default=1_200, help="acquires of the second run (default 1200)")
    opts = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind is needed: apt-get install valgrind")
    rows = [("binary", opts.binary)] + ([("baseline", opts.baseline)] if opts.baseline else [])
    print(f"heap allocations per POST /v1/acquire (embedded store; DHAT, runs of {opts.low} and "
          f"{opts.high} acquires)")
    for label, binary in rows:
        blocks, size = per_acquire(binary, opts.low, opts.high)
        print(f"{label:9} {blocks:7.2f} blocks {size:9.1f} bytes   {binary}")


if __name__ == "__main__":
    main()
