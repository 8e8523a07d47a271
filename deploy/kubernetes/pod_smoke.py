#!/usr/bin/env python3
"""Runs the real binary as each rendered Deployment describes its container, and probes it there.

    pod_smoke.py BINARY RENDERED.yaml[=SECRETS.yaml] [RENDERED.yaml[=SECRETS.yaml] ...]

No cluster runs here, so this is the nearest thing to a pod: for each rendering (check.sh's
target/k8s-rendered/overlays-*.yaml) the service starts inside bubblewrap with

- the root filesystem read-only (readOnlyRootFilesystem), a network namespace of its own (so it
  binds the manifest's own 0.0.0.0:8080 and :8081 without meeting anything on this machine);
- the pod's runAsUser/runAsGroup, no capabilities at all, and no_new_privs
  (capabilities.drop ALL, allowPrivilegeEscalation false), checked in /proc/PID/status;
- exactly the container's environment, its secretKeyRef values taken from the rendering's
  example Secrets (SECRETS.yaml; overlays/redis/example-secret.yaml when not given); a Redis URL
  pointed at a private redis-server started here, inside the same namespace, with the example's
  password, on --tls-port with a certificate of its own for a rediss:// URL;
- each Secret volume at its mountPath, read-only, laid out as the kubelet writes one (the keys
  are symlinks to ..data/<key>, ..data a symlink to a timestamped directory), owned by root and
  the pod's fsGroup with the volume's defaultMode; a kubernetes.io/tls Secret's placeholders
  replaced by a CA (ca.crt) and a certificate signed by it (tls.crt, tls.key) made with openssl,
  which also signs the Redis server's certificate and a client certificate for gRPC;

then checks what the manifests promise of it: the readiness and liveness probes' paths answer 200
on the ports they name, with the scheme they name (and, for HTTPS, plain HTTP does not), the
ServiceMonitor's path serves Prometheus metrics on the port its Service port targets (over HTTPS
verified as its tlsConfig says: the CA of the Secret it names, its serverName), the gRPC port
answers HTTP/2's preface (over mutual TLS when it requires client certificates: openssl s_client
with ALPN h2 and the client certificate succeeds, without one or with a stranger's it is
refused), the tokens from the Secret guard the APIs, an acquire is decided by the store the
overlay chose (decided_by), a renewal of a mounted TLS Secret the way the kubelet makes it (a
new timestamped directory, ..data swapped by a rename) is served on both listeners without a
restart, and SIGTERM ends the process with status 0 inside the grace period left after the
preStop pause.

Not emulated: the seccomp RuntimeDefault profile, the CPU and memory limits (cgroups), the
image's own file system (the binary is this machine's build).
"""

import datetime
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import tempfile

import yaml

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE_SECRETS = HERE / "overlays/redis/example-secret.yaml"
IMAGE_ENV = {
    # The image's own environment (Dockerfile ENV and debian:bookworm-slim's PATH).
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "RATELIMITER__SERVER__BIND": "0.0.0.0:8080",
}
REDIS_PORT = 16379
# Inside the sandbox's own network namespace (nothing else listens there).
REDIS_TLS_PORT = 16380
SHM = pathlib.Path("/dev/shm")


class SmokeError(Exception):
    pass


class ProbeError(SmokeError):
    """A probe that got no HTTP answer (refused, or another scheme than the listener's)."""


def objects(path):
    return [o for o in yaml.safe_load_all(pathlib.Path(path).read_text()) if o]


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    if len(found) != 1:
        raise SmokeError(f"expected one {kind}, found {len(found)}")
    return found[0]


def secrets(path):
    return {s["metadata"]["name"]: s for s in objects(path)}


class PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1, verifying the certificate for `server_name` (as Prometheus does with
    a tlsConfig serverName: it scrapes pod IPs)."""

    def __init__(self, port, context, server_name, timeout):
        super().__init__("127.0.0.1", port, context=context, timeout=timeout)
        self.server_name = server_name

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.server_name)


def request(method, port, path, body=None, token=None, tls=None, timeout=3):
    """One request to 127.0.0.1:port; `tls` is None (plain HTTP) or (ssl context, server name)."""
    if tls is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        connection = PinnedHTTPS(port, tls[0], tls[1], timeout)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SmokeError(f"{' '.join(map(str, command))} failed: {done.stderr.strip()[-400:]}")
    return done.stdout


class Pki:
    """A CA and the certificates signed by it, made with openssl in /dev/shm/pki."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca("ca")

    def path(self, name, kind):
        return self.dir / f"{name}.{kind}"

    def ca(self, name):
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", self.path(name, "key"), "-out", self.path(name, "crt"), "-days", "2",
             "-subj", f"/CN=pod-smoke {name}"])

    def issue(self, name, dns=(), ips=(), ca="ca"):
        """A leaf certificate for server and client use, named `name`, signed by `ca`."""
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        extensions = self.path(name, "ext")
        extensions.write_text("basicConstraints=critical,CA:FALSE\n"
                              "extendedKeyUsage=serverAuth,clientAuth\n"
                              + (f"subjectAltName={','.join(sans)}\n" if sans else ""))
        request = run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                       "-keyout", self.path(name, "key"), "-subj", f"/CN=pod-smoke {name}"])
        run(["openssl", "x509", "-req", "-CA", self.path(ca, "crt"), "-CAkey", self.path(ca, "key"),
             "-set_serial", "0x" + os.urandom(8).hex(), "-days", "2", "-extfile", extensions,
             "-out", self.path(name, "crt")], input=request)
        return self.path(name, "crt"), self.path(name, "key")


