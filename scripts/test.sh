#!/usr/bin/env bash
# Runs every test with ctest. Usage: scripts/test.sh [extra ctest args, e.g. -R spec]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/build_env.sh
cmake --build "$BUILD_DIR" -j"$(nproc)"
cd "$BUILD_DIR"
# Multi-process tests use several cores each; two at a time fits the 2-core CI machine.
status=0
ctest --output-on-failure -j"${CTEST_PARALLEL:-2}" "$@" || status=$?
if [ "$status" -ne 0 ] && [ -s Testing/Temporary/LastTestsFailed.log ]; then
  # Each failed test's output was printed when it ended, in the middle of a long log; its
  # last lines (the failed assertion, a crash's stack) are repeated here, at the end.
  while IFS=: read -r _ name; do
    echo "==== the last lines of ${name}'s output ===="
    awk -v want="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Test: " && $NF == want { here = 1; next }
      here && /^Output:/ { getline; out = 1; next }
      out && /^<end of output>/ { exit }
      out { print }' Testing/Temporary/LastTest.log | tail -n 60
  done < Testing/Temporary/LastTestsFailed.log
fi
exit "$status"
