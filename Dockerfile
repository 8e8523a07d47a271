# ratelimiter: a rate-limit HTTP service, and Envoy's rate-limit service over gRPC when asked.
#
#   docker build --build-arg RATELIMITER_COMMIT=$(git rev-parse HEAD) -t ratelimiter .
#   docker run -p 8080:8080 -e RATELIMITER__REDIS__URL=redis://host:6379 ratelimiter
#   docker run -p 8080:8080 -p 8081:8081 -e RATELIMITER__GRPC__BIND=0.0.0.0:8081 ratelimiter
#
# Without RATELIMITER__REDIS__URL the container runs the embedded in-process store (limits are
# per container). CI does not build this image (no Docker engine runs there); it runs the same
# `cargo build --release --locked` as the builder stage below.
#
# TLS (docs/tls.md): mount the PEM files read-only and name them. The image's user must read
# them; --user with the files' owner settles that for files of the host:
#
#   docker run -p 8443:8443 -p 8081:8081 --user "$(id -u):$(id -g)" \
#     -v "$PWD/tls:/etc/ratelimiter/tls:ro" \
#     -e RATELIMITER__SERVER__BIND=0.0.0.0:8443 \
#     -e RATELIMITER__SERVER__TLS_CERT_FILE=/etc/ratelimiter/tls/tls.crt \
#     -e RATELIMITER__SERVER__TLS_KEY_FILE=/etc/ratelimiter/tls/tls.key \
#     -e RATELIMITER__GRPC__BIND=0.0.0.0:8081 \
#     -e RATELIMITER__GRPC__TLS_CERT_FILE=/etc/ratelimiter/tls/tls.crt \
#     -e RATELIMITER__GRPC__TLS_KEY_FILE=/etc/ratelimiter/tls/tls.key \
#     -e RATELIMITER__GRPC__TLS_CLIENT_CA_FILE=/etc/ratelimiter/tls/ca.crt \
#     -e RATELIMITER__REDIS__URL='rediss://:password@my-redis.example.com:6380' ratelimiter
#
# Mount the directory, not single files: a file bind-mounted alone stays the file of the start,
# so a renewal written as a new file renamed over the old (as most tools write) would not reach
# the container. The service polls the files every 2 s (or `docker kill -s HUP` at once).
# rediss:// to a managed Redis is verified against the system roots (ca-certificates, below)
# unless RATELIMITER__REDIS__TLS_CA_FILE names a CA. On Kubernetes see
# deploy/kubernetes/overlays/tls.

# ---- builder ----------------------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS builder
WORKDIR /app

# Dependencies first, in their own layer: it is rebuilt only when Cargo.toml or Cargo.lock
# change, not on every source edit. Stub sources stand in for the crate while they compile (every
# target Cargo.toml declares needs its file, benches included); the crate's own artifacts are then
# removed so that the real build below cannot reuse them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/limiter.rs \
    && cargo build --release --locked \
    && rm -rf src benches \
        target/release/ratelimiter* \
        target/release/libratelimiter* \
        target/release/deps/ratelimiter-* \
        target/release/deps/libratelimiter-* \
        target/release/.fingerprint/ratelimiter-*

# The crate embeds lua/*.lua with include_str!, so lua/ must be present before it compiles.
# build.rs records the git commit for `--version` and /healthz; .git is not copied, so the commit
# comes from this build argument (`unknown` when it is not given).
ARG RATELIMITER_COMMIT=unknown
COPY build.rs ./
COPY src ./src
COPY benches ./benches
COPY lua ./lua
COPY openapi ./openapi
# COPY keeps the files' own modification times, which may be older than the stub build; touch
# them so cargo never mistakes the stubs' output for an up-to-date build.
RUN touch build.rs src/main.rs src/lib.rs \
    && cargo build --release --locked \
    && cp target/release/ratelimiter /usr/local/bin/ratelimiter

# ---- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates: the system roots (/etc/ssl/certs) that verify a rediss:// server when
# redis.tls_ca_file is not set; debian:bookworm-slim has none, and the service would refuse to
# start ("no system root certificates found"). Nothing else is installed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system ratelimiter \
    && useradd --system --gid ratelimiter --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ratelimiter

COPY --from=builder /usr/local/bin/ratelimiter /usr/local/bin/ratelimiter

ENV RATELIMITER__SERVER__BIND=0.0.0.0:8080
# 8081: Envoy's rate-limit service, served only with RATELIMITER__GRPC__BIND set.
EXPOSE 8080 8081
USER ratelimiter:ratelimiter

# The health check needs no extra package: bash (present in debian:bookworm-slim) opens a TCP
# connection through /dev/tcp, sends a bare HTTP/1.0 request for /healthz and checks the status
# line. Installing curl instead would add libcurl and its TLS and protocol libraries (several MB
# and their security updates) to an image that otherwise holds a single binary. The port
# is taken from RATELIMITER__SERVER__BIND, so overriding the bind address keeps the check valid.
# bash speaks no TLS: with HTTPS on (RATELIMITER__SERVER__TLS_CERT_FILE set) the check only
# proves that the port accepts a connection. HTTPS set in a configuration file instead fails
# the check: replace it (--health-cmd) or drop it (--no-healthcheck). Kubernetes ignores
# HEALTHCHECK and uses the Deployment's probes (scheme: HTTPS in overlays/tls).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>\"/dev/tcp/127.0.0.1/${RATELIMITER__SERVER__BIND##*:}\" && { [ -n \"${RATELIMITER__SERVER__TLS_CERT_FILE:-}\" ] || { printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '; }; }"]

ENTRYPOINT ["/usr/local/bin/ratelimiter"]
