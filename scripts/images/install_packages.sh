#!/usr/bin/env bash
# Installs the Debian packages listed in FILE (one per line, e.g. the runtime-packages.txt of
# scripts/images/build_binaries.sh) without recommends, then drops the apt lists: the runtime
# stage of deploy/images/Containerfile.control-plane. Run as root.
#
#   scripts/images/install_packages.sh FILE
set -euo pipefail
FILE=${1:?usage: scripts/images/install_packages.sh FILE}
mapfile -t packages < <(grep -v -E '^\s*(#|$)' "$FILE")
if [ ${#packages[@]} -eq 0 ]; then
  echo "install_packages: $FILE lists no packages" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
rm -rf /var/lib/apt/lists/*
echo "install_packages: ${packages[*]}"
