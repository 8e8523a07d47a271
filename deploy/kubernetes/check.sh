#!/usr/bin/env bash
# The Kubernetes manifests checked without a cluster:
#   1. sync.py --check: the base's PrometheusRule, dashboard ConfigMap and image tag are current
#      with deploy/prometheus/, deploy/grafana/ and Cargo.toml; test_sync.py: its embeddings read
#      back as their sources by a YAML parser;
#   2. `kubectl kustomize` renders the base and every overlay;
#   3. validate.py checks every rendered object against the Kubernetes schemas of each version in
#      K8S_VERSIONS (PyPI's kubernetes-validate, in a virtualenv), the ServiceMonitor and the
#      PrometheusRule against the Prometheus Operator's CRDs (schemas/), the generated copies
#      against their sources, and the references between objects; and the example Secrets alone;
#   4. the validator is shown to fail: a rendering broken on purpose must be refused;
#   5. pod_smoke.py runs the release binary as each overlay's Deployment describes its container
#      (its environment, user, no capabilities, read-only root, own network namespace, in
#      bubblewrap) and checks its probes, metrics port, gRPC port, Secrets and SIGTERM; for the tls
#      overlay with certificates made by openssl in a directory laid out as the kubelet mounts a
#      Secret, a redis-server on --tls-port, HTTPS probes, mutual TLS on gRPC (openssl s_client),
#      and a renewal by the kubelet's ..data symlink swap served without a restart.
#
#   bash deploy/kubernetes/check.sh            (KUBECTL=/path/to/kubectl to choose kubectl,
#                                               RATELIMITER_BIN for target/release/ratelimiter)
#   bash deploy/kubernetes/check.sh --no-pod   (steps 1-4 only: no binary, no root needed)
#
# The validator lives in target/k8s-venv, installed from the pinned requirements.txt beside this
# script and reused while that file is unchanged. Renderings are left in target/k8s-rendered/.
set -uo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
# test_sync.py imports sync.py: leave no __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1
HERE=deploy/kubernetes
VENV=target/k8s-venv
REQUIREMENTS=$HERE/requirements.txt
OUT=target/k8s-rendered
# The oldest and the newest Kubernetes whose schemas kubernetes-validate 1.37.0 carries.
K8S_VERSIONS=(1.25.0 1.37.0)
RENDERINGS=(base overlays/embedded overlays/redis overlays/tls)
# The example Secrets of the overlays that read Secrets (validated alone, and read by pod_smoke.py).
EXAMPLE_SECRETS=(overlays/redis/example-secret.yaml overlays/tls/example-secret.yaml)

die() { echo "deploy/kubernetes/check.sh: $*" >&2; exit 1; }

POD=1
case "${1:-}" in
  "") ;;
  --no-pod) POD= ;;
  *) die "unknown argument $1 (usage: check.sh [--no-pod])" ;;
esac
BIN=${RATELIMITER_BIN:-target/release/ratelimiter}
if [ -n "$POD" ]; then
  # Checked first, so that a missing part fails before the rest of the work.
  [ -x "$BIN" ] || die "$BIN not found: build it with 'cargo build --release' (or run with --no-pod)"
  [ "$(id -u)" -eq 0 ] || die "the pod smoke test needs root (it switches to the pod's user): run as root or with --no-pod"
  for tool in bwrap:bubblewrap setpriv:util-linux ip:iproute2 redis-server:redis-server redis-cli:redis-server \
    openssl:openssl mount:mount; do
    command -v "${tool%%:*}" >/dev/null ||
      die "${tool%%:*} not found (needed by the pod smoke test): apt-get install -y ${tool#*:}"
  done
fi

command -v python3 >/dev/null || die "python3 not found: apt-get install -y python3"

echo "==> sync.py --check"
python3 "$HERE/sync.py" --check || die "the generated files are stale (see above)"

