#!/usr/bin/env bash
# The H200 side-by-side table in one run: dg's GPU canvas forward (with the per-kernel profile) in
# the F16 mode and quantized (q8_0, q4_k_m) and its GPU-resident generation (F16, q4_k_m), and transformers'
# canvas forward (bf16 eager and torch.compile) and generate on the same GPU, same config and
# shapes, plus the GPU's measured matmul and copy peaks for the TFLOP/s and bandwidth fractions.
#
#   cargo build --release -p xtask
#   bash bench/h200.sh [OUT_DIR]        # default bench/out; XTASK=path/to/xtask, PYTHON=python3
#
# CONFIG (default bench/configs/real-30layer.json, the real model) picks the geometry; the f32 runs
# (dg and transformers), which do not fit an H200 at 30 layers, run only with F32=1 (e.g.
# CONFIG=bench/configs/real-6layer.json F32=1, the earlier tables' setup). transformers builds its
# model in the target dtype (bench/torch_model.py).
#
# GENERATE (default "f16 q4_k_m") picks dg's weight modes in the generation runs, FORWARD (default
# "f16 q8_0 q4_k_m") those of the profiled forwards.
# PARTS (default "dg torch") picks the sides to run; the summary reads every log in OUT_DIR, so a
# run in two calls (PARTS=dg, then PARTS=torch into the same OUT_DIR, e.g. where one command may
# take at most 10 minutes) gives the same summary. The environment and the peaks run in each part;
# SUMMARY_ONLY=1 writes the summary from the logs in OUT_DIR alone (every dg mode it finds there).
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
CONFIG=${CONFIG:-bench/configs/real-30layer.json}
F32=${F32:-0}
PARTS=${PARTS:-dg torch}
read -ra DG_WEIGHTS <<< "${FORWARD:-f16 q8_0 q4_k_m}"
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

# SUMMARY_ONLY=1: only the summary, from the logs already in OUT_DIR (e.g. both parts' logs,
# gathered from two machines' calls).
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
    step env environment
    step peak "$PYTHON" bench/torch_peak.py --device cuda
else
    PARTS=
fi
[ "$F32" = 1 ] && DG_WEIGHTS+=(f32)
TORCH_FORWARD=(bfloat16)
TORCH_GENERATE=(bf16)
if [ "$F32" = 1 ]; then
    TORCH_FORWARD=(float32 bfloat16)
    TORCH_GENERATE=(f32 bf16)
fi
read -ra DG_GENERATE <<< "${GENERATE:-f16 q4_k_m}"
[ "$F32" = 1 ] && DG_GENERATE+=(f32)
# A summary alone covers every dg mode whose log is in OUT_DIR, whatever GENERATE and F32 say.
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then
    DG_WEIGHTS=()
    DG_GENERATE=()
    for w in f16 q8_0 q4_k_m f32; do
        [ -f "$OUT/dg_forward_$w.log" ] && DG_WEIGHTS+=("$w")
        [ -f "$OUT/dg_generate_$w.log" ] && DG_GENERATE+=("$w")
    done
fi
if [[ " $PARTS " == *" dg "* ]]; then
    for w in "${DG_WEIGHTS[@]}"; do
        step "dg_forward_$w" "$XTASK" bench-gpu --config "$CONFIG" --context "$PROMPT" --weights "$w" --steps 100 --profile
    done
    for w in "${DG_GENERATE[@]}"; do
        step "dg_generate_$w" "$XTASK" bench-generate --config "$CONFIG" --prompt "$PROMPT" --canvases 2 --steps 48 --runs 3 --weights "$w"
    done
fi
if [[ " $PARTS " == *" torch "* ]]; then
    # 30 timed forwards a variant: over 10, a busy host once moved torch.compile's median to 1.8x
    # its minimum (BENCHMARKS.md, "Side by side with transformers, H100"); a forward is at most
    # about 0.1 s, so the extra runs cost seconds beside the compile's minutes.
    for dtype in "${TORCH_FORWARD[@]}"; do
        step "torch_forward_$dtype" "$PYTHON" bench/torch_forward.py --config "$CONFIG" --device cuda --dtype "$dtype" --prompt-len "$PROMPT" --runs 30
    done
    # torch.compile (default mode) of the canvas forward, bf16; the eager lines repeat the run above.
    step torch_forward_bfloat16_compile "$PYTHON" bench/torch_forward.py --config "$CONFIG" --device cuda --dtype bfloat16 --prompt-len "$PROMPT" --runs 30 --compile
    for dtype in "${TORCH_GENERATE[@]}"; do
        step "torch_generate_$dtype" "$PYTHON" bench/torch_generate.py --config "$CONFIG" --device cuda --dtype "$dtype" --prompt-len "$PROMPT" --canvases 2 --steps 48 --runs 3
    done
