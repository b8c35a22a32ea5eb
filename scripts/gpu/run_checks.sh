#!/usr/bin/env bash
# Every GPU check and benchmark, for the GPU machine (docs/GPU.md):
#
#   scripts/gpu/run_checks.sh RESULTS_DIR A|B|STEP...
#
# A GPU session has 30 minutes of device time in commands of at most 10 minutes, and each fresh
# machine needs a build. Two presets fit one command each (9 minutes, DEADLINE_S=540), leaving
# time to rerun one:
#   A   build preload gputests throughput levers profile
#   B   build maxseq hfmax
#   C   build maxseq-offload (issue 49: Llama-3.1-8B's longest sequence with offload + tiling)
# STEPs:
#   build      scripts/gpu/build_engine.sh build-gpu, only the targets the other steps run
#              -> build.log (errors and tail)
#   facts      scripts/gpu/machine_facts.sh                                     -> machine.txt
#   preload    the pip-PyTorch crash diagnosis (issue 25): the std::filesystem symbols
#              libtorch_cpu.so exports, bench/gpu/fs_symbol_probe as is, under LD_DEBUG=bindings
#              and with LD_PRELOAD of the system libstdc++; then the engine tests that crashed at
#              c883db1 (engine_data/hf/checkpoint_test)                      -> preload.log
#   gputests   ctest -L gpu                                                    -> tests.log
#   tests      ctest -L gpu, then every other engine test on CPU ranks         -> tests.log
#   diag       a cuda-gdb backtrace of each of DIAG_TESTS                      -> diag.log
#   throughput engine_bench and hf_bench at 8k, 32k (the engine with activation checkpointing,
#              THROUGHPUT_FLAGS) and 128k (plus tiled loss: the full logits do not fit);
#              transformers with gradient checkpointing                       -> results.jsonl
#   levers     the speed levers not yet measured on a GPU, at 8k and 32k with THROUGHPUT_FLAGS:
#              --keep-attention (kept attention outputs: the recompute skips the attention
#              forward; a record's attention_forwards_per_step says whether the fused op was
#              kept), then with --tiled-loss too (the fused chunked linear-cross-entropy); and
#              loss_bench at the 32k step's loss shape, dense against the fused tiles -> results.jsonl
#   profile    one 32k engine step under the Kineto profiler with THROUGHPUT_FLAGS, the flags of
#              the 32k throughput record                                   -> profile_32k.json
#   maxseq     longest sequence the engine trains at (all memory features), Llama-3.2-1B then
#              Llama-3.1-8B shapes, each time-boxed                          -> results.jsonl
#   hfmax      the same for transformers                                       -> results.jsonl
#   maxseq-offload  Llama-3.1-8B's longest sequence with activation checkpointing offloaded to
#              pinned host memory, tiled MLP and tiled loss, from MAX_SEQ_OFFLOAD_START (131072),
#              doubling then bisecting, one step per length (engine_bench --max-seq), each step
#              bounded by MAX_SEQ_BUDGET; the fit records carry step seconds and peak bytes.
#              engine_bench has no optimizer offload yet: the 8B fp32 state stays on the GPU, so
#              this measures the activation side of issue 49's 500K target, not the target.
#   fit256k    one 256k engine step                                            -> results.jsonl
# Every record in results.jsonl carries "bench" (engine | hf), the git commit ($COMMIT or git),
# the GPU's name (nvidia-smi) and the command that produced it. Every step appends
# "<step> <seconds> ok|FAILED|TIMEOUT|SKIPPED" to timings.txt. A step gets at most its own budget
# and what is left of DEADLINE_S (timeout); one with under 20 s left is skipped. A failed step is
# reported and the next one still runs; the exit code is non-zero if any step failed.
# DRY_RUN=1: print each step's budget and command and run nothing (no GPU, no build needed).
# The do_* functions run through `bash -c` under timeout, which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
RESULTS=${1:?usage: scripts/gpu/run_checks.sh RESULTS_DIR A|B|STEP...}
shift
STEPS=()
for a in "$@"; do
  case "$a" in
    A) STEPS+=(build preload gputests throughput levers profile) ;;
    B) STEPS+=(build maxseq hfmax) ;;
    C) STEPS+=(build maxseq-offload) ;;
    *) STEPS+=("$a") ;;
  esac
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build preload gputests throughput levers profile)
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
BUILD=${BUILD_DIR:-build-gpu}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
SEQS=${SEQS:-8192,32768,131072}
DEADLINE_S=${DEADLINE_S:-540}
DRY_RUN=${DRY_RUN:-0}
THROUGHPUT_FLAGS=${THROUGHPUT_FLAGS:---ac}
MAX_SEQ_BUDGET=${MAX_SEQ_BUDGET:-60}
GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || echo unknown)}
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# The tests that run a Python reference (engine_hf_test) use this interpreter: the venv's, which
# has numpy and torch (/usr/bin/python3 there has neither).
export ULYSSES_PYTHON=${ULYSSES_PYTHON:-$(command -v "$PY")}
failed=0
START=$SECONDS