# --- kubectl, whose `kustomize` must be kustomize v4 or newer --------------------------------
# Debian's kubernetes-client (kubectl 1.20) embeds kustomize v2.0.3, which cannot read a
# directory under `resources:` nor a `patches:` list (it dates from 2019): these manifests need
# kubectl 1.21 or newer (kustomize v4+), as any supported cluster's kubectl is.
KUBECTL=${KUBECTL:-kubectl}
# `kubectl kustomize` needs no cluster, but a kubectl that picks its version by the server's (the
# Google Cloud SDK's dispatcher, /usr/bin/kubectl on these machines) first asks the kubeconfig's
# server, by default 127.0.0.1:8080, where any local program may listen: one that accepts and
# does not answer costs 5 s per call. This kubeconfig names a port nothing listens on, so the
# question is refused at once, whatever the machine runs or the caller's KUBECONFIG names.
KUBECONFIG=$(mktemp)
trap 'rm -f "$KUBECONFIG"' EXIT
export KUBECONFIG
cat >"$KUBECONFIG" <<'EOF_KUBECONFIG'
apiVersion: v1
kind: Config
clusters:
  - name: none
    cluster:
      server: https://127.0.0.1:1
contexts:
  - name: none
    context:
      cluster: none
current-context: none
EOF_KUBECONFIG
command -v "$KUBECTL" >/dev/null 2>&1 || die "$KUBECTL not found. Install kubectl 1.21 or newer from \
the Kubernetes project's or your cloud's packages (Debian's kubernetes-client is 1.20, too old: \
its kustomize v2.0.3 cannot render these overlays), or set KUBECTL=/path/to/kubectl"
kustomize_version=$("$KUBECTL" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}\([0-9][0-9.]*\).*/\1/p')
[ -n "$kustomize_version" ] || die "$KUBECTL names no Kustomize Version in 'kubectl version --client': \
it is older than 1.21; install kubectl 1.21 or newer (kustomize v4+)"
[ "${kustomize_version%%.*}" -ge 4 ] || die "$KUBECTL embeds kustomize v$kustomize_version; these \
overlays need v4 or newer (kubectl 1.21+)"
echo "==> rendering with $("$KUBECTL" version --client 2>/dev/null | head -n 1) (kustomize v$kustomize_version)"

# --- The validator, in a virtualenv reused while the requirements are unchanged --------------
if ! cmp -s "$REQUIREMENTS" "$VENV/installed-requirements.txt"; then
  echo "==> installing the validator ($REQUIREMENTS) into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" ||
    die "'python3 -m venv' failed: on Debian install its venv module with 'apt-get install -y python3-venv'"
  "$VENV/bin/python" -m pip --version >/dev/null 2>&1 ||
    die "the virtualenv has no pip: on Debian 'apt-get install -y python3-venv python3-pip'"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$REQUIREMENTS" || die "pip could not install $REQUIREMENTS (is PyPI reachable?)"
  cp "$REQUIREMENTS" "$VENV/installed-requirements.txt"
fi
"$VENV/bin/python" -c 'import kubernetes_validate, jsonschema, yaml' ||
  die "the validator does not import: remove $VENV and run again"

echo "==> test_sync.py (sync.py's embeddings read back by a YAML parser)"
"$VENV/bin/python" "$HERE/test_sync.py" || die "sync.py's tests failed (above)"

# --- Render -----------------------------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT"
args=()
for rendering in "${RENDERINGS[@]}"; do
  file="$OUT/${rendering//\//-}.yaml"
  # kustomize's warnings (deprecated fields, for one) go to stderr: fail on them too, so that
  # the manifests stay readable by the next kustomize.
  "$KUBECTL" kustomize "$HERE/$rendering" >"$file" 2>"$file.stderr" ||
    { cat "$file.stderr" >&2; die "kubectl kustomize $HERE/$rendering failed"; }
  if [ -s "$file.stderr" ]; then
    cat "$file.stderr" >&2
    die "kubectl kustomize $HERE/$rendering warned (above)"
  fi
  echo "    $HERE/$rendering: $(grep -c '^kind:' "$file") objects -> $file"
  args+=("$rendering=$file")
done

