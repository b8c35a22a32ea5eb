#!/usr/bin/env bash
# Development certificates for ulysses-coordinator TLS and worker mutual TLS.
#
#   scripts/dev_certs.sh OUT_DIR [WORKER_NAME ...]
#
# Makes (ECDSA P-256, openssl; keys mode 0600):
#   OUT_DIR/ca.pem, ca.key                  a dev CA (reused when present)
#   OUT_DIR/server.pem, server.key          coordinator cert, SAN DNS:localhost, IP:127.0.0.1,
#                                           IP:::1 plus $ULYSSES_CERT_SANS ("DNS:a,IP:1.2.3.4")
#   OUT_DIR/workers/<name>.pem, <name>.key  worker client cert, CN=<name>, SAN DNS:<name>,
#                                           extendedKeyUsage clientAuth
# Idempotent: an existing CA, server cert and worker certs are kept; new worker names are
# added. For production, use your own CA (docs/SECURITY.md).
set -euo pipefail

usage() {
  echo "usage: $0 OUT_DIR [WORKER_NAME ...]  (worker names: [a-z0-9][a-z0-9.-]{0,62})" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
out="$1"
shift
command -v openssl >/dev/null || { echo "$0: openssl not found (apt-get install openssl)" >&2; exit 1; }
for name in "$@"; do
  [[ "$name" =~ ^[a-z0-9][a-z0-9.-]{0,62}$ ]] || {
    echo "$0: worker name \"$name\" is not DNS-1123-like (use [a-z0-9][a-z0-9.-]{0,62})" >&2
    exit 2
  }
done

umask 077
mkdir -p "$out/workers"
days=825
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

newkey() {  # newkey PATH
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
  chmod 0600 "$1"
}

# sign NAME KEY CERT SUBJECT EXTFILE
sign() {
  openssl req -new -key "$2" -subj "$4" -out "$tmp/$1.csr"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -sha256 -extfile "$5" \
    -out "$3" 2>/dev/null
  chmod 0644 "$3"
}

if [[ ! -s "$out/ca.pem" || ! -s "$out/ca.key" ]]; then
  newkey "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" \
    -subj "/CN=ulysses-dev-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$out/ca.pem"
  chmod 0644 "$out/ca.pem"
  rm -f "$out/server.pem" "$out/workers/"*.pem  # Signed by a CA that is gone.
fi

if [[ ! -s "$out/server.pem" || ! -s "$out/server.key" ]]; then
  sans="DNS:localhost,IP:127.0.0.1,IP:::1"
  [[ -n "${ULYSSES_CERT_SANS:-}" ]] && sans="$sans,$ULYSSES_CERT_SANS"
  cat >"$tmp/server.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$sans
EOF
  newkey "$out/server.key"
  sign server "$out/server.key" "$out/server.pem" "/CN=ulysses-coordinator" "$tmp/server.ext"
fi

for name in "$@"; do
  key="$out/workers/$name.key"
  pem="$out/workers/$name.pem"
  [[ -s "$pem" && -s "$key" ]] && continue
  cat >"$tmp/$name.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectAltName=DNS:$name
EOF
  newkey "$key"
  sign "$name" "$key" "$pem" "/CN=$name" "$tmp/$name.ext"
done
echo "$0: certificates in $out (CA $out/ca.pem)"
