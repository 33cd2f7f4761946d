#!/usr/bin/env bash
# Single-stream tokens per second through `dg serve` beside `xtask bench-generate`, same settings, one
# run: a random BF16 checkpoint of CONFIG written to disk (generation_config.json without EOS ids,
# the bundled model's tokenizer), `bench-generate` on the same geometry, then
# tools/serve_tests/throughput.py against `dg serve --model` that checkpoint, and the ratio.
#
#   cargo build --release -p xtask -p dg-cli
#   bash bench/serve_h200.sh [OUT_DIR]     # CONFIG (default the real 30 layers), WEIGHTS (default f16),
#                                          # CKPT (where the checkpoint goes; default /tmp/dg-serve-ckpt)
#
# With CLIENTS (e.g. CLIENTS=1,4 BATCH=4) it measures concurrent streaming clients instead, against
# `dg serve --batch $BATCH`: the aggregate tokens per second of each client count and their ratio.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/bench/out}
mkdir -p "$OUT"
XTASK=$(realpath -m "${XTASK:-$ROOT/target/release/xtask}")
DG=$(realpath -m "${DG:-$ROOT/target/release/dg}")
CONFIG=${CONFIG:-bench/configs/real-30layer.json}
WEIGHTS=${WEIGHTS:-f16}
CKPT=${CKPT:-/tmp/dg-serve-ckpt}
PROMPT=1024
CANVASES=2
STEPS=48
RUNS=${RUNS:-3}
BATCH=${BATCH:-1}
CLIENTS=${CLIENTS:-}
cd "$ROOT"

if [ ! -f "$CKPT/config.json" ]; then
    start=$(date +%s)
    "$XTASK" write-checkpoint --config "$CONFIG" --out "$CKPT" --dtype bf16 --shard-gb 5
    echo "checkpoint written in $(($(date +%s) - start)) s"
fi
# Every canvas runs every step: no EOS ids (stopping is switched off per request).
echo '{"eos_token_id": []}' > "$CKPT/generation_config.json"
cp models/tiny-random/tokenizer.json models/tiny-random/tokenizer_config.json "$CKPT/"

if [ -n "$CLIENTS" ]; then
    python3 tools/serve_tests/throughput.py --binary "$DG" --model "$CKPT" --weights "$WEIGHTS" --prompt "$PROMPT" \
        --canvases "$CANVASES" --steps "$STEPS" --runs "$RUNS" --batch "$BATCH" --clients "$CLIENTS" \
        2>&1 | tee "$OUT/serve_clients_${WEIGHTS}_batch$BATCH.log"
    exit 0
fi
"$XTASK" bench-generate --config "$CONFIG" --prompt "$PROMPT" --canvases "$CANVASES" --steps "$STEPS" \
    --runs "$RUNS" --weights "$WEIGHTS" 2>&1 | tee "$OUT/serve_bench_generate_$WEIGHTS.log"
python3 tools/serve_tests/throughput.py --binary "$DG" --model "$CKPT" --weights "$WEIGHTS" --prompt "$PROMPT" \
    --canvases "$CANVASES" --steps "$STEPS" --runs "$RUNS" --compare "$OUT/serve_bench_generate_$WEIGHTS.log" \
    2>&1 | tee "$OUT/serve_throughput_$WEIGHTS.log"