# --- Validate ---------------------------------------------------------------------------------
versions=()
for version in "${K8S_VERSIONS[@]}"; do versions+=(--k8s "$version"); done
echo "==> validating against Kubernetes ${K8S_VERSIONS[*]} and the Prometheus Operator's CRDs"
"$VENV/bin/python" "$HERE/validate.py" "${versions[@]}" --unapplied base "${args[@]}" ||
  die "a rendered object is invalid (above)"
for example in "${EXAMPLE_SECRETS[@]}"; do
  "$VENV/bin/python" "$HERE/validate.py" --objects-only "${versions[@]}" "$example=$HERE/$example" ||
    die "$example is invalid (above)"
done

# --- The validator refuses a broken rendering -------------------------------------------------
# Fails unless validate.py refuses rendering $2 (named $1), naming each of the faults after it.
must_refuse() {
  local name=$1 file=$2
  shift 2
  if "$VENV/bin/python" "$HERE/validate.py" "${versions[@]}" "$name=$file" 2>"$file.stderr"; then
    die "validate.py accepted $file, a rendering broken on purpose"
  fi
  local expected
  for expected in "$@"; do
    grep -qF "$expected" "$file.stderr" || {
      cat "$file.stderr" >&2
      die "validate.py refused $file but did not name $expected"
    }
  done
}
# A misspelt field in the Deployment (refused by the core schemas) and in the ServiceMonitor
# (refused by its CRD's schema), a Service port that targets no container port, and privilege
# escalation allowed (refused by the restricted profile): each must be named, or the checks
# above prove nothing.
echo "==> a rendering broken on purpose must be refused"
broken="$OUT/broken.yaml"
sed -e 's/^\( *\)readOnlyRootFilesystem: true$/&\n\1readOnlyRootFileSystem: true/' \
    -e 's/^\( *\)scrapeTimeout: 10s$/&\n\1scrapeTimout: 10s/' \
    -e 's/^\( *\)targetPort: grpc$/\1targetPort: grcp/' \
    -e 's/^\( *\)allowPrivilegeEscalation: false$/\1allowPrivilegeEscalation: true/' \
    "$OUT/overlays-redis.yaml" >"$broken"
must_refuse broken "$broken" "'readOnlyRootFileSystem' was unexpected" "'scrapeTimout' was unexpected" \
  "targets 'grcp'" "allowPrivilegeEscalation is not false"
echo "    refused, naming each of the 4 faults"
# The tls overlay's own promises: probes over HTTPS, a scrape that verifies, and the Secret
# mounted whole (a subPath mount never sees the kubelet's update of a renewed certificate).
broken="$OUT/broken-tls.yaml"
sed -e '0,/^\( *\)scheme: HTTPS$/s//\1scheme: HTTP/' \
    -e 's/^\( *\)insecureSkipVerify: false$/\1insecureSkipVerify: true/' \
    -e 's|^\( *\)- mountPath: /etc/ratelimiter/tls$|&\n\1  subPath: tls.crt|' \
    "$OUT/overlays-tls.yaml" >"$broken"
must_refuse broken-tls "$broken" "livenessProbe scheme HTTP on the HTTPS listener" \
  "insecureSkipVerify is not false" "mounted with subPath"
echo "    the tls overlay broken on purpose: refused, naming each of the 3 faults"

# --- The binary as each overlay's pod runs it --------------------------------------------------
if [ -n "$POD" ]; then
  # Each rendering with the example Secrets its pod reads (the embedded overlay reads only the
  # optional ratelimiter-auth, which the redis example holds).
  "$VENV/bin/python" "$HERE/pod_smoke.py" "$BIN" \
    "$OUT/overlays-embedded.yaml=$HERE/overlays/redis/example-secret.yaml" \
    "$OUT/overlays-redis.yaml=$HERE/overlays/redis/example-secret.yaml" \
    "$OUT/overlays-tls.yaml=$HERE/overlays/tls/example-secret.yaml" ||
    die "the binary does not run as the Deployment describes it (above)"
  echo "==> deploy/kubernetes: every rendering valid, and the binary runs as each overlay's pod ($SECONDS s)"
else
  echo "==> deploy/kubernetes: every rendering valid ($SECONDS s; the pod smoke test was NOT run: --no-pod)"
fi