fi

{
    echo "== summary ($CONFIG, context/prompt $PROMPT)"
    grep -h -m1 -A1 '^name, driver_version' "$OUT/env.log"
    grep -h -E '^python ' "$OUT/env.log"
    grep -h -E '^peak ' "$OUT/peak.log"
    for w in "${DG_WEIGHTS[@]}"; do
        echo "-- dg_forward_$w"
        grep -h -E '^(adapter|random weights|canvas forward|work per forward|achieved|memory-bandwidth floor|decoder layers alone|mean per layer)' "$OUT/dg_forward_$w.log"
    done
    for w in "${DG_GENERATE[@]}"; do
        echo "-- dg_generate_$w"
        grep -h -E '^(weights on the GPU|prefill|canvas commit|denoising step|generate total|generated tokens)' "$OUT/dg_generate_$w.log"
    done
    runs=()
    for dtype in "${TORCH_FORWARD[@]}"; do runs+=("torch_forward_$dtype"); done
    runs+=(torch_forward_bfloat16_compile)
    for dtype in "${TORCH_GENERATE[@]}"; do runs+=("torch_generate_$dtype"); done
    for run in "${runs[@]}"; do
        echo "-- $run"
        pattern='(prefill|canvas_forward|decoder layer|generate|step|total|per second|commits)'
        [ "$run" = torch_forward_bfloat16_compile ] && pattern='_compiled'
        grep -h -E "$pattern" "$OUT/$run.log" | grep -v '^=='
    done
    # Fractions of the measured peaks (f32: dg's kernels run on the CUDA cores, like torch with
    # TF32 off).
    f32_peak=$(sed -n 's/^peak matmul f32 .*: \([0-9.]*\) TFLOP\/s.*/\1/p' "$OUT/peak.log")
    copy_peak=$(sed -n 's/^peak copy .*: \([0-9.]*\) GB\/s.*/\1/p' "$OUT/peak.log")
    bf16_peak=$(sed -n 's/^peak matmul bf16 .*: \([0-9.]*\) TFLOP\/s.*/\1/p' "$OUT/peak.log")
    for w in "${DG_WEIGHTS[@]}"; do
        log="$OUT/dg_forward_$w.log"
        dg_tflops=$(sed -n 's/^achieved GEMM TFLOP\/s in the decoder layers: \([0-9.]*\).*/\1/p' "$log")
        dg_bytes=$(sed -n 's/^work per forward: .*, \([0-9.]*\) GB of weights.*/\1/p' "$log")
        dg_ms=$(sed -n 's/^canvas forward (self-conditioning on): \([0-9.]*\) ms without readback.*/\1/p' "$log")
        for run in "${TORCH_FORWARD[@]}" bfloat16_compile; do
            pattern=' canvas_forward_sc: median'
            [ "$run" = bfloat16_compile ] && pattern=' canvas_forward_sc_compiled: median'
            torch_ms=$(grep -h -F "$pattern" "$OUT/torch_forward_$run.log" 2>/dev/null | sed -n 's/.*: median \([0-9.]*\) ms.*/\1/p')
            if [ -n "$dg_ms" ] && [ -n "$torch_ms" ]; then
                awk -v d="$dg_ms" -v t="$torch_ms" -v r="$run" -v w="$w" 'BEGIN { printf "canvas forward, self-conditioning on: dg %s %.2f ms vs transformers %s %.2f ms (dg takes %.2fx the time)\n", w, d, r, t, d / t }'
            fi
        done
        # Fractions of the measured peaks: f32 against the f32 matmul peak (dg's f32 kernels run on
        # the CUDA cores, like torch with TF32 off), the tensor-core modes against bf16's.
        peak=$bf16_peak
        [ "$w" = f32 ] && peak=$f32_peak
        if [ -n "$peak" ] && [ -n "$dg_tflops" ]; then
            awk -v a="$dg_tflops" -v p="$peak" -v w="$w" 'BEGIN { printf "dg %s decoder layers: %.1f TFLOP/s = %.1f%% of the measured matmul peak (%.1f)\n", w, a, 100 * a / p, p }'
        fi
        if [ -n "$copy_peak" ] && [ -n "$dg_bytes" ] && [ -n "$dg_ms" ]; then
            awk -v b="$dg_bytes" -v bw="$copy_peak" -v d="$dg_ms" -v w="$w" 'BEGIN { f = b / bw * 1e3; printf "dg %s bandwidth floor at the measured copy rate (%.0f GB/s): %.2f ms per forward for %.2f GB (%.1f%% of the forward)\n", w, bw, f, b, 100 * f / d }'
        fi
    done
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "failed steps: ${FAILED[*]}"
    fi
} 2>&1 | tee "$OUT/summary.txt"

[ ${#FAILED[@]} -eq 0 ]
