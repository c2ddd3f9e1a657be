#!/usr/bin/env bash
# Issue 34's whole-model table: the attention engine in `attnlab bench` (training steps in
# interleaved rounds, one process; peak memory in fresh processes), d=256, 4 layers, 8 heads,
# B=2, T=1024 (override with T=...), RoPE baseline. Each engine variant runs beside its
# pre-engine form (score.kind=dense_sdpa: SDPA with the dense [T, T] mask / [H, T, T] bias, from
# benchmarks/dense_masks.py) and the per-head temperature plugin beside the baseline.
#   bash benchmarks/attention_engine_model.sh [OUT]     (default: an out file under /tmp)
# Pass DEVICE=cuda to time the same table on a GPU (benchmarks/gpu_h100.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/attention-engine-model}
T=${T:-1024}
DEVICE=${DEVICE:-cpu}
W=256
exec attnlab bench tiny --device "$DEVICE" --peers none --sections "${SECTIONS:-training,memory}" \
  --plugin examples/score_temperature.py --plugin benchmarks/dense_masks.py \
  --set model.d_model=256 --set model.n_layers=4 --set model.attention.n_heads=8 \
  --set model.max_seq_len="$T" --set model.position.kind=rope \
  --batch-size 2 --seq-len "$T" --steps "${STEPS:-2}" --repeats "${REPEATS:-4}" --warmup 1 \
  --variants baseline \
  --variant "temperature:score.kind=temperature" \
  --variant "materialised_temperature:score.kind=temperature,attention.backend=math" \
  --variant "alibi:position.kind=alibi" \
  --variant "alibi_dense:position.kind=alibi,score.kind=dense_sdpa" \
  --variant "t5:position.kind=t5" \
  --variant "t5_dense:position.kind=t5,score.kind=dense_sdpa" \
  --variant "sliding:mask.kind=sliding,mask.window=$W" \
  --variant "sliding_dense:mask.kind=sliding,mask.window=$W,score.kind=dense_sdpa" \
  --variant "local_global:mask.kind=local_global,mask.window=$W,mask.n_global=16,mask.global_every=512" \
  --variant "local_global_dense:mask.kind=local_global,mask.window=$W,mask.n_global=16,mask.global_every=512,score.kind=dense_sdpa" \
  --variant "bigbird:mask.kind=bigbird,mask.window=$W,mask.n_global=16,mask.block_size=64,mask.random_blocks=2" \
  --variant "bigbird_dense:mask.kind=bigbird,mask.window=$W,mask.n_global=16,mask.block_size=64,mask.random_blocks=2,score.kind=dense_sdpa" \
  --threads "${THREADS:-2}" --out "$OUT" --force
