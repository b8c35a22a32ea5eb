#!/usr/bin/env bash
# Runs every test with ctest. Usage: scripts/test.sh [extra ctest args, e.g. -R spec]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_env.sh
cmake --build "$BUILD_DIR" -j"$(nproc)"
cd "$BUILD_DIR"
# Multi-process tests use several cores each; two at a time fits the 2-core CI machine.
ctest --output-on-failure -j"${CTEST_PARALLEL:-2}" "$@"
