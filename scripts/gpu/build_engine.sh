#!/usr/bin/env bash
# Builds the training engine (ULYSSES_ENGINE_ONLY: common/ + worker/engine + its tests and
# benchmarks) against the libtorch inside a pip-installed PyTorch, on a machine that has no
# package registry (the GPU machine). One command:
#
#   [TARGETS="t1 t2"] scripts/gpu/build_engine.sh [BUILD_DIR [extra cmake args]]
#                                          (default build-gpu; every target without TARGETS)
#
# Libraries the engine needs that a PyTorch image lacks (Abseil, yaml-cpp, nlohmann-json,
# GoogleTest, Gloo headers) come from Debian .deb files in $DEBS_DIR (default .debs; fetch them
# on a Debian machine with scripts/gpu/fetch_debs.sh), unpacked with dpkg -x into $DEPS_PREFIX
# (default .deps). CUDA/NCCL paths are built when nvcc and nccl.h are found (the NCCL that ships
# with PyTorch's wheels is preferred, so one libnccl is loaded).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build-gpu}
[ $# -gt 0 ] && shift
DEBS_DIR=${DEBS_DIR:-.debs}
DEPS_PREFIX=${DEPS_PREFIX:-$PWD/.deps}
PYTHON=${PYTHON:-python3}

shopt -s nullglob
debs=("$DEBS_DIR"/*.deb)
if [ ${#debs[@]} -gt 0 ]; then
  mkdir -p "$DEPS_PREFIX"
  for f in "${debs[@]}"; do dpkg -x "$f" "$DEPS_PREFIX"; done
  echo "build_engine: unpacked ${#debs[@]} .deb files into $DEPS_PREFIX"
fi

TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
TORCH_VERSION=$("$PYTHON" -c 'import torch; print(torch.__version__)')
echo "build_engine: PyTorch $TORCH_VERSION at $TORCH_PREFIX"
# NCCL from the nvidia-nccl wheel when present (the one libtorch_cuda loads).
NCCL_ARGS=()
NCCL_DIR=$("$PYTHON" - <<'PY' 2>/dev/null || true
import os
try:
    import nvidia.nccl as n
    print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])
except Exception:
    pass
PY
)
if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ]; then
  lib=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -n 1)
  NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$NCCL_DIR/include" -DNCCL_LIBRARY="$lib")
  echo "build_engine: NCCL from $NCCL_DIR"
fi

DEPS_LIB="$DEPS_PREFIX/usr/lib/x86_64-linux-gnu"
# GCC unless CC/CXX say otherwise: the wheel's libtorch is built with it, and this machine's
# build time does not matter (the CMakeLists.txt default, Clang, is for 2-core CI builds).
cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_CXX_COMPILER="${CXX:-g++}" -DCMAKE_C_COMPILER="${CC:-gcc}" \
  -DULYSSES_ENGINE_ONLY=ON \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS_PREFIX/usr;$DEPS_LIB/cmake" \
  -DULYSSES_EXTRA_INCLUDE_DIR="$DEPS_PREFIX/usr/include" \
  -DCMAKE_BUILD_RPATH="$DEPS_LIB" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  "${NCCL_ARGS[@]}" "$@"
# TARGETS="a b ...": build only these (scripts/gpu/run_checks.sh builds what its steps run).
# -k 0: a unit that fails to compile does not stop the others, so one build lists every error.
read -r -a targets <<< "${TARGETS:-}"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}" -- -k 0
else
  cmake --build "$BUILD_DIR" -j"$(nproc)" -- -k 0
fi
echo "build_engine: built into $BUILD_DIR/bin"
