#!/usr/bin/env bash
# Downloads Debian .deb files for a machine or image that has no Debian package registry, where
# scripts/gpu/build_engine.sh (or scripts/images/unpack_debs.sh) unpacks them with dpkg -x.
# Run on Debian bookworm (this project's machines, or the Debian stage of
# deploy/images/Containerfile.gpu-worker); needs no root, only apt lists (apt-get update).
#
#   scripts/gpu/fetch_debs.sh [DEST [PACKAGE...]]        (default DEST .debs)
#
# Without PACKAGEs: what the engine-only build needs beyond a pip PyTorch (ENGINE_DEBS). The C and
# C++ runtime (SYSTEM_PACKAGES) is never fetched: a private copy of libc or libstdc++ cannot be
# loaded next to the target system's own, which is new enough (glibc >= 2.34, GLIBCXX_3.4.30).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.debs}
[ $# -gt 0 ] && shift
ENGINE_DEBS=(libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev
  libgtest-dev libgmock-dev libgloo-dev libgloo0)
SYSTEM_PACKAGES=" libc6 libgcc-s1 libstdc++6 "
packages=("$@")
[ ${#packages[@]} -eq 0 ] && packages=("${ENGINE_DEBS[@]}")
wanted=()
for p in "${packages[@]}"; do
  if [[ $SYSTEM_PACKAGES == *" $p "* ]]; then
    echo "fetch_debs: skipping $p (the target system's own)"
  else
    wanted+=("$p")
  fi
done
mkdir -p "$DEST"
(cd "$DEST" && apt-get download -q "${wanted[@]}")
echo "fetch_debs: ${#wanted[@]} packages in $DEST: ${wanted[*]}"