if [ ! -d .debs ] || ! ls .debs/*.deb >/dev/null 2>&1; then
  echo "run_checks: no .debs/*.deb: run scripts/gpu/fetch_debs.sh on the Debian machine first" \
    "and carry .debs (docs/GPU.md)" >&2
fi

# The targets the chosen steps run (build only those).
targets() {
  local t=()
  for s in "${STEPS[@]}"; do
    case "$s" in
      preload) t+=(fs_symbol_probe engine_data_test engine_hf_test engine_checkpoint_test) ;;
      gputests) t+=(gpu_engine_test ulysses-train) ;;
      tests) t+=(all) ;;
      diag)
        # shellcheck disable=SC2206  # DIAG_TESTS is a list of test names.
        t+=(${DIAG_TESTS:-engine_data_test engine_hf_test engine_checkpoint_test}) ;;
      throughput | profile | maxseq | maxseq-offload | fit256k) t+=(engine_bench) ;;
      levers) t+=(engine_bench loss_bench) ;;
    esac
  done
  printf '%s\n' "${t[@]}" | sort -u | tr '\n' ' '
}

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

# step NAME BUDGET_S CMD...: runs CMD under timeout min(BUDGET_S, time left), logs timings.txt.
step() {
  local name=$1 budget=$2
  shift 2
  local left=$((DEADLINE_S - (SECONDS - START)))
  [ "$budget" -gt "$left" ] && budget=$left
  if [ "$budget" -lt 20 ]; then
    echo "=== $name SKIPPED (${left} s left of DEADLINE_S=$DEADLINE_S)" >&2
    echo "$name 0 SKIPPED" >> "$RESULTS/timings.txt"
    return
  fi
  echo "=== $name (at most $budget s)" >&2
  if [ "$DRY_RUN" = 1 ]; then
    echo "dry-run: timeout $budget $*" >&2
    echo "$name 0 DRY_RUN" >> "$RESULTS/timings.txt"
    return
  fi
  local t0=$SECONDS rc=0
  # timeout runs the command in its own process group and kills all of it (ctest's children too).
  timeout --kill-after=10 "$budget" bash -c '"$@"' "$name" "$@" || rc=$?
  local secs=$((SECONDS - t0)) verdict=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    verdict=TIMEOUT
  elif [ $rc -ne 0 ]; then
    verdict=FAILED
  fi
  echo "=== $name $verdict ($secs s)" >&2
  echo "$name $secs $verdict" >> "$RESULTS/timings.txt"
  [ "$verdict" = ok ] || failed=1
}

do_build() {
  TARGETS="$BUILD_TARGETS" scripts/gpu/build_engine.sh "$BUILD" \
    > "$RESULTS/build.full.log" 2>&1
  local rc=$?
  grep -E "error|warning: unused" "$RESULTS/build.full.log" | head -n 60 > "$RESULTS/build.log"
  tail -n 5 "$RESULTS/build.full.log" >> "$RESULTS/build.log"
  rm -f "$RESULTS/build.full.log"
  cat "$RESULTS/build.log" >&2
  return "$rc"
}

# Issue 25's diagnosis: does std::filesystem::remove_all crash because it binds to
# libtorch_cpu.so's exported copy (pytorch/pytorch#133437)?
do_preload() {
  local log="$RESULTS/preload.log" probe="$BUILD/bin/fs_symbol_probe" rc=0
  local torch_lib stdcxx
  torch_lib=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))')
  stdcxx=$(ldd "$probe" | awk '/libstdc\+\+\.so/ {print $3; exit}')
  {
    echo "--- std::filesystem symbols exported by $torch_lib"
    nm -D --defined-only "$torch_lib" | c++filt | grep -c 'std::filesystem::'
    nm -D --defined-only "$torch_lib" | c++filt | grep 'std::filesystem::.*remove_all' | head -n 4
    echo "--- probe as linked (libstdc++: $stdcxx)"
    "$probe" /tmp/fs_probe_plain; echo "exit $?"
    echo "--- bindings of remove_all / directory_iterator"
    rm -f /tmp/fs_probe_ld.*
    LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/fs_probe_ld "$probe" /tmp/fs_probe_ld_dir >/dev/null
    echo "exit $?"
    grep -hE 'remove_all|directory_iterator' /tmp/fs_probe_ld.* | sed 's/^ *[0-9]*: *//' | head -n 8
    echo "--- probe with LD_PRELOAD=$stdcxx"
    LD_PRELOAD="$stdcxx" "$probe" /tmp/fs_probe_preload; echo "exit $?"
    echo "--- the engine tests that crashed at c883db1 (no remove_all left in them)"
  } > "$log" 2>&1
  (cd "$BUILD" && ctest -R '^(engine_data_test|engine_hf_test|engine_checkpoint_test)$' \
     --output-on-failure --timeout 300) >> "$log" 2>&1 || rc=1
  grep -vE '^\s*$' "$log" | grep -E -- '---|call|exit|symbol|tests passed|Failed|[0-9]+$' | head -n 40 >&2
  return "$rc"
}

