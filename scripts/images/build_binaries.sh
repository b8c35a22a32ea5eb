#!/usr/bin/env bash
# Builds CMake targets the way scripts/bootstrap.sh does and stages them for an image
# (deploy/images). Run on Debian bookworm after `scripts/bootstrap.sh --no-build` installed the
# packages:
#
#   scripts/images/build_binaries.sh DEST TARGET...
#
# Writes DEST/bin/<TARGET> (the executables) and DEST/runtime-packages.txt (the Debian packages
# holding the shared libraries they load: scripts/images/runtime_packages.sh). Builds only the
# named targets, in $BUILD_DIR (scripts/build_env.sh). ULYSSES_DEPS_PREFIX=DIR bakes DIR's
# usr/lib/x86_64-linux-gnu and lib/x86_64-linux-gnu (where `dpkg -x` puts a package's libraries;
# zlib1g uses the second) into the executables as their first library search path (DT_RPATH),
# for an image that carries the Debian libraries in a private prefix (Containerfile.gpu-worker,
# scripts/images/unpack_debs.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/images/build_binaries.sh DEST TARGET..." >&2
  exit 2
fi
DEST=$1
shift
source scripts/build_env.sh
RPATH_ARGS=()
if [ -n "${ULYSSES_DEPS_PREFIX:-}" ]; then
  rpath="$ULYSSES_DEPS_PREFIX/usr/lib/x86_64-linux-gnu;$ULYSSES_DEPS_PREFIX/lib/x86_64-linux-gnu"
  RPATH_ARGS=(-DCMAKE_BUILD_RPATH="$rpath" -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags")
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  "${RPATH_ARGS[@]}"
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "$@"
mkdir -p "$DEST/bin"
staged=()
for target in "$@"; do
  install -m 0755 "$BUILD_DIR/bin/$target" "$DEST/bin/$target"
  staged+=("$DEST/bin/$target")
done
scripts/images/runtime_packages.sh "${staged[@]}" > "$DEST/runtime-packages.txt"
echo "build_binaries: staged $* in $DEST/bin; runtime packages: $(tr '\n' ' ' < "$DEST/runtime-packages.txt")"
