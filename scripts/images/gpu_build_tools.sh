#!/usr/bin/env bash
# Makes sure a PyTorch CUDA image (Ubuntu or Debian) has what scripts/gpu/build_engine.sh needs
# besides PyTorch and nvcc: a C++17 compiler, CMake >= 3.22, Ninja and dpkg. Installs the missing
# ones with apt-get (run as root); prints the versions it will build with.
#
#   scripts/images/gpu_build_tools.sh
set -euo pipefail
if ! command -v dpkg >/dev/null; then
  echo "gpu_build_tools: no dpkg: build_engine.sh unpacks Debian packages (use a Debian or Ubuntu" \
    "based image)" >&2
  exit 1
fi
cmake_ok() {
  command -v cmake >/dev/null || return 1
  local v
  v=$(cmake --version | awk 'NR == 1 {print $3}')
  [ "$(printf '%s\n3.22\n' "$v" | sort -V | head -n 1)" = "3.22" ]
}
need=()
command -v g++ >/dev/null || need+=(g++)
command -v ninja >/dev/null || need+=(ninja-build)
cmake_ok || need+=(cmake)
if [ ${#need[@]} -gt 0 ]; then
  echo "gpu_build_tools: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  rm -rf /var/lib/apt/lists/*
fi
if ! cmake_ok; then
  echo "gpu_build_tools: cmake $(cmake --version | head -n 1) is older than 3.22" >&2
  exit 1
fi
echo "gpu_build_tools: $(g++ --version | head -n 1); $(cmake --version | head -n 1); ninja $(ninja --version)"
