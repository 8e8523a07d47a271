#!/usr/bin/env python3
"""A standard-library web app that asks the rate limiter before answering each request.

Key: the X-Api-Key header when present, otherwise the client address. Denied requests get 429
with the service's RateLimit, RateLimit-Policy and Retry-After headers; allowed ones get 200
"hello" with the RateLimit headers.

Environment: RATELIMITER_URL (default http://127.0.0.1:8080), RATELIMITER_POLICY (an existing
policy, default "api"), HOST (default 127.0.0.1), PORT (default 8000; 0 picks a free port).
Prints "listening on http://HOST:PORT" once it accepts requests.
"""
import json
import os
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RATELIMITER_URL = os.environ.get("RATELIMITER_URL", "http://127.0.0.1:8080").rstrip("/")
POLICY = os.environ.get("RATELIMITER_POLICY", "api")
FORWARDED = ("RateLimit", "RateLimit-Policy", "Retry-After")


def acquire(key):
    """Returns (allowed, headers to forward). Raises on anything but a 200 decision."""
    body = json.dumps({"policy": POLICY, "key": key, "cost": 1}).encode()
    request = urllib.request.Request(RATELIMITER_URL + "/v1/acquire", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=2) as response:
        decision = json.loads(response.read())
        headers = {name: response.headers[name] for name in FORWARDED if response.headers[name]}
    return decision["allowed"], headers


class Handler(BaseHTTPRequestHandler):
    def handle_any(self):
        key = self.headers.get("X-Api-Key") or self.client_address[0]
        try:
            allowed, headers = acquire(key)
        except (OSError, ValueError, KeyError) as error:
            # Fail closed: a limiter we cannot ask admits nothing. (Serve instead to fail open.)
            self.log_error("rate limiter unavailable: %s", error)
            status, text, headers = 503, "rate limiter unavailable\n", {"Retry-After": "1"}
        else:
            status, text = (200, "hello\n") if allowed else (429, "too many requests\n")
        payload = text.encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any


def main():
    server = ThreadingHTTPServer((os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))), Handler)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port} (policy {POLICY!r} at {RATELIMITER_URL})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
