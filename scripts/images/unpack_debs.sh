#!/usr/bin/env bash
# Unpacks every .deb file in DEBS_DIR into PREFIX (dpkg -x: files only, no maintainer scripts, no
# dpkg database), for machines and images that are not Debian or have no package registry: the
# way scripts/gpu/build_engine.sh carries the engine's libraries, used by
# deploy/images/Containerfile.gpu-worker for the agent's.
#
#   scripts/images/unpack_debs.sh DEBS_DIR PREFIX
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: scripts/images/unpack_debs.sh DEBS_DIR PREFIX" >&2
  exit 2
fi
shopt -s nullglob
debs=("$1"/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
  echo "unpack_debs: no .deb files in $1" >&2
  exit 1
fi
mkdir -p "$2"
for f in "${debs[@]}"; do dpkg -x "$f" "$2"; done
echo "unpack_debs: unpacked ${#debs[@]} .deb files into $2"