def fingerprint(pem):
    """The SHA-256 fingerprint of the first PEM certificate in `pem` (text around it ignored)."""
    text = pem if isinstance(pem, str) else pem.decode("ascii", errors="replace")
    return run(["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=text).strip()


def s_client(command, timeout=10):
    """openssl s_client with nothing to send: its status and its output as text (the server's
    own bytes, HTTP/2 frames on the gRPC port, made printable)."""
    done = subprocess.run(command, input=b"", capture_output=True, timeout=timeout)
    return done.returncode, (done.stdout + done.stderr).decode("ascii", errors="replace")


class SecretVolume:
    """A Secret volume as the kubelet writes it (its AtomicWriter): each key a symlink to
    ..data/<key>, ..data a symlink to a timestamped directory holding the files. `update`
    writes a new timestamped directory, points ..data_tmp at it and renames that over ..data
    (one atomic step), then removes the old directory, as a Secret's update does."""

    def __init__(self, directory, files, mode, group):
        self.dir = pathlib.Path(directory)
        self.mode, self.group = mode, group
        self.dir.mkdir(parents=True)
        os.chmod(self.dir, 0o755)
        self.current = self.write(files)
        os.symlink(self.current, self.dir / "..data")
        for key in files:
            os.symlink(f"..data/{key}", self.dir / key)

    def write(self, files):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S.%f")
        target = self.dir / stamp
        target.mkdir()
        os.chmod(target, 0o755)
        for key, content in files.items():
            path = target / key
            path.write_bytes(content)
            os.chown(path, 0, self.group)
            os.chmod(path, self.mode)
        return stamp

    def update(self, files):
        if set(files) != {p.name for p in (self.dir / "..data").iterdir()}:
            raise SmokeError("a Secret update with other keys than the volume's")
        old, self.current = self.current, self.write(files)
        os.symlink(self.current, self.dir / "..data_tmp")
        os.rename(self.dir / "..data_tmp", self.dir / "..data")
        shutil.rmtree(self.dir / old)


def mount_read_only(source, target):
    """Binds `source` read-only at `target` on the read-only root, as the kubelet mounts a
    volume: a missing mount point is made by an overlay of its nearest existing ancestor with a
    layer holding just the missing directories (an overlay of lower layers only is read-only)."""
    target = pathlib.Path(target)
    ancestor = target
    while not ancestor.exists():
        ancestor = ancestor.parent
    if ancestor != target:
        if ancestor == pathlib.Path("/"):
            raise SmokeError(f"mountPath {target}: no existing directory but / above it")
        layer = pathlib.Path(tempfile.mkdtemp(dir=SHM))
        missing = layer / target.relative_to(ancestor)
        missing.mkdir(parents=True)
        os.chmod(layer, os.stat(ancestor).st_mode & 0o7777)
        directory = missing
        while directory != layer:
            os.chmod(directory, 0o755)
            directory = directory.parent
        run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={layer}:{ancestor}", str(ancestor)])
    run(["mount", "--bind", "-o", "ro", str(source), str(target)])


def start_redis(url, pki):
    """A private redis-server for the example URL (TLS for rediss://); returns it and the URL
    that reaches it."""
    match = re.fullmatch(r"(rediss?)://:([^@]*)@([^/:]+):\d+(/\d+)?", url)
    if not match:
        raise SmokeError(f"the example Redis URL is not redis[s]://:PASSWORD@HOST:PORT/DB: {url}")
    scheme, password, host, db = match.groups()
    command = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--requirepass", password, "--dir", "/"]
    ping = ["redis-cli", "--no-auth-warning", "-a", password]
    if scheme == "rediss":
        if pki is None:
            raise SmokeError("a rediss:// URL, but no kubernetes.io/tls Secret is mounted to verify Redis with")
        # Its certificate names the example's host and 127.0.0.1 (where the URL now points), and is
        # signed by the CA the pod's ca.crt holds; no client certificate is asked for.
        cert, key = pki.issue("redis", dns=[host], ips=["127.0.0.1"])
        port = REDIS_TLS_PORT
        command += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key), "--tls-ca-cert-file", str(pki.path("ca", "crt")),
                    "--tls-auth-clients", "no"]
        ping += ["--tls", "--cacert", str(pki.path("ca", "crt"))]
    else:
        port = REDIS_PORT
        command += ["--port", str(port)]
    redis = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    ping += ["-p", str(port), "ping"]
    # The service refuses to start on a Redis it cannot reach: wait for this one first.
    deadline = time.monotonic() + 10
    while subprocess.run(ping, capture_output=True, text=True).stdout.strip() != "PONG":
        if time.monotonic() > deadline:
            redis.kill()
            raise SmokeError(f"the private redis-server ({scheme}) did not answer PING")
        time.sleep(0.1)
    return redis, f"{scheme}://:{password}@127.0.0.1:{port}{db or ''}"


def served_fingerprint(port, server_name, pki, client=False):
    """The SHA-256 fingerprint of the certificate served on port, read with openssl s_client."""
    command = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", server_name,
               "-CAfile", str(pki.path("ca", "crt")), "-verify_return_error"]
    if client:
        command += ["-alpn", "h2", "-cert", str(pki.path("client", "crt")), "-key", str(pki.path("client", "key"))]
    status, text = s_client(command)
    if status != 0:
        raise SmokeError(f"openssl s_client to port {port} failed: {text.strip()[-400:]}")
    return fingerprint(text)


