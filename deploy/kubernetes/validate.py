#!/usr/bin/env python3
"""Validates rendered manifests: every object against its schema, and the objects against each other.

    validate.py --k8s 1.25.0 --k8s 1.37.0 [--unapplied base] NAME=RENDERED.yaml ...

Run by check.sh inside its virtualenv (kubernetes-validate, which brings PyYAML and jsonschema).
Each object is checked:

- core kinds: against the Kubernetes OpenAPI schemas of every --k8s version, strictly (an unknown
  field fails, as `kubectl apply` does since its field validation became strict);
- ServiceMonitor and PrometheusRule: against the openAPIV3Schema of their CustomResourceDefinition
  in schemas/ (the Prometheus Operator's own, see schemas/ORIGIN.md), made strict the same way
  (an object schema that lists its properties and does not preserve unknown fields rejects
  others), and their metadata against the core ObjectMeta schema;
- the generated copies: the PrometheusRule's spec is the rules file and the dashboard ConfigMap's
  data is the dashboard JSON, byte for byte, as a YAML parser reads them after kustomize;
- the pod against the Pod Security Standards' `restricted` profile, read-only root included;
- references no schema sees: each selector selects the Deployment's pods, each named port exists,
  the autoscaler scales a Deployment of the same rendering, env references to Secrets name a key;
- the HTTP worker count against the CPU limit;
- the embedded store's topology: an overlay without a Redis runs one replica, under no
  autoscaler, with the Recreate strategy;
- TLS: every *_FILE setting lies in a mounted volume (Secret volumes read-only, without subPath,
  which the kubelet never updates); probes, the ServiceMonitor (with a tlsConfig that verifies:
  a CA, a serverName, insecureSkipVerify false) and the Service's appProtocol follow whether
  each listener serves TLS; no httpGet probe on a listener that requires client certificates.

Exit status 1 with every failure listed; 0 with a summary line.
"""

import argparse
import copy
import json
import pathlib
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RULES = ROOT / "deploy/prometheus/ratelimiter.rules.yml"
DASHBOARD = ROOT / "deploy/grafana/ratelimiter.json"
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): HERE / "schemas/monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): HERE / "schemas/monitoring.coreos.com_prometheusrules.yaml",
}


# Formats the API server checks and the OpenAPI schemas do not (apimachinery's validation).
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def label_problems(labels):
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
            yield f"label key {key!r}: its prefix is not a DNS subdomain"
        if len(name) > 63 or not LABEL_NAME.match(name):
            yield f"label key {key!r} is not a valid label name"
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            yield f"label {key}: value {value!r} is not a valid label value"


def format_problems(obj):
    """Names, labels and port names as the API server would refuse them."""
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    if obj.get("kind") == "Service":
        if len(name) > 63 or not DNS1035_LABEL.match(name):
            yield f"name {name!r} is not a DNS-1035 label (a Service's name must be)"
    elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        yield f"name {name!r} is not a DNS-1123 subdomain"
    yield from label_problems(meta.get("labels"))
    if obj.get("kind") == "Service":
        for port in obj.get("spec", {}).get("ports", []):
            port_name = port.get("name", "")
            if len(port_name) > 63 or not DNS1123_LABEL.match(port_name):
                yield f"Service port name {port_name!r} is not a DNS-1123 label"
    template = obj.get("spec", {}).get("template")
    if isinstance(template, dict):
        yield from label_problems(template.get("metadata", {}).get("labels"))
        for container in template.get("spec", {}).get("containers", []):
            if len(container.get("name", "")) > 63 or not DNS1123_LABEL.match(container.get("name", "")):
                yield f"container name {container.get('name')!r} is not a DNS-1123 label"
            for port in container.get("ports", []):
                if "name" in port and (len(port["name"]) > 15 or not IANA_SVC_NAME.match(port["name"])):
                    yield f"container port name {port['name']!r} is not an IANA service name (15 characters at most)"


def restricted_problems(pod):
    """The Pod Security Standards' `restricted` profile, as a namespace enforcing it would admit the
    pod, plus the read-only root file system these manifests promise."""
    spec = pod.get("spec", {})
    pod_context = spec.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"{field} is set"
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        name = container.get("name")
        context = container.get("securityContext", {})

        def setting(field):
            return context.get(field, pod_context.get(field))

        if setting("runAsNonRoot") is not True:
            yield f"container {name}: runAsNonRoot is not true"
        if setting("runAsUser") == 0:
            yield f"container {name}: runAsUser is 0 (root)"
        if context.get("privileged"):
            yield f"container {name}: privileged"
        if context.get("allowPrivilegeEscalation") is not False:
            yield f"container {name}: allowPrivilegeEscalation is not false"
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            yield f"container {name}: capabilities do not drop ALL"
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            yield f"container {name}: adds capabilities beyond NET_BIND_SERVICE"
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"container {name}: seccompProfile is {seccomp!r}, not RuntimeDefault"
        if context.get("readOnlyRootFilesystem") is not True:
            yield f"container {name}: readOnlyRootFilesystem is not true"
        for port in container.get("ports", []):
            if "hostPort" in port:
                yield f"container {name}: hostPort {port['hostPort']}"
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                       "persistentVolumeClaim", "projected", "secret"}
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            yield f"volume {volume.get('name')}: {', '.join(sorted(kinds - allowed_volumes))} is not allowed"


