#!/usr/bin/env bash
# One-rank CPU training throughput: ulysses-train vs eager PyTorch 1.13, same model
# (vocab 256, hidden 256, 4 layers, 8 heads, 4 kv heads, inter 688), seq 2048, fp32.
# Usage: bench/train_throughput.sh [BUILD_DIR=build] [STEPS=5] [THREADS=nproc]
# Both implementations run with the same number of intra-op threads (OMP_NUM_THREADS).
# Prints one JSON line per implementation (median step time over steps 2..N).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
STEPS="${2:-5}"
THREADS="${3:-$(nproc)}"
export OMP_NUM_THREADS="$THREADS"
echo "# threads: $THREADS (both implementations)"
BIN="$BUILD_DIR/bin/ulysses-train"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "# BLAS: $(ldd "$BIN" | grep -Eo 'lib(open)?blas[^ ]*' | sort -u | tr '\n' ' ')" \
     "-> $(readlink -f "$(ldd "$BIN" | awk '/libblas|libopenblas/ {print $3; exit}')")"
cat > "$WORK/job.yaml" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: bench}
spec:
  model: {preset: tiny}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  optimizer: {lr: 1.0e-3}
  stages: [{seq_len: 2048, steps: $STEPS}]
  checkpoint: {every_steps: 0, keep_last: 1}
YAML
"$BIN" train -f "$WORK/job.yaml" --out "$WORK/out" > /dev/null
/usr/bin/python3 - "$WORK/out/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
secs = sorted(r["step_seconds"] for r in rows[1:] or rows)
med = secs[len(secs) // 2]
print(json.dumps({"impl": "ulysses-train", "seq_len": rows[0]["seq_len"],
                  "tokens_per_s": rows[0]["seq_len"] / med,
                  "step_seconds": [r["step_seconds"] for r in rows]}))
PY
/usr/bin/python3 bench/train_eager.py --seq 2048 --steps "$STEPS" --threads "$THREADS"