def grpc_mutual_tls(port, server_name, pki):
    """What mutual TLS on the gRPC port promises, checked with openssl s_client and Python's ssl."""
    checks = []
    ca = str(pki.path("ca", "crt"))
    base = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", server_name,
            "-alpn", "h2", "-CAfile", ca, "-verify_return_error"]
    status, text = s_client(base + ["-cert", str(pki.path("client", "crt")), "-key", str(pki.path("client", "key"))])
    if status != 0 or "ALPN protocol: h2" not in text or "Verify return code: 0 (ok)" not in text:
        raise SmokeError(f"openssl s_client -alpn h2 with the client certificate: status {status}: "
                         f"{text.strip()[-600:]}")
    checks.append(f"gRPC port {port}: openssl s_client -alpn h2 with a client certificate of ca.crt: "
                  "handshake, ALPN h2, server verified for its serverName")
    # Without a certificate (or with a stranger's) TLS 1.3 finishes the client's side of the
    # handshake first: -ign_eof keeps reading until the server's alert ends the connection.
    for label, extra in (("without a client certificate", []),
                         ("with a certificate of another CA",
                          ["-cert", str(pki.path("stranger", "crt")), "-key", str(pki.path("stranger", "key"))])):
        try:
            status, text = s_client(base + extra + ["-ign_eof"])
        except subprocess.TimeoutExpired:
            raise SmokeError(f"gRPC port {port} kept a connection {label} open for 10 s") from None
        if status == 0 or "alert" not in text:
            raise SmokeError(f"openssl s_client {label}: status {status}, no alert: {text.strip()[-600:]}")
        alert = re.search(r"alert ([a-z ]+)", text)
        checks.append(f"gRPC port {port} {label}: refused (tls alert {alert.group(1).strip() if alert else '?'})")
    # HTTP/2 over that mutual TLS: the preface answered by SETTINGS.
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(pki.path("client", "crt"), pki.path("client", "key"))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=3) as raw:
        with context.wrap_socket(raw, server_hostname=server_name) as connection:
            frame = h2_settings(connection)
    if frame is None:
        raise SmokeError("the gRPC port did not answer the HTTP/2 preface with SETTINGS over mutual TLS")
    checks.append(f"gRPC port {port} speaks HTTP/2 over that mutual TLS (SETTINGS answered to the preface)")
    return checks


def h2_settings(connection):
    """Sends HTTP/2's client preface and an empty SETTINGS frame; the server's first frame if it
    is SETTINGS (frame type 4, stream 0), else None."""
    connection.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    frame = b""
    while len(frame) < 9:
        chunk = connection.recv(9 - len(frame))
        if not chunk:
            break
        frame += chunk
    return frame if len(frame) == 9 and frame[3] == 4 and frame[5:9] == bytes(4) else None