def strict(schema):
    """The CRD schema with additionalProperties: false wherever the API server would drop fields.

    A structural schema prunes unknown fields instead of rejecting them; kubectl's strict field
    validation turns that into an error. Objects that preserve unknown fields or describe a map
    (additionalProperties) are left as they are."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(path, api_version):
    crd = yaml.safe_load(path.read_text())
    group, version = api_version.split("/")
    if crd["spec"]["group"] != group:
        raise SystemExit(f"validate.py: {path} is the CRD of group {crd['spec']['group']}, not {group}")
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served.get("served"):
            return strict(served["schema"]["openAPIV3Schema"])
    raise SystemExit(f"validate.py: {path} serves no version {version}")


def where(error):
    return "/".join(str(part) for part in error.absolute_path) or "(the object)"


class Checker:
    def __init__(self, versions):
        self.versions = versions
        self.failures = []
        self.crd_validators = {
            key: jsonschema.Draft7Validator(crd_schema(path, key[0])) for key, path in CRDS.items()
        }
        self.objects = 0

    def fail(self, name, obj, message):
        self.failures.append(f"{name}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}: {message}")

    def core(self, name, obj, label=None):
        for version in self.versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                self.fail(name, obj, f"Kubernetes {version}{label or ''}: {error.message} at {where(error)}")
            except kubernetes_validate.SchemaNotFoundError:
                self.fail(name, obj, f"Kubernetes {version} has no schema for {obj['apiVersion']} {obj['kind']}")

    def custom(self, name, obj, validator):
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
            self.fail(name, obj, f"CRD schema: {error.message} at {where(error)}")
        # The CRD's schema says only `metadata: object`; the API server checks it as ObjectMeta.
        self.core(name, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})},
                  label=" (its metadata as ObjectMeta)")

    def object(self, name, obj):
        self.objects += 1
        for problem in format_problems(obj):
            self.fail(name, obj, problem)
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in self.crd_validators:
            self.custom(name, obj, self.crd_validators[key])
        else:
            self.core(name, obj)

    def generated(self, name, objects):
        """The copies sync.py wrote, as a YAML parser reads them after kustomize."""
        rules = yaml.safe_load(RULES.read_text())
        dashboard = DASHBOARD.read_text()
        for obj in objects:
            if obj["kind"] == "PrometheusRule" and obj.get("spec") != rules:
                self.fail(name, obj, f"spec differs from {RULES.relative_to(ROOT)}")
            if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "ratelimiter-dashboard":
                text = obj.get("data", {}).get("ratelimiter.json")
                if text != dashboard:
                    self.fail(name, obj, f"data differs from {DASHBOARD.relative_to(ROOT)}")
                else:
                    json.loads(text)
                if obj["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
                    self.fail(name, obj, 'no label grafana_dashboard: "1" (the Grafana sidecar looks for it)')

    def references(self, name, objects, applied):
        """What a cluster accepts without complaint and then does nothing useful with.

        `applied` is false for a rendering that is never applied alone (the base): the rules of
        a store's topology are checked on the overlays only."""
        deployments = [o for o in objects if o["kind"] == "Deployment"]
        if len(deployments) != 1:
            self.failures.append(f"{name}: expected one Deployment, found {len(deployments)}")
            return
        deployment = deployments[0]
        pod = deployment["spec"]["template"]
        pod_labels = pod["metadata"].get("labels", {})
        containers = pod["spec"]["containers"]
        container_ports = {p["name"] for c in containers for p in c.get("ports", []) if "name" in p}

        def selects(selector):
            return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())

        for problem in restricted_problems(pod):
            self.fail(name, deployment, f"Pod Security 'restricted': {problem}")
        if not selects(deployment["spec"]["selector"].get("matchLabels", {})):
            self.fail(name, deployment, "its selector does not select its own pod template")
        for container in containers:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in container_ports:
                    self.fail(name, deployment, f"{probe} names port {port!r}, which no container declares")
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None and not (ref.get("name") and ref.get("key")):
                    self.fail(name, deployment, f"env {env['name']}: a secretKeyRef needs a name and a key")
        env_names = {e["name"] for c in containers for e in c.get("env", [])}
        tls = {}
        for container in containers:
            tls.update(self.tls_problems(name, deployment, pod["spec"], container))
        for container in containers:
            # One HTTP worker per core of the CPU limit: more would be throttled, fewer leave the
            # limit unused (docs/kubernetes.md says to change both together).
            workers = {e["name"]: e.get("value") for e in container.get("env", [])}.get("RATELIMITER__SERVER__WORKERS")
            cpu = container.get("resources", {}).get("limits", {}).get("cpu")
            if workers is not None and cpu is not None:
                cores = float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu)
                if int(workers) != max(1, int(cores)):
                    self.fail(name, deployment, f"RATELIMITER__SERVER__WORKERS={workers} for a CPU limit of {cpu}")
        if applied and not env_names & {"RATELIMITER__REDIS__URL", "RATELIMITER__REDIS__CLUSTER_NODES"}:
            # The embedded store is per process: a second pod, from the replica count, an
            # autoscaler or a rolling update's surge, would enforce every limit a second time.
            if deployment["spec"].get("replicas") != 1:
                self.fail(name, deployment, "the embedded store with replicas other than 1")
            if any(o["kind"] == "HorizontalPodAutoscaler" for o in objects):
                self.fail(name, deployment, "the embedded store under an autoscaler")
            if deployment["spec"].get("strategy", {}).get("type") != "Recreate":
                self.fail(name, deployment, "the embedded store without the Recreate strategy")
        services = [o for o in objects if o["kind"] == "Service"]
        service_ports = set()
        for service in services:
            if not selects(service["spec"].get("selector", {})):
                self.fail(name, service, "its selector does not select the Deployment's pods")
            for port in service["spec"].get("ports", []):
                service_ports.add(port.get("name"))
                target = port.get("targetPort")
                if isinstance(target, str) and target not in container_ports:
                    self.fail(name, service, f"port {port.get('name')} targets {target!r}, which no container declares")
        for obj in objects:
            kind = obj["kind"]
            if kind == "PodDisruptionBudget" and not selects(obj["spec"]["selector"].get("matchLabels", {})):
                self.fail(name, obj, "its selector does not select the Deployment's pods")
            if kind == "HorizontalPodAutoscaler":
                ref = obj["spec"]["scaleTargetRef"]
                if (ref.get("kind"), ref.get("name")) != ("Deployment", deployment["metadata"]["name"]):
                    self.fail(name, obj, f"scales {ref.get('kind')}/{ref.get('name')}, not this Deployment")
                if "replicas" in deployment["spec"]:
                    self.fail(name, deployment, "sets replicas beside an autoscaler: every apply would reset its count")
            if kind == "ServiceMonitor":
                if not any(selects(s["spec"].get("selector", {})) and
                           all(s["metadata"].get("labels", {}).get(k) == v
                               for k, v in obj["spec"]["selector"].get("matchLabels", {}).items())
                           for s in services):
                    self.fail(name, obj, "its selector matches no Service of this rendering")
                for endpoint in obj["spec"].get("endpoints", []):
                    if endpoint.get("port") not in service_ports:
                        self.fail(name, obj, f"endpoint port {endpoint.get('port')!r} is not a Service port")
                    self.scrape_tls(name, obj, endpoint, https=tls.get("http", False))
        for service in services:
            for port in service["spec"].get("ports", []):
                listener = {"http": "http", "grpc": "grpc"}.get(port.get("targetPort"))
                hint = port.get("appProtocol")
                if listener is None or hint is None:
                    continue
                if tls.get(listener) and hint in ("http", "kubernetes.io/h2c", "h2c"):
                    self.fail(name, service, f"port {port.get('name')}: appProtocol {hint} for a TLS listener")
                if not tls.get(listener) and hint in ("https", "kubernetes.io/wss"):
                    self.fail(name, service, f"port {port.get('name')}: appProtocol {hint} for a plaintext listener")

    def tls_problems(self, name, deployment, pod_spec, container):
        """The TLS files against the volumes, the probes against the listener's scheme.

        Returns which listeners serve TLS ({"http": bool, "grpc": bool}) for the checks of the
        ServiceMonitor and the Service."""
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        volumes = {v.get("name"): v for v in pod_spec.get("volumes", [])}
        mounts = container.get("volumeMounts", [])
        for mount in mounts:
            volume = volumes.get(mount.get("name"))
            if volume is None:
                self.fail(name, deployment, f"volumeMount {mount.get('name')!r} names no volume of the pod")
                continue
            if "secret" in volume:
                if mount.get("readOnly") is not True:
                    self.fail(name, deployment, f"Secret volume {mount['name']} mounted without readOnly: true")
                if "subPath" in mount or "subPathExpr" in mount:
                    # The kubelet updates a Secret volume by swapping its ..data symlink; a subPath
                    # mount is bound to the file of the start and never sees a renewal.
                    self.fail(name, deployment, f"Secret volume {mount['name']} mounted with subPath: "
                                                "the kubelet never updates it, a renewed certificate would not arrive")
        for variable, value in env.items():
            if not variable.endswith("_FILE") or not value:
                continue
            # The root file system is the image's (read-only, holding no certificate): every
            # file a setting names must be in a mounted volume, under a key the volume has.
            mount = next((m for m in mounts if value.startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
            if mount is None:
                self.fail(name, deployment, f"env {variable}: {value} is in no volumeMount of the container")
                continue
            volume = volumes.get(mount.get("name"), {})
            key = value[len(mount["mountPath"].rstrip("/")) + 1:]
            items = (volume.get("secret") or {}).get("items")
            if items is not None and key not in {i.get("path") for i in items}:
                self.fail(name, deployment, f"env {variable}: {key} is not among the items of volume {mount['name']}")
        https = bool(env.get("RATELIMITER__SERVER__TLS_CERT_FILE"))
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = container.get(probe, {}).get("httpGet")
            if get is None:
                continue
            scheme = get.get("scheme", "HTTP")
            if https and scheme != "HTTPS":
                self.fail(name, deployment, f"{probe} scheme {scheme} on the HTTPS listener (RATELIMITER__SERVER__TLS_CERT_FILE)")
            if not https and scheme != "HTTP":
                self.fail(name, deployment, f"{probe} scheme {scheme} on a plaintext HTTP listener")
            if https and env.get("RATELIMITER__SERVER__TLS_CLIENT_CA_FILE"):
                self.fail(name, deployment, f"{probe} on a listener that requires client certificates: "
                                            "the kubelet presents none")
        return {"http": https, "grpc": bool(env.get("RATELIMITER__GRPC__TLS_CERT_FILE"))}

    def scrape_tls(self, name, monitor, endpoint, https):
        scheme = endpoint.get("scheme", "http")
        if not https:
            if scheme != "http":
                self.fail(name, monitor, f"endpoint scheme {scheme} on a plaintext HTTP listener")
            return
        if scheme != "https":
            self.fail(name, monitor, f"endpoint scheme {scheme} on the HTTPS listener")
        config = endpoint.get("tlsConfig")
        if config is None:
            self.fail(name, monitor, "endpoint scrapes HTTPS without a tlsConfig")
            return
        if config.get("insecureSkipVerify") is not False:
            self.fail(name, monitor, "endpoint tlsConfig: insecureSkipVerify is not false")
        if not (config.get("ca") or config.get("caFile")):
            self.fail(name, monitor, "endpoint tlsConfig names no CA (ca or caFile)")
        if not config.get("serverName"):
            # Prometheus scrapes pod IPs, which no certificate names.
            self.fail(name, monitor, "endpoint tlsConfig has no serverName")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s", action="append", required=True, metavar="VERSION",
                        help="a Kubernetes version to validate against (repeatable)")
    parser.add_argument("--objects-only", action="store_true",
                        help="check each object alone (no generated-copy or cross-object checks)")
    parser.add_argument("--unapplied", action="append", default=[], metavar="NAME",
                        help="a rendering never applied alone (the base): no topology rules")
    parser.add_argument("renderings", nargs="+", metavar="NAME=FILE")
    args = parser.parse_args()
    checker = Checker(args.k8s)
    for rendering in args.renderings:
        name, _, path = rendering.partition("=")
        try:
            objects = [o for o in yaml.safe_load_all(pathlib.Path(path).read_text()) if o is not None]
        except yaml.YAMLError as error:
            checker.failures.append(f"{name}: not YAML: {error}")
            continue
        if not objects:
            checker.failures.append(f"{name}: no objects")
        for obj in objects:
            if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
                checker.failures.append(f"{name}: a document without apiVersion and kind: {obj!r:.80}")
                continue
            checker.object(name, obj)
        if not args.objects_only:
            checker.generated(name, objects)
            checker.references(name, objects, applied=name not in args.unapplied)
    if checker.failures:
        for failure in checker.failures:
            print(f"validate.py: {failure}", file=sys.stderr)
        print(f"validate.py: {len(checker.failures)} failures", file=sys.stderr)
        return 1
    print(f"validate.py: {checker.objects} objects in {len(args.renderings)} renderings valid "
          f"for Kubernetes {', '.join(args.k8s)} and the Prometheus Operator's CRDs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
