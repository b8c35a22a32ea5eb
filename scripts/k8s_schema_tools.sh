#!/usr/bin/env bash
# Installs the npm packages tests/deploy validates deploy/k8s with (kubernetes-models: the
# Kubernetes OpenAPI schemas; @kubernetes-models/prometheus-operator and /cert-manager: the
# CRD schemas; /keda: the ScaledObject), pinned by tests/deploy/schema/package-lock.json, into DIR (default
# $ULYSSES_NPM_DIR, else ~/.cache/ulysses-npm/k8s-schema). Prints DIR/node_modules.
# Idempotent: a DIR whose lock file matches is reused without network access.
# Run by scripts/bootstrap.sh and, when missing, by tests/deploy/check_deploy.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/../tests/deploy/schema"
dir="${1:-${ULYSSES_NPM_DIR:-$HOME/.cache/ulysses-npm/k8s-schema}}"
command -v npm >/dev/null || { echo "$0: npm not found (Debian package npm)" >&2; exit 1; }
mkdir -p "$dir"
if ! cmp -s "$src/package-lock.json" "$dir/package-lock.json" || [[ ! -d "$dir/node_modules" ]]; then
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  # npm ci installs exactly the lock file's versions (integrity-checked).
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$dir/node_modules"
