#!/usr/bin/env bash
# Installs every Debian package Ulysses needs, then configures and builds into build/.
# Usage: scripts/bootstrap.sh [--no-build]      (run as root, or with sudo available)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang clang-format clang-tidy
  # control plane
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev libsqlite3-dev libcpp-httplib-dev libcli11-dev nlohmann-json3-dev
  # engine: libtorch (CPU, with c10d Gloo + TCPStore), an optimized BLAS for it, zlib (CRC-32)
  libtorch-dev libopenblas0-pthread zlib1g-dev
  # c10d ProcessGroupGloo.hpp includes <gloo/...> headers (ulysses_engine_parallel)
  libgloo-dev
  # tests and benchmarks: gtest/gmock, google benchmark, promtool/prometheus for the
  # metrics checks, Debian's PyTorch for the independent reference and the eager baseline
  libgtest-dev libgmock-dev libbenchmark-dev prometheus python3 python3-torch python3-numpy
  python3-yaml
  procps
)
# deploy tests: kubectl renders deploy/k8s offline (`kubectl kustomize`) and writes the Secrets
# (scripts/k8s_secrets.sh, --dry-run=client). Debian's kubernetes-client (kubectl 1.20) ships
# /usr/bin/kubectl without declaring a conflict with other kubectl packages, so a kubectl
# already on PATH is kept.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
# deploy tests: the schema check of every rendered object runs node with npm packages
# (scripts/k8s_schema_tools.sh, below); a node/npm already on PATH is kept.
command -v npm >/dev/null || PACKAGES+=(nodejs npm)
# deploy image: scripts/images/build_control_plane.sh makes the control-plane image from Debian
# packages (mmdebstrap) and imports it (podman); deploy_image_test runs it.
PACKAGES+=(mmdebstrap podman uidmap)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
fi

if [ "${1:-}" = "--no-build" ]; then exit 0; fi

# The npm schema packages deploy_k8s_test validates deploy/k8s with (pinned by a lock file;
# a no-op when already installed).
scripts/k8s_schema_tools.sh >/dev/null

source scripts/build_env.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}"
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "bootstrap: built into $BUILD_DIR/bin"
