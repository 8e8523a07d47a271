#!/usr/bin/env python3
"""A do-nothing OTLP/HTTP receiver for the tracing benchmark: answers 200 to every
POST /v1/traces and counts the requests and bytes (printed on SIGINT/SIGTERM).

    python3 bench/otlp_sink.py 4318 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python3 bench/run.py --against OLD --no-build

It does not decode the spans (the tests do, tests/api/traces.rs): it only takes them off the
service as fast as a collector would, so that the figure is the service's cost of tracing.
"""
import http.server
import signal
import sys

requests = 0
received = 0


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global requests, received
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        requests += 1
        received += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def stop(*_):
    print(f"otlp_sink: {requests} exports, {received} bytes", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
