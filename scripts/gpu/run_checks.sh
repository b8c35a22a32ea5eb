#!/usr/bin/env bash
# Every GPU check and benchmark in one command, for the GPU machine (docs/GPU.md):
#
#   scripts/gpu/run_checks.sh RESULTS_DIR [STEP ...]
#
# STEPs (default: all, in this order):
#   build     scripts/gpu/build_engine.sh build-gpu                  -> build.log (tail)
#   facts     scripts/gpu/machine_facts.sh                           -> machine.txt
#   tests     ctest -L gpu, then the other engine tests (CPU ranks)  -> tests.log
#   gputests  ctest -L gpu only                                      -> tests.log
#   diag      a backtrace of each crashing engine test (cuda-gdb)      -> diag.log
#   throughput engine_bench and hf_bench at 8k, 32k, 128k            -> results.jsonl
#             (the engine with activation checkpointing; tiled loss only where the full logits
#             would not fit: 128k; transformers with gradient checkpointing)
#   profile   one 32k engine step under the Kineto profiler          -> profile_32k.json
#   hfmax     longest sequence transformers trains at                -> results.jsonl
#   maxseq    longest sequence the engine trains at (all memory features on) -> results.jsonl
# Every record in results.jsonl carries "bench" (engine | hf), the git commit ($COMMIT or git),
# the GPU's name (nvidia-smi) and the command that produced it. A failed step is reported and the next one still runs; the
# exit code is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${1:?usage: scripts/gpu/run_checks.sh RESULTS_DIR [STEP ...]}
shift
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build facts tests throughput profile hfmax maxseq)
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
BUILD=${BUILD_DIR:-build-gpu}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
SEQS=${SEQS:-8192,32768,131072}
GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || echo unknown)}
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
failed=0

# Runs a benchmark command and appends its JSON lines to results.jsonl, tagged.
record() {
  local bench=$1
  shift
  echo "run_checks: $*" >&2
  "$@" | "$PY" -c '
import json, sys
bench, commit, cmd, gpu = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    rec = json.loads(line)
    rec.update(bench=bench, commit=commit, command=cmd, gpu=gpu)
    print(json.dumps(rec), flush=True)
' "$bench" "$COMMIT" "$*" "$GPU_NAME" | tee -a "$RESULTS/results.jsonl"
  return "${PIPESTATUS[0]}"
}

step() {
  local name=$1
  shift
  echo "=== $name" >&2
  local t0=$SECONDS
  if "$@"; then
    echo "=== $name ok ($((SECONDS - t0)) s)" >&2
  else
    echo "=== $name FAILED ($((SECONDS - t0)) s)" >&2
    failed=1
  fi
}

do_build() {
  scripts/gpu/build_engine.sh "$BUILD" > "$RESULTS/build.full.log" 2>&1
  local rc=$?
  grep -E "error|warning: unused" "$RESULTS/build.full.log" | head -n 60 > "$RESULTS/build.log"
  tail -n 5 "$RESULTS/build.full.log" >> "$RESULTS/build.log"
  rm -f "$RESULTS/build.full.log"
  cat "$RESULTS/build.log" >&2
  return $rc
}

do_gpu_tests() {
  local rc=0
  (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 600) >> "$RESULTS/tests.log" 2>&1 || rc=1
  grep -E "INFO|tests passed|Passed|Failed|SKIPPED|Skipped|\*\*\*" "$RESULTS/tests.log" | tail -n 30 >&2
  return $rc
}

do_tests() {
  local rc=0
  do_gpu_tests || rc=1
  # The CPU-rank engine tests against this libtorch (CI runs them against Debian's 1.13), two
  # threads each so eight at a time do not oversubscribe the cores.
  (cd "$BUILD" && OMP_NUM_THREADS=2 ctest -j8 -LE gpu -E "${CPU_TESTS_EXCLUDE:-needle}" --output-on-failure \
     --timeout 600) >> "$RESULTS/tests.log" 2>&1 || rc=1
  grep -E "INFO|tests passed|Passed|Failed|SKIPPED|Skipped|\*\*\*" "$RESULTS/tests.log" | tail -n 60 >&2
  return $rc
}

do_diag() {
  : > "$RESULTS/diag.log"
  for t in ${DIAG_TESTS:-engine_data_test engine_checkpoint_test engine_hf_test}; do
    echo "--- $t" >> "$RESULTS/diag.log"
    timeout 120 cuda-gdb -batch -ex run -ex bt -ex quit --args "$BUILD/bin/$t" \
      >> "$RESULTS/diag.log" 2>&1
  done
  grep -E "^#[0-9]|SIGSEGV|---" "$RESULTS/diag.log" | head -n 80 >&2
}

engine() { "$BUILD/bin/engine_bench" --device cuda:0 --shape llama3.2-1b --dtype bfloat16 "$@"; }

for s in "${STEPS[@]}"; do
  case "$s" in
    build) step build do_build ;;
    facts) step facts bash -c "scripts/gpu/machine_facts.sh '$PY' > '$RESULTS/machine.txt' 2>&1" ;;
    tests) step tests do_tests ;;
    gputests) step gpu-tests do_gpu_tests ;;
    diag) step diag do_diag ;;
    throughput)
      step engine-throughput record engine engine --seq "${SEQS_UNTILED:-8192,32768}" --ac
      step engine-throughput-tiled record engine engine --seq "${SEQS_TILED:-131072}" --ac \
        --tiled-loss
      step hf-throughput record hf "$PY" bench/gpu/hf_bench.py --seq "$SEQS" ;;
    profile)
      step profile bash -c "$BUILD/bin/engine_bench --device cuda:0 --shape llama3.2-1b \
        --dtype bfloat16 --ac --tiled-loss --profile-seq 32768 --profile-trace /tmp/trace_32k.json \
        > /dev/null && $PY bench/gpu/trace_summary.py /tmp/trace_32k.json > '$RESULTS/profile_32k.json'" ;;
    hfmax) step hf-max-seq record hf "$PY" bench/gpu/hf_bench.py --max-seq 16384 \
        --max-seq-step-budget "${MAX_SEQ_BUDGET:-200}" ;;
    fit256k) step engine-fit-256k record engine engine --ac --tiled-mlp --tiled-loss \
        --seq 262144 --steps 1 --warmup 0 ;;
    maxseq) step engine-max-seq record engine engine --ac --tiled-mlp --tiled-loss \
        --max-seq "${ENGINE_MAX_SEQ_START:-131072}" --max-seq-step-budget "${MAX_SEQ_BUDGET:-200}" ;;
    *) echo "run_checks: unknown step '$s'" >&2; failed=1 ;;
  esac
done
[ -f "$RESULTS/results.jsonl" ] && "$PY" bench/gpu/report.py "$RESULTS/results.jsonl" >&2
exit $failed