def inside(binary, rendered, secrets_file):
    """In the sandbox (root, own network and read-only root): one rendering's pod."""
    objs = objects(rendered)
    deployment = one(objs, "Deployment")
    service = one(objs, "Service")
    monitor = one(objs, "ServiceMonitor")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    examples = secrets(secrets_file)
    values = {name: secret.get("stringData", {}) for name, secret in examples.items()}
    (endpoint,) = monitor["spec"]["endpoints"]
    # The certificate names the Service, as the tls overlay asks of tls.crt (its short name, and
    # the namespaced ones); the ServiceMonitor's serverName must be one of them, and the gRPC
    # checks send the short name as SNI, as Envoy in the same namespace would.
    server_name = service["metadata"]["name"]
    server_names = [server_name, f"{server_name}.default.svc", f"{server_name}.default.svc.cluster.local", "localhost"]
    redis = None
    pki = None
    verified = None
    volumes = {}
    checks = []

    # --- Secret volumes, as the kubelet mounts them -------------------------------------------
    pod_volumes = {v["name"]: v for v in pod.get("volumes", [])}
    fs_group = pod["securityContext"].get("fsGroup")
    for mount in container.get("volumeMounts", []):
        volume = pod_volumes[mount["name"]]
        if "secret" not in volume:
            raise SmokeError(f"volume {mount['name']}: only Secret volumes are emulated")
        name = volume["secret"]["secretName"]
        secret = examples.get(name)
        if secret is None:
            raise SmokeError(f"volume {mount['name']}: the example Secrets have no {name}")
        files = {k: v.encode() for k, v in secret.get("stringData", {}).items()}
        if secret.get("type") == "kubernetes.io/tls":
            if pki is None:
                pki = Pki(SHM / "pki")
            cert, key = pki.issue("server", dns=server_names, ips=["127.0.0.1"])
            files = {"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes(),
                     "ca.crt": pki.path("ca", "crt").read_bytes()}
            if set(secret.get("stringData", {})) != set(files):
                raise SmokeError(f"the example Secret {name} has keys {sorted(secret.get('stringData', {}))}, "
                                 "not tls.crt, tls.key and ca.crt")
        # The kubelet's modes: defaultMode (0644 when unset); with an fsGroup the files are that
        # group's and readable by it.
        mode = volume["secret"].get("defaultMode", 0o644)
        file_group = 0
        if fs_group is not None:
            mode, file_group = mode | 0o440, fs_group
        volumes[name] = SecretVolume(SHM / "volumes" / mount["name"], files, mode, file_group)
        mount_read_only(volumes[name].dir, mount["mountPath"])
        checks.append(f"Secret {name} mounted read-only at {mount['mountPath']} as the kubelet lays it out "
                      f"(mode {mode:04o}, group {file_group})")

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
            redis, value = start_redis(value, pki)
        env[item["name"]] = value
    want_store = "redis" if "RATELIMITER__REDIS__URL" in env else "embedded"
    if env.get("RATELIMITER__REDIS__TLS_CA_FILE") and not env.get("RATELIMITER__REDIS__URL", "").startswith("rediss://"):
        raise SmokeError("RATELIMITER__REDIS__TLS_CA_FILE is set but the example Redis URL is not rediss://")
    https = bool(env.get("RATELIMITER__SERVER__TLS_CERT_FILE"))
    grpc_tls = bool(env.get("RATELIMITER__GRPC__TLS_CERT_FILE"))
    if (https or grpc_tls) and pki is None:
        raise SmokeError("the listeners serve TLS, but no kubernetes.io/tls Secret is mounted")
    if pki is not None:
        # The client of mutual TLS (Envoy's part), and one a CA the pod does not trust signed.
        pki.issue("client", dns=["envoy"])
        pki.ca("stranger-ca")
        pki.issue("stranger", dns=["envoy"], ca="stranger-ca")
        # The service verifies: a context trusting ca.crt, for the name the ServiceMonitor names.
        verified = (ssl.create_default_context(cafile=str(pki.path("ca", "crt"))), server_name)
    api_tls = verified if https else None
    # The kubelet's HTTPS probe verifies no certificate (and, to a pod IP, sends no SNI).
    unverified = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE

    user = pod["securityContext"]["runAsUser"]
    group = pod["securityContext"]["runAsGroup"]
    # The kubelet's own check: it refuses to start a runAsNonRoot container as uid 0, and cannot
    # prove a named image user (this image's `USER ratelimiter`) non-root without a runAsUser.
    if pod["securityContext"].get("runAsNonRoot") is not True or not isinstance(user, int) or user == 0:
        raise SmokeError(f"runAsNonRoot with runAsUser {user!r}: the kubelet would not start it as non-root")
    drop = container["securityContext"]["capabilities"]["drop"]
    if drop != ["ALL"] or container["securityContext"]["allowPrivilegeEscalation"] is not False:
        raise SmokeError("the container does not drop ALL capabilities with allowPrivilegeEscalation false")
    # The pod's supplementary groups: its fsGroup (the kubelet adds it), nothing else.
    groups = [f"--groups={fs_group}"] if fs_group is not None else ["--clear-groups"]
    command = ["setpriv", f"--reuid={user}", f"--regid={group}", *groups,
               "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", binary]
    log = open(SHM / "ratelimiter.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def probe_get(probe):
        get = container[probe]["httpGet"]
        scheme = get.get("scheme", "HTTP")
        tls = (unverified, None) if scheme == "HTTPS" else None
        try:
            return get, scheme, request("GET", ports[get["port"]], get["path"], tls=tls)
        except (OSError, http.client.HTTPException) as error:
            raise ProbeError(f"{probe} {scheme} GET {get['path']} on port {get['port']}: "
                             f"no HTTP answer ({type(error).__name__}: {error!r:.80})") from None

    try:
        started = time.monotonic()
        deadline = started + 30
        while True:
            if process.poll() is not None:
                raise SmokeError(f"the service exited with status {process.returncode} before it was ready")
            try:
                readiness, scheme, (status, body) = probe_get("readinessProbe")
                if status == 200:
                    break
                last = f"answered {status}"
            except ProbeError as error:
                last = str(error)
            if time.monotonic() > deadline:
                raise SmokeError(f"readinessProbe not 200 within 30 s: {last}")
            time.sleep(0.2)
        checks.append(f"readinessProbe {scheme} GET {readiness['path']} on port {readiness['port']}: 200, "
                      f"{time.monotonic() - started:.1f} s after the start")

        liveness, scheme, (status, _) = probe_get("livenessProbe")
        if status != 200:
            raise SmokeError(f"livenessProbe {liveness['path']} answered {status}")
        checks.append(f"livenessProbe {scheme} GET {liveness['path']} on port {liveness['port']}: 200")
        if https:
            try:
                status, _ = request("GET", ports["http"], "/healthz")
                raise SmokeError(f"plain HTTP to the HTTPS listener answered {status}")
            except (OSError, http.client.HTTPException):
                checks.append("plain HTTP to the HTTPS listener: no answer")

        (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        scrape_tls = None
        if endpoint.get("scheme", "http") == "https":
            config = endpoint["tlsConfig"]
            ca_ref = (config.get("ca") or {}).get("secret")
            if ca_ref is None or ca_ref["name"] not in volumes:
                raise SmokeError(f"the ServiceMonitor's tlsConfig CA {config.get('ca')!r} is not a mounted Secret's")
            ca_file = volumes[ca_ref["name"]].dir / ca_ref["key"]
            scrape_tls = (ssl.create_default_context(cafile=str(ca_file)), config["serverName"])
        status, body = request("GET", ports[service_port["targetPort"]], endpoint["path"], tls=scrape_tls)
        if status != 200 or "# TYPE ratelimiter_" not in body:
            raise SmokeError(f"ServiceMonitor path {endpoint['path']} answered {status} without ratelimiter metrics")
        checks.append(f"ServiceMonitor {endpoint.get('scheme', 'http')} GET {endpoint['path']} via Service port "
                      f"{endpoint['port']} -> {service_port['targetPort']}: Prometheus text"
                      + (f" (verified with {ca_ref['name']}/{ca_ref['key']} for {scrape_tls[1]})" if scrape_tls else ""))

        if grpc_tls:
            if not env.get("RATELIMITER__GRPC__TLS_CLIENT_CA_FILE"):
                raise SmokeError("gRPC over TLS without a client CA: these checks expect mutual TLS")
            checks += grpc_mutual_tls(ports["grpc"], server_name, pki)
        else:
            # HTTP/2 without TLS, as gRPC speaks it.
            with socket.create_connection(("127.0.0.1", ports["grpc"]), timeout=3) as connection:
                if h2_settings(connection) is None:
                    raise SmokeError("the gRPC port did not answer the HTTP/2 preface with SETTINGS")
            checks.append(f"gRPC port {ports['grpc']} speaks HTTP/2 (SETTINGS answered to the preface)")

        admin = env.get("RATELIMITER__AUTH__ADMIN_TOKENS")
        client = env.get("RATELIMITER__AUTH__CLIENT_TOKENS")
        policy = {"name": "pod-smoke", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000}
        http_port = ports["http"]
        if admin:
            status, _ = request("POST", http_port, "/v1/policies", policy, tls=api_tls)
            if status != 401:
                raise SmokeError(f"a policy write without the admin token from the Secret answered {status}")
        status, body = request("POST", http_port, "/v1/policies", policy, token=admin, tls=api_tls)
        if status != 201:
            raise SmokeError(f"creating a policy answered {status}: {body}")
        if client:
            status, _ = request("POST", http_port, "/v1/acquire", {"policy": "pod-smoke", "key": "k"}, tls=api_tls)
            if status != 401:
                raise SmokeError(f"an acquire without the client token from the Secret answered {status}")
        status, body = request("POST", http_port, "/v1/acquire", {"policy": "pod-smoke", "key": "k"},
                               token=client, tls=api_tls)
        decision = json.loads(body) if status == 200 else {}
        if decision.get("allowed") is not True or decision.get("decided_by") != want_store:
            raise SmokeError(f"an acquire answered {status} {body}, not allowed by {want_store}")
        checks.append(f"tokens from the Secret guard the APIs ({'set' if admin and client else 'unset'}); "
                      f"an acquire is decided by {want_store}"
                      + (f" over {env['RATELIMITER__REDIS__URL'].split(':', 1)[0]}://" if want_store == "redis" else ""))

        # --- A renewal, as the kubelet delivers a Secret's update -----------------------------
        tls_volumes = [v for v in volumes.values() if (v.dir / "tls.crt").exists()]
        if tls_volumes and (https or grpc_tls):
            (volume,) = tls_volumes
            old = fingerprint((volume.dir / "tls.crt").read_text())
            listeners = ([("http", ports["http"], False)] if https else []) + \
                        ([("grpc", ports["grpc"], True)] if grpc_tls else [])
            for listener, port, mutual in listeners:
                if served_fingerprint(port, server_name, pki, client=mutual) != old:
                    raise SmokeError(f"the {listener} listener does not serve the mounted tls.crt")
            cert, key = pki.issue("server-renewed", dns=server_names, ips=["127.0.0.1"])
            new = fingerprint(cert.read_text())
            if new == old:
                raise SmokeError("the renewed certificate has the old one's fingerprint")
            volume.update({"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes(),
                           "ca.crt": pki.path("ca", "crt").read_bytes()})
            swapped = time.monotonic()
            for listener, port, mutual in listeners:
                while served_fingerprint(port, server_name, pki, client=mutual) != new:
                    if time.monotonic() - swapped > 10:
                        raise SmokeError(f"the {listener} listener still serves the old certificate "
                                         "10 s after the kubelet-style ..data swap")
                    time.sleep(0.2)
            status, body = request("GET", ports[service_port["targetPort"]], endpoint["path"], tls=scrape_tls)
            failures = re.findall(r"^ratelimiter_tls_reload_failures_total\{[^}]*\} (\S+)$", body, re.M)
            if status != 200 or any(float(f) != 0 for f in failures):
                raise SmokeError(f"after the renewal /metrics answered {status}, reload failures {failures}")
            checks.append(f"a renewal by the kubelet's ..data swap is served on {' and '.join(l for l, _, _ in listeners)} "
                          f"{time.monotonic() - swapped:.1f} s later, no reload failure, same process")

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
    except (SmokeError, OSError, KeyError, ValueError, http.client.HTTPException,
            subprocess.TimeoutExpired) as error:
        print(f"pod_smoke.py: {rendered}: {error}", file=sys.stderr)
        log.flush()
        print("--- the service's log:", file=sys.stderr)
        print((SHM / "ratelimiter.log").read_text()[-4000:], file=sys.stderr)
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
            return inside(sys.argv[2], sys.argv[3], sys.argv[4])
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
                          ("redis-server", "redis-server"), ("redis-cli", "redis-server"),
                          ("openssl", "openssl"), ("mount", "mount")):
        if shutil.which(tool) is None:
            print(f"pod_smoke.py: {tool} not found: apt-get install -y {package}", file=sys.stderr)
            return 1
    failed = 0
    for argument in sys.argv[2:]:
        rendered, _, secrets_file = argument.partition("=")
        secrets_file = os.path.abspath(secrets_file or EXAMPLE_SECRETS)
        print(f"==> {rendered}: the binary as its Deployment runs it (Secrets from {os.path.relpath(secrets_file)})")
        # A new mount namespace whose root is this one, read-only; /proc, /dev (with /dev/shm for
        # the service's log, the Secret volumes' files and the certificates, outside what the
        # service may write) and a network namespace of its own.
        sandbox = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                   "--tmpfs", "/dev/shm", "--unshare-net", "--unshare-pid", "--die-with-parent",
                   "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                   sys.executable, os.path.abspath(__file__), "--inside", binary, os.path.abspath(rendered),
                   secrets_file]
        failed |= subprocess.run(sandbox).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