do_gpu_tests() {
  local rc=0
  (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 480) >> "$RESULTS/tests.log" 2>&1 || rc=1
  grep -E "INFO|tests passed|Passed|Failed|SKIPPED|Skipped|\*\*\*" "$RESULTS/tests.log" | tail -n 30 >&2
  return "$rc"
}

do_tests() {
  local rc=0
  do_gpu_tests || rc=1
  # The CPU-rank engine tests against this libtorch (CI runs them against Debian's 1.13), two
  # threads each so eight at a time do not oversubscribe the cores.
  (cd "$BUILD" && OMP_NUM_THREADS=2 ctest -j8 -LE gpu -E "${CPU_TESTS_EXCLUDE:-needle}" --output-on-failure \
     --timeout 600) >> "$RESULTS/tests.log" 2>&1 || rc=1
  grep -E "INFO|tests passed|Passed|Failed|SKIPPED|Skipped|\*\*\*" "$RESULTS/tests.log" | tail -n 60 >&2
  return "$rc"
}

do_diag() {
  : > "$RESULTS/diag.log"
  for t in ${DIAG_TESTS:-engine_data_test engine_hf_test engine_checkpoint_test}; do
    echo "--- $t" >> "$RESULTS/diag.log"
    timeout 120 cuda-gdb -batch -ex run -ex bt -ex quit --args "$BUILD/bin/$t" \
      >> "$RESULTS/diag.log" 2>&1
  done
  grep -E "^#[0-9]|SIGSEGV|---" "$RESULTS/diag.log" | head -n 80 >&2
}

do_profile() {
  # shellcheck disable=SC2086  # THROUGHPUT_FLAGS is a flag list.
  "$BUILD/bin/engine_bench" --device cuda:0 --shape llama3.2-1b --dtype bfloat16 \
    $THROUGHPUT_FLAGS --profile-seq 32768 --profile-trace /tmp/trace_32k.json > /dev/null &&
    "$PY" bench/gpu/trace_summary.py /tmp/trace_32k.json > "$RESULTS/profile_32k.json"
}

