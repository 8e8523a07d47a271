#!/usr/bin/env python3
"""Runs the real binary as each rendered Deployment describes its container, and probes it there.

    pod_smoke.py BINARY RENDERED.yaml [RENDERED.yaml ...]

No cluster runs here, so this is the nearest thing to a pod: for each rendering (check.sh's
target/k8s-rendered/overlays-*.yaml) the service starts inside bubblewrap with

- the root filesystem read-only (readOnlyRootFilesystem), a network namespace of its own (so it
  binds the manifest's own 0.0.0.0:8080 and :8081 without meeting anything on this machine);
- the pod's runAsUser/runAsGroup, no capabilities at all, and no_new_privs
  (capabilities.drop ALL, allowPrivilegeEscalation false), checked in /proc/PID/status;
- exactly the container's environment, its secretKeyRef values taken from
  overlays/redis/example-secret.yaml; a Redis URL pointed at a private redis-server started
  here, inside the same namespace, with the example's password;

then checks what the manifests promise of it: the readiness and liveness probes' paths answer 200
on the ports they name, the ServiceMonitor's path serves Prometheus metrics on the port its
Service port targets, the gRPC port answers HTTP/2's preface, the tokens from the Secret guard the
APIs, an acquire is decided by the store the overlay chose (decided_by), and SIGTERM ends the
process with status 0 inside the grace period left after the preStop pause.

Not emulated: the seccomp RuntimeDefault profile, the CPU and memory limits (cgroups), the
image's own file system (the binary is this machine's build).
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE_SECRETS = HERE / "overlays/redis/example-secret.yaml"
IMAGE_ENV = {
    # The image's own environment (Dockerfile ENV and debian:bookworm-slim's PATH).
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "RATELIMITER__SERVER__BIND": "0.0.0.0:8080",
}
REDIS_PORT = 16379


class SmokeError(Exception):
    pass


def objects(path):
    return [o for o in yaml.safe_load_all(pathlib.Path(path).read_text()) if o]


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    if len(found) != 1:
        raise SmokeError(f"expected one {kind}, found {len(found)}")
    return found[0]


def secrets():
    return {s["metadata"]["name"]: s.get("stringData", {}) for s in objects(EXAMPLE_SECRETS)}


def http(method, url, body=None, token=None, timeout=3):
    request = urllib.request.Request(url, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def inside(binary, rendered):
    """In the sandbox (root, own network and read-only root): one rendering's pod."""
    objs = objects(rendered)
    deployment = one(objs, "Deployment")
    service = one(objs, "Service")
    monitor = one(objs, "ServiceMonitor")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    values = secrets()
    redis = None

    env = dict(IMAGE_ENV)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        value = values.get(ref["name"], {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                continue
            raise SmokeError(f"env {item['name']}: the example Secrets have no {ref['name']}/{ref['key']}")
        if item["name"] == "RATELIMITER__REDIS__URL":
            match = re.fullmatch(r"redis://:([^@]*)@[^/]+(/\d+)?", value)
            if not match:
                raise SmokeError(f"the example Redis URL is not redis://:PASSWORD@HOST:PORT/DB: {value}")
            redis = subprocess.Popen(
                ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--requirepass", match.group(1), "--dir", "/"],
                stdout=subprocess.DEVNULL)
            value = f"redis://:{match.group(1)}@127.0.0.1:{REDIS_PORT}{match.group(2) or ''}"
            # The service refuses to start on a Redis it cannot reach: wait for this one first.
            deadline = time.monotonic() + 10
            while subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "--no-auth-warning",
                                  "-a", match.group(1), "ping"],
                                 capture_output=True, text=True).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    redis.kill()
                    raise SmokeError("the private redis-server did not answer PING")
                time.sleep(0.1)
        env[item["name"]] = value
    want_store = "redis" if "RATELIMITER__REDIS__URL" in env else "embedded"

    user = pod["securityContext"]["runAsUser"]
    group = pod["securityContext"]["runAsGroup"]
    # The kubelet's own check: it refuses to start a runAsNonRoot container as uid 0, and cannot
    # prove a named image user (this image's `USER ratelimiter`) non-root without a runAsUser.
    if pod["securityContext"].get("runAsNonRoot") is not True or not isinstance(user, int) or user == 0:
        raise SmokeError(f"runAsNonRoot with runAsUser {user!r}: the kubelet would not start it as non-root")
    drop = container["securityContext"]["capabilities"]["drop"]
    if drop != ["ALL"] or container["securityContext"]["allowPrivilegeEscalation"] is not False:
        raise SmokeError("the container does not drop ALL capabilities with allowPrivilegeEscalation false")
    command = ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups",
               "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", binary]
    log = open("/dev/shm/ratelimiter.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def url(port_name, path):
        return f"http://127.0.0.1:{ports[port_name]}{path}"

    try:
        readiness = container["readinessProbe"]["httpGet"]
        started = time.monotonic()
        deadline = started + 30
        while True:
            if process.poll() is not None:
                raise SmokeError(f"the service exited with status {process.returncode} before it was ready")
            try:
                status, body = http("GET", url(readiness["port"], readiness["path"]))
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SmokeError(f"readinessProbe {readiness['path']} not 200 within 30 s")
            time.sleep(0.2)
        checks = [f"readinessProbe GET {readiness['path']} on port {readiness['port']}: 200, "
                  f"{time.monotonic() - started:.1f} s after the start"]

        liveness = container["livenessProbe"]["httpGet"]
        status, _ = http("GET", url(liveness["port"], liveness["path"]))
        if status != 200:
            raise SmokeError(f"livenessProbe {liveness['path']} answered {status}")
        checks.append(f"livenessProbe GET {liveness['path']} on port {liveness['port']}: 200")

        (endpoint,) = monitor["spec"]["endpoints"]
        (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        status, body = http("GET", url(service_port["targetPort"], endpoint["path"]))
        if status != 200 or "# TYPE ratelimiter_" not in body:
            raise SmokeError(f"ServiceMonitor path {endpoint['path']} answered {status} without ratelimiter metrics")
        checks.append(f"ServiceMonitor GET {endpoint['path']} via Service port {endpoint['port']} "
                      f"-> {service_port['targetPort']}: Prometheus text")

        # HTTP/2 without TLS, as gRPC speaks it: the client's preface and an empty SETTINGS frame;
        # a gRPC server answers with a SETTINGS frame of its own (frame type 4, stream 0).
        with socket.create_connection(("127.0.0.1", ports["grpc"]), timeout=3) as connection:
            connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            frame = b""
            while len(frame) < 9:
                chunk = connection.recv(9 - len(frame))
                if not chunk:
                    break
                frame += chunk
        if len(frame) < 9 or frame[3] != 4 or frame[5:9] != bytes(4):
            raise SmokeError(f"the gRPC port answered the HTTP/2 preface with {frame!r}, not SETTINGS")
        checks.append(f"gRPC port {ports['grpc']} speaks HTTP/2 (SETTINGS answered to the preface)")

        admin = env.get("RATELIMITER__AUTH__ADMIN_TOKENS")
        client = env.get("RATELIMITER__AUTH__CLIENT_TOKENS")
        policy = {"name": "pod-smoke", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000}
        if admin:
            status, _ = http("POST", url("http", "/v1/policies"), policy)
            if status != 401:
                raise SmokeError(f"a policy write without the admin token from the Secret answered {status}")
        status, body = http("POST", url("http", "/v1/policies"), policy, token=admin)
        if status != 201:
            raise SmokeError(f"creating a policy answered {status}: {body}")
        if client:
            status, _ = http("POST", url("http", "/v1/acquire"), {"policy": "pod-smoke", "key": "k"})
            if status != 401:
                raise SmokeError(f"an acquire without the client token from the Secret answered {status}")
        status, body = http("POST", url("http", "/v1/acquire"), {"policy": "pod-smoke", "key": "k"}, token=client)
        decision = json.loads(body) if status == 200 else {}
        if decision.get("allowed") is not True or decision.get("decided_by") != want_store:
            raise SmokeError(f"an acquire answered {status} {body}, not allowed by {want_store}")
        checks.append(f"tokens from the Secret guard the APIs ({'set' if admin and client else 'unset'}); "
                      f"an acquire is decided by {want_store}")

        with open(f"/proc/{process.pid}/status") as status_file:
            fields = dict(line.split(":", 1) for line in status_file)
        uid = fields["Uid"].split()[0]
        if (uid, fields["CapEff"].strip(), fields["NoNewPrivs"].strip()) != (str(user), "0000000000000000", "1"):
            raise SmokeError(f"the process runs with Uid {uid}, CapEff {fields['CapEff'].strip()}, "
                             f"NoNewPrivs {fields['NoNewPrivs'].strip()}")
        checks.append(f"runs as uid {uid}, no capabilities, no_new_privs, on a read-only root")

        grace = pod["terminationGracePeriodSeconds"]
        pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=grace - pause)
        except subprocess.TimeoutExpired:
            raise SmokeError(f"SIGTERM did not end the process within {grace - pause} s") from None
        if code != 0:
            raise SmokeError(f"SIGTERM ended the process with status {code}")
        checks.append(f"SIGTERM: exit 0 after {time.monotonic() - started:.1f} s "
                      f"(grace {grace} s less the {pause} s preStop pause)")
        for line in checks:
            print(f"    {line}")
    except (SmokeError, OSError, KeyError, ValueError) as error:
        print(f"pod_smoke.py: {rendered}: {error}", file=sys.stderr)
        log.flush()
        print("--- the service's log:", file=sys.stderr)
        print(pathlib.Path("/dev/shm/ratelimiter.log").read_text()[-4000:], file=sys.stderr)
        return 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if redis is not None:
            redis.terminate()
            redis.wait()
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--inside":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        try:
            return inside(sys.argv[2], sys.argv[3])
        except SmokeError as error:
            print(f"pod_smoke.py: {sys.argv[3]}: {error}", file=sys.stderr)
            return 1
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary = os.path.abspath(sys.argv[1])
    if not os.access(binary, os.X_OK):
        print(f"pod_smoke.py: {binary} not found: build it with 'cargo build --release'", file=sys.stderr)
        return 1
    for tool, package in (("bwrap", "bubblewrap"), ("setpriv", "util-linux"), ("ip", "iproute2"),
                          ("redis-server", "redis-server"), ("redis-cli", "redis-server")):
        if shutil.which(tool) is None:
            print(f"pod_smoke.py: {tool} not found: apt-get install -y {package}", file=sys.stderr)
            return 1
    failed = 0
    for rendered in sys.argv[2:]:
        print(f"==> {rendered}: the binary as its Deployment runs it")
        # A new mount namespace whose root is this one, read-only; /proc, /dev (with /dev/shm for
        # the service's log, outside what the service may write) and a network namespace of its own.
        sandbox = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                   "--tmpfs", "/dev/shm", "--unshare-net", "--unshare-pid", "--die-with-parent",
                   "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                   sys.executable, os.path.abspath(__file__), "--inside", binary, os.path.abspath(rendered)]
        failed |= subprocess.run(sandbox).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
