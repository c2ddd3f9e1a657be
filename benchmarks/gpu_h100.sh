#!/usr/bin/env bash
# GPU speed targets of issue 7, for a machine with NVIDIA H100 GPUs.
#
#   bash benchmarks/gpu_h100.sh            # all GPUs visible: single-GPU bench + DDP run
#
# 1. `attnlab bench` at gpt2-124m (12 x 768, T=1024), bf16 autocast, torch.compile, every subject
#    interleaved: target baseline MFU >= 45% of the datasheet bf16 peak (H100 SXM: 989 TFLOP/s
#    dense; the SKU assumed is printed from the device name), with the measured-peak MFU beside it.
# 2. DDP through torchrun over all GPUs: `attnlab train gpt2-124m` for a short run; tokens/s and
#    MFU (measured peak) come from its metrics.jsonl, datasheet MFU is derived below.
# Results land in benchmarks/results/cuda-<gpu>-<date>*.md/.json.
set -euo pipefail
cd "$(dirname "$0")/.."

NGPU=${NGPU:-$(python -c 'import torch; print(torch.cuda.device_count())')}
BATCH=${BATCH:-16}
if [ "$NGPU" -lt 1 ]; then echo "no CUDA device visible" >&2; exit 2; fi
python -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'

# --- 1. single GPU, all variants and peers at equal config -------------------------------------
attnlab bench --preset gpt2-124m --device cuda --dtype bfloat16 --compile \
  --seq-len 1024 --batch-size "$BATCH" --steps 10 --warmup 2 --repeats 5 \
  --variants baseline,baseline_unfused,nonlinear_query,nonlinear_query_unfused,identity_query,preproj_skip,identity_head,moe_values \
  --peers nanogpt,hf_gpt2,x_transformers \
  --prompt-len 16 --new-tokens 256 --decode-repeats 3 --save

# the variants that materialise [B, H, T, T] attention (O(T^2 H) memory), at a smaller batch
attnlab bench --preset gpt2-124m --device cuda --dtype bfloat16 --compile \
  --seq-len 1024 --batch-size 4 --steps 10 --warmup 2 --repeats 5 \
  --variants baseline,virtual_heads,explicit_attention --peers none \
  --sections training,memory --out "benchmarks/results/cuda-gpt2-124m-explicit-$(date -u +%F)"

python - <<'PY'
import glob, json, os
path = max(glob.glob("benchmarks/results/cuda-*-gpt2-124m.json"), key=os.path.getmtime)
r = json.load(open(path))
base = next(row for row in r["training"] if row["name"] == "baseline")
sheet = base["mfu_datasheet"]
print(f"{path}: baseline {base['tokens_per_s']:,.0f} tok/s, MFU {100*base['mfu_measured']:.1f}% "
      f"of measured peak, {100*sheet:.1f}% of datasheet ({r['machine']['datasheet_sku']})"
      if sheet is not None else f"{path}: no datasheet peak for {r['machine']['device_name']}")
print("target MFU >= 45% vs datasheet:", "MET" if sheet and sheet >= 0.45 else "NOT MET")
PY

# --- 2. DDP over all GPUs ----------------------------------------------------------------------
RUN=runs/bench-ddp-gpt2-124m
torchrun --standalone --nproc_per_node="$NGPU" -m attnlab train gpt2-124m --out "$RUN" --restart \
  --set train.max_steps=60 --set train.warmup_steps=10 --set train.compile=true \
  --set train.dtype=bfloat16 --set train.device=cuda --set train.batch_size="$BATCH" \
  --set train.tokens_per_step=$((BATCH * 1024 * NGPU)) \
  --set train.eval_every=1000 --set train.checkpoint_every=1000 --set train.log_every=10

python - "$RUN" "$NGPU" <<'PY'
import json, sys
import torch
from attnlab.bench.machine import datasheet_peak
from attnlab.config import load_config
from attnlab.model import build_model
run, ngpu = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if l.strip()]
rows = [r for r in rows if r.get("tokens_per_s")][-3:]  # after compile and warmup
tps = sum(r["tokens_per_s"] for r in rows) / len(rows)
with torch.device("meta"):
    fwd = build_model(load_config("gpt2-124m").model).flops_per_token(1024)
sheet = datasheet_peak(torch.cuda.get_device_name(0), torch.bfloat16)
mfu_sheet = 3 * fwd * tps / (sheet[1] * ngpu) if sheet else float("nan")
print(f"DDP x{ngpu}: {tps:,.0f} tok/s, MFU (measured peak) {100*rows[-1]['mfu']:.1f}%, "
      f"MFU (datasheet {sheet[0] if sheet else '?'}) {100*mfu_sheet:.1f}%")
PY