engine() { "$BUILD/bin/engine_bench" --device cuda:0 --dtype bfloat16 "$@"; }

# The steps run in `bash -c` under timeout: they see these functions and variables.
BUILD_TARGETS=${BUILD_TARGETS:-$(targets)}
export -f record do_build do_preload do_gpu_tests do_tests do_diag do_profile engine
export RESULTS PY BUILD COMMIT GPU_NAME THROUGHPUT_FLAGS BUILD_TARGETS DIAG_TESTS CPU_TESTS_EXCLUDE

for s in "${STEPS[@]}"; do
  case "$s" in
    build) step build 300 do_build ;;
    facts) step facts 60 bash -c "scripts/gpu/machine_facts.sh '$PY' > '$RESULTS/machine.txt' 2>&1" ;;
    preload) step preload 90 do_preload ;;
    tests) step tests 480 do_tests ;;
    gputests) step gpu-tests 150 do_gpu_tests ;;
    diag) step diag 400 do_diag ;;
    throughput)
      # shellcheck disable=SC2086
      step engine-throughput 60 record engine engine --shape llama3.2-1b \
        --seq "${SEQS_UNTILED:-8192,32768}" $THROUGHPUT_FLAGS
      # shellcheck disable=SC2086
      step engine-throughput-tiled 120 record engine engine --shape llama3.2-1b \
        --seq "${SEQS_TILED:-131072}" $THROUGHPUT_FLAGS --tiled-loss
      step hf-throughput 90 record hf "$PY" bench/gpu/hf_bench.py --seq "$SEQS" ;;
    levers)
      # shellcheck disable=SC2086
      step engine-keep-attention 60 record engine-lever engine --shape llama3.2-1b \
        --seq "${SEQS_UNTILED:-8192,32768}" $THROUGHPUT_FLAGS --keep-attention
      # shellcheck disable=SC2086
      step engine-keep-attention-fused-loss 60 record engine-lever engine --shape llama3.2-1b \
        --seq "${SEQS_UNTILED:-8192,32768}" $THROUGHPUT_FLAGS --keep-attention --tiled-loss
      step loss-bench 60 record loss "$BUILD/bin/loss_bench" --device cuda:0 --dtype bfloat16 \
        --tokens 32768 --hidden 2048 --vocab 128256 --tile 8192 ;;
    profile) step profile 60 do_profile ;;
    hfmax)
      for shape in llama3.2-1b llama3.1-8b; do
        step "hf-max-seq-$shape" 120 record hf "$PY" bench/gpu/hf_bench.py --shape "$shape" \
          --max-seq 16384 --max-seq-step-budget "$MAX_SEQ_BUDGET"
      done ;;
    fit256k) step engine-fit-256k 120 record engine engine --shape llama3.2-1b --ac \
        --tiled-mlp --tiled-loss --seq 262144 --steps 1 --warmup 0 ;;
    maxseq)
      for shape in llama3.2-1b llama3.1-8b; do
        step "engine-max-seq-$shape" 150 record engine engine --shape "$shape" --ac --tiled-mlp \
          --tiled-loss --max-seq "${ENGINE_MAX_SEQ_START:-65536}" \
          --max-seq-step-budget "$MAX_SEQ_BUDGET"
      done ;;
    maxseq-offload)
      step engine-max-seq-offload-llama3.1-8b 220 record engine engine --shape llama3.1-8b --ac \
        --offload-activations --tiled-mlp --tiled-loss \
        --max-seq "${MAX_SEQ_OFFLOAD_START:-131072}" --max-seq-step-budget "$MAX_SEQ_BUDGET" ;;
    *) echo "run_checks: unknown step '$s'" >&2; failed=1 ;;
  esac
done
[ "$DRY_RUN" != 1 ] && [ -f "$RESULTS/results.jsonl" ] && "$PY" bench/gpu/report.py "$RESULTS/results.jsonl" >&2
echo "run_checks: $((SECONDS - START)) s in all; per step: $RESULTS/timings.txt" >&2
exit $failed
