#!/usr/bin/env bash
# The H200 side-by-side table in one run: dg's GPU canvas forward (with the per-kernel profile) and
# GPU-resident generation, and transformers' canvas forward and generate on the same GPU, same config and shapes, plus the
# GPU's measured matmul and copy peaks for the TFLOP/s and bandwidth fractions.
#
#   cargo build --release -p xtask
#   bash bench/h200.sh [OUT_DIR]        # default bench/out; XTASK=path/to/xtask, PYTHON=python3
#
# dg's side needs a Vulkan loader and the NVIDIA Vulkan driver. Every step's output is saved as
# OUT_DIR/<step>.log; OUT_DIR/summary.txt collects the lines the table is made of. A failing step
# is reported and the others still run; the exit status is 1 if any step failed.

set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/bench/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
XTASK=$(realpath -m "${XTASK:-$ROOT/target/release/xtask}")
PYTHON=${PYTHON:-python3}
cd "$ROOT"
CONFIG=bench/configs/real-6layer.json
PROMPT=1024
FAILED=()

# step NAME COMMAND...: runs COMMAND, its output shown and saved as $OUT/NAME.log.
step() {
    local name=$1
    shift
    echo
    echo "== $name: $*" | tee "$OUT/$name.log"
    if ! "$@" 2>&1 | tee -a "$OUT/$name.log"; then
        echo "!! $name failed" | tee -a "$OUT/$name.log"
        FAILED+=("$name")
    fi
}

environment() {
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    uname -srm
    grep -m1 'model name' /proc/cpuinfo || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    nvidia-smi
    "$PYTHON" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    echo "xtask: $XTASK ($(stat -c '%y' "$XTASK" 2>/dev/null || echo missing))"
}

step env environment
step peak "$PYTHON" bench/torch_peak.py --device cuda
step dg_forward "$XTASK" bench-gpu --config "$CONFIG" --context "$PROMPT" --steps 20 --profile
step dg_generate "$XTASK" bench-generate --config "$CONFIG" --prompt "$PROMPT" --canvases 2 --steps 48 --runs 3
for dtype in float32 bfloat16; do
    step "torch_forward_$dtype" "$PYTHON" bench/torch_forward.py --config "$CONFIG" --device cuda --dtype "$dtype" --prompt-len "$PROMPT" --runs 10
done
# torch.compile (default mode) of the canvas forward, bf16; the eager lines repeat the run above.
step torch_forward_bfloat16_compile "$PYTHON" bench/torch_forward.py --config "$CONFIG" --device cuda --dtype bfloat16 --prompt-len "$PROMPT" --runs 10 --compile
for dtype in f32 bf16; do
    step "torch_generate_$dtype" "$PYTHON" bench/torch_generate.py --config "$CONFIG" --device cuda --dtype "$dtype" --prompt-len "$PROMPT" --canvases 2 --steps 48 --runs 3
done

{
    echo "== summary ($CONFIG, context/prompt $PROMPT)"
    grep -h -m1 -A1 '^name, driver_version' "$OUT/env.log"
    grep -h -E '^python ' "$OUT/env.log"
    grep -h -E '^peak ' "$OUT/peak.log"
    grep -h -E '^(adapter|canvas forward|work per forward|achieved|memory-bandwidth floor|decoder layers alone|mean per layer|\| layer[0-9])' "$OUT/dg_forward.log"
    echo "-- dg_generate"
    grep -h -E '^(prefill|canvas commit|denoising step|generate total|generated tokens)' "$OUT/dg_generate.log"
    for run in torch_forward_float32 torch_forward_bfloat16 torch_forward_bfloat16_compile torch_generate_f32 torch_generate_bf16; do
        echo "-- $run"
        pattern='(prefill|canvas_forward|decoder layer|generate|step|total|per second|commits)'
        [ "$run" = torch_forward_bfloat16_compile ] && pattern='_compiled'
        grep -h -E "$pattern" "$OUT/$run.log" | grep -v '^=='
    done
    # Fractions of the measured peaks (f32: dg's kernels run on the CUDA cores, like torch with
    # TF32 off).
    f32_peak=$(sed -n 's/^peak matmul f32 .*: \([0-9.]*\) TFLOP\/s.*/\1/p' "$OUT/peak.log")
    copy_peak=$(sed -n 's/^peak copy .*: \([0-9.]*\) GB\/s.*/\1/p' "$OUT/peak.log")
    dg_tflops=$(sed -n 's/^achieved GEMM TFLOP\/s in the decoder layers: \([0-9.]*\).*/\1/p' "$OUT/dg_forward.log")
    dg_bytes=$(sed -n 's/^work per forward: .*, \([0-9.]*\) GB of weights.*/\1/p' "$OUT/dg_forward.log")
    dg_ms=$(sed -n 's/^canvas forward (self-conditioning on): \([0-9.]*\) ms without readback.*/\1/p' "$OUT/dg_forward.log")
    for run in float32 bfloat16 bfloat16_compile; do
        pattern=' canvas_forward_sc: median'
        [ "$run" = bfloat16_compile ] && pattern=' canvas_forward_sc_compiled: median'
        torch_ms=$(grep -h -F "$pattern" "$OUT/torch_forward_$run.log" 2>/dev/null | sed -n 's/.*: median \([0-9.]*\) ms.*/\1/p')
        if [ -n "$dg_ms" ] && [ -n "$torch_ms" ]; then
            awk -v d="$dg_ms" -v t="$torch_ms" -v r="$run" 'BEGIN { printf "canvas forward, self-conditioning on: dg f32 %.2f ms vs transformers %s %.2f ms (dg takes %.2fx the time)\n", d, r, t, d / t }'
        fi
    done
    if [ -n "$f32_peak" ] && [ -n "$dg_tflops" ]; then
        awk -v a="$dg_tflops" -v p="$f32_peak" 'BEGIN { printf "dg decoder layers: %.1f TFLOP/s = %.0f%% of the measured f32 matmul peak (%.1f)\n", a, 100 * a / p, p }'
    fi
    if [ -n "$copy_peak" ] && [ -n "$dg_bytes" ]; then
        awk -v b="$dg_bytes" -v bw="$copy_peak" 'BEGIN { printf "bandwidth floor at the measured copy rate (%.0f GB/s): %.2f ms per forward for %.2f GB\n", bw, b / bw * 1e3, b }'
    fi
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "failed steps: ${FAILED[*]}"
    fi
} 2>&1 | tee "$OUT/summary.txt"

[ ${#FAILED[@]} -eq 0 ]
