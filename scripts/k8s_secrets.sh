#!/usr/bin/env bash
# Secrets for deploy/k8s: TLS for the coordinator, one client certificate Secret per worker,
# and the coordinator's token file with one admin token. Writes OUT_DIR/secrets.yaml (the
# Namespace, ulysses-coordinator-tls, ulysses-coordinator-tokens and ulysses-worker-N-tls for
# N < WORKERS; every TLS Secret is type kubernetes.io/tls with tls.crt, tls.key and ca.crt)
# and, for ulyssesctl, OUT_DIR/admin.token (0600) and OUT_DIR/ulyssesctl-config.yaml (context
# `k8s`: localhost:50051 through a port-forward). With --apply it then applies them:
#   kubectl apply --server-side --field-manager=ulysses-secrets -f OUT_DIR/secrets.yaml
# Server-side apply keeps no last-applied-configuration annotation, whose 256 KiB limit a
# client-side apply of many certificates runs into. Apply the Secrets before the overlay.
#
#   scripts/k8s_secrets.sh OUT_DIR [WORKERS] [--apply]   # WORKERS: the StatefulSet's replicas (2)
#
# The namespace is the `namespace:` of deploy/k8s/base/kustomization.yaml (the one place the
# manifests name it); ULYSSES_NAMESPACE overrides it, e.g. for an overlay that sets another.
#
# Certificates come from scripts/dev_certs.sh (a dev CA kept in OUT_DIR/certs; reused on
# later runs, so more workers can be added). Production: sign with your own CA and build the
# same three Secrets (docs/DEPLOY.md "Secrets"). Needs openssl, kubectl (offline: --dry-run)
# and python3. OUT_DIR holds private keys: keep it out of the repository.
set -euo pipefail

usage() {
  echo "usage: $0 OUT_DIR [WORKERS] [--apply]  (WORKERS: 1..1000, the StatefulSet's replicas)" >&2
  exit 2
}
apply=0
args=()
for a in "$@"; do
  if [[ "$a" == --apply ]]; then apply=1; else args+=("$a"); fi
done
set -- "${args[@]}"
[[ $# -ge 1 && $# -le 2 ]] || usage
out="$1"
workers="${2:-2}"
[[ "$workers" =~ ^[0-9]+$ ]] && ((workers >= 1 && workers <= 1000)) || usage
for tool in openssl kubectl python3; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found" >&2; exit 1; }
done
here="$(cd "$(dirname "$0")" && pwd)"
kustomization="$here/../deploy/k8s/base/kustomization.yaml"
ns="${ULYSSES_NAMESPACE:-$(sed -n 's/^namespace:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$kustomization")}"
if [[ ! "$ns" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  echo "$0: namespace '$ns' (ULYSSES_NAMESPACE or the namespace: of $kustomization) is not a" \
    "DNS label" >&2
  exit 2
fi
svc=ulysses-coordinator

umask 077
mkdir -p "$out"
names=()
for ((i = 0; i < workers; i++)); do names+=("ulysses-worker-$i"); done
# The coordinator is dialled by its Service's short name (workers, in the same namespace) and
# as localhost (port-forward); the qualified names serve clients in other namespaces.
ULYSSES_CERT_SANS="DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local" \
  "$here/dev_certs.sh" "$out/certs" "${names[@]}" >/dev/null
certs="$out/certs"

# One admin token: the plaintext once in admin.token, only its sha256 in the Secret.
if [[ ! -s "$out/admin.token" ]]; then
  python3 -c 'import secrets; print("ul_" + secrets.token_urlsafe(32))' >"$out/admin.token"
fi
# tokens.yaml is made once; later runs keep it (and the users added to it).
if [[ ! -s "$out/tokens.yaml" ]]; then
  token="$(head -n1 "$out/admin.token")"
  hash="$(printf '%s' "$token" | openssl dgst -sha256 -r | cut -d' ' -f1)"
  cat >"$out/tokens.yaml" <<YAML
# ulysses-coordinator token file: sha256 of each token, never the token itself.
# Add users with \`ulysses-coordinator token create --token-file tokens.yaml ...\`.
tokens:
  - user: admin
    tenant: default
    role: admin
    sha256: $hash
YAML
fi

{
  cat <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels:
    app.kubernetes.io/part-of: ulysses
---
YAML
  # kubectl create --dry-run=client -o yaml: the Secret objects, nothing sent to a cluster.
  kubectl create secret generic ulysses-coordinator-tls -n "$ns" --dry-run=client -o yaml \
    --type=kubernetes.io/tls --from-file=tls.crt="$certs/server.pem" \
    --from-file=tls.key="$certs/server.key" --from-file=ca.crt="$certs/ca.pem"
  echo "---"
  kubectl create secret generic ulysses-coordinator-tokens -n "$ns" --dry-run=client -o yaml \
    --from-file=tokens.yaml="$out/tokens.yaml"
  for n in "${names[@]}"; do
    echo "---"
    kubectl create secret generic "$n-tls" -n "$ns" --dry-run=client -o yaml \
      --type=kubernetes.io/tls --from-file=tls.crt="$certs/workers/$n.pem" \
      --from-file=tls.key="$certs/workers/$n.key" --from-file=ca.crt="$certs/ca.pem"
  done
} >"$out/secrets.yaml"

cat >"$out/ulyssesctl-config.yaml" <<YAML
# kubectl -n $ns port-forward svc/$svc 50051, then: export ULYSSES_CONFIG=$out/ulyssesctl-config.yaml
current-context: k8s
contexts:
  - name: k8s
    server: localhost:50051
    ca: $(cd "$certs" && pwd)/ca.pem
    token_file: $(cd "$out" && pwd)/admin.token
YAML
echo "$0: wrote $out/secrets.yaml (Namespace $ns, 2 coordinator Secrets, $workers worker" \
  "Secrets), $out/admin.token and $out/ulyssesctl-config.yaml"
if ((apply)); then
  kubectl apply --server-side --field-manager=ulysses-secrets -f "$out/secrets.yaml"
fi
