#!/usr/bin/env bash
# Regenerate every committed fixture under fixtures/ from its preset (each preset pins its seed).
#
#   tools/oracle/regen_all.sh             rewrite fixtures/<name>/ for every preset below
#   tools/oracle/regen_all.sh --verify    regenerate into a temporary directory and compare the sha256
#                                         of every file with the committed fixtures (exit 1 on any change)
#   tools/oracle/regen_all.sh NAME...     only these presets (works with --verify too)
#
# PYTHON selects the interpreter (default: python3) that has tools/oracle/requirements.txt installed.
# The gguf-* presets also need the gguf package and cargo (dg's quantizer writes their model.gguf).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

all_presets=(
  sliding-long-prompt
  default-pattern-8experts
  bf16-checkpoint
  real-head-dims
  early-stop-eos
  vision-tower-skip
  gguf-q8_0
  gguf-q4_k_m
  gguf-q4_k_m-k256
  gguf-q2_k
  gguf-legacy
  gguf-iq
  gguf-fp4
  f16-overflow
  odd-shapes
  converter-gemma4-vocab
)
# Fixtures whose model was made elsewhere (their README says how): the oracle writes only their
# reference, from the HF directory hf/ and the GGUF file made from it, with the seed given here.
declare -A checkpoint_seed=([converter-gemma4-vocab]=1)

verify=0
presets=()
for arg in "$@"; do
  case "$arg" in
    --verify) verify=1 ;;
    -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) presets+=("$arg") ;;
  esac
done
[ ${#presets[@]} -gt 0 ] || presets=("${all_presets[@]}")

if [ "$verify" = 1 ]; then
  dest="$(mktemp -d)"
  trap 'rm -rf "$dest"' EXIT
else
  dest="$root/fixtures"
fi

for name in "${presets[@]}"; do
  echo "== $name"
  if [ -n "${checkpoint_seed[$name]:-}" ]; then
    # relative paths: reference.json names them
    (cd "$root" && "$python" "$here/make_fixture.py" --checkpoint "fixtures/$name/hf" \
      --gguf "fixtures/$name/model.gguf" --seed "${checkpoint_seed[$name]}" --out "$dest/$name")
  else
    "$python" "$here/make_fixture.py" --preset "$name" --out "$dest/$name"
  fi
done

if [ "$verify" = 1 ]; then
  status=0
  for name in "${presets[@]}"; do
    for file in "$dest/$name"/*; do
      committed="$root/fixtures/$name/$(basename "$file")"
      new_sum="$(sha256sum "$file" | cut -d' ' -f1)"
      old_sum="$( [ -f "$committed" ] && sha256sum "$committed" | cut -d' ' -f1 || echo missing)"
      if [ "$new_sum" = "$old_sum" ]; then
        echo "same     $name/$(basename "$file")  $new_sum"
      else
        echo "CHANGED  $name/$(basename "$file")  $old_sum -> $new_sum"
        status=1
      fi
    done
  done
  exit "$status"
fi
