#!/usr/bin/env bash
# Peak RSS (VmHWM) of rank 0 for the tiny preset at sp 4, one rank per process, CPU.
# Usage: bench/train_memory.sh [BUILD_DIR=build] [SEQ_LENS="8192 16384 32768"] [EXTRA --set ...]
# Prints one JSON line per seq_len: {"seq_len", "sp", "peak_rss_bytes", "step_seconds"}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
SEQS="${2:-8192 16384 32768}"
shift $(( $# > 2 ? 2 : $# ))
BIN="$BUILD_DIR/bin/ulysses-train"
for S in $SEQS; do
  WORK="$(mktemp -d)"
  cat > "$WORK/job.yaml" <<YAML
apiVersion: ulysses/v1
kind: TrainJob
metadata: {name: mem}
spec:
  model: {preset: tiny}
  data: {synthetic: {generator: random, validation_sequences: 1}}
  parallelism: {sp_degree: 4}
  memory: {tiled_loss: true, loss_tile_tokens: 2048, attention_block_size: 512}
  stages: [{seq_len: $S, steps: 1}]
  checkpoint: {every_steps: 0, keep_last: 1}
YAML
  "$BIN" train -f "$WORK/job.yaml" --out "$WORK/out" "$@" > "$WORK/events"
  /usr/bin/python3 - "$WORK/out/metrics.jsonl" "$WORK/events" "$S" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' not in l]
done = [json.loads(l) for l in open(sys.argv[2]) if '"done"' in l][-1]
print(json.dumps({"seq_len": int(sys.argv[3]), "sp": 4,
                  "peak_rss_bytes_rank0": done.get("peak_rss_bytes"),
                  "step_seconds": rows[-1]["step_seconds"]}))
PY
  rm -rf "$WORK"
done
