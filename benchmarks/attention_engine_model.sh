#!/usr/bin/env bash
# Issue 34's whole-model table: the attention engine in `attnlab bench` (training steps in
# interleaved rounds, one process; peak memory in fresh processes), d=256, 4 layers, 8 heads,
# B=2, T=1024 (override with T=...), RoPE baseline. Each engine variant runs beside its
# pre-engine form (score.kind=dense_sdpa: SDPA with the dense [T, T] mask / [H, T, T] bias, from
# benchmarks/dense_masks.py) and the per-head temperature plugin beside the baseline.
#   bash benchmarks/attention_engine_model.sh [OUT]     (default: an out file under /tmp)
#   ONLY="temperature alibi t5" bash benchmarks/attention_engine_model.sh   (those variants only)
# Pass DEVICE=cuda to time the same table on a GPU (benchmarks/gpu_h100.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/attention-engine-model}
T=${T:-1024}
DEVICE=${DEVICE:-cpu}
W=256
VARIANTS=(
  "temperature:score.kind=temperature"
  "materialised_temperature:score.kind=temperature,attention.backend=math"
  "alibi:position.kind=alibi"
  "alibi_dense:position.kind=alibi,score.kind=dense_sdpa"
  "t5:position.kind=t5"
  "t5_dense:position.kind=t5,score.kind=dense_sdpa"
  "sliding:mask.kind=sliding,mask.window=$W"
  "sliding_dense:mask.kind=sliding,mask.window=$W,score.kind=dense_sdpa"
  "local_global:mask.kind=local_global,mask.window=$W,mask.n_global=16,mask.global_every=512"
  "local_global_dense:mask.kind=local_global,mask.window=$W,mask.n_global=16,mask.global_every=512,score.kind=dense_sdpa"
  "bigbird:mask.kind=bigbird,mask.window=$W,mask.n_global=16,mask.block_size=64,mask.random_blocks=2"
  "bigbird_dense:mask.kind=bigbird,mask.window=$W,mask.n_global=16,mask.block_size=64,mask.random_blocks=2,score.kind=dense_sdpa"
)
ARGS=()
for v in "${VARIANTS[@]}"; do  # ONLY="alibi t5 ...": just these (the baseline always runs)
  if [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" ${v%%:*} "* ]]; then ARGS+=(--variant "$v"); fi
done
exec attnlab bench tiny --device "$DEVICE" --peers none --sections "${SECTIONS:-training,memory}" \
  --plugin examples/score_temperature.py --plugin benchmarks/dense_masks.py \
  --set model.d_model=256 --set model.n_layers=4 --set model.attention.n_heads=8 \
  --set model.max_seq_len="$T" --set model.position.kind=rope \
  --batch-size 2 --seq-len "$T" --steps "${STEPS:-2}" --repeats "${REPEATS:-4}" --warmup 1 \
  --variants baseline "${ARGS[@]}" \
  --threads "${THREADS:-2}" --out "$OUT" --force
