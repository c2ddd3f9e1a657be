#!/usr/bin/env bash
# Issue 13 on one GPU machine, in one call of at most 10 minutes, from a clean checkout:
#
#   bash benchmarks/gpu_h100.sh             # on the GPU machine (H100): writes
#                                           # benchmarks/results/cuda-<gpu>-<date>-torch<ver>.md/.json
#   bash benchmarks/gpu_h100.sh --dry-run   # anywhere, on CPU, tiny shapes: checks that every step
#                                           # runs; its file says it holds no GPU result
#
# 0. preflight (benchmarks/gpu_preflight.py): Python, a CUDA torch with a GPU, every package that
#    attnlab and its test extra need. The GPU machine has no internet: if anything is missing it
#    prints what to bring as a wheelhouse and how to install it, and stops (exit 3).
# 1. the gpu test set: python -m pytest -m gpu (but its determinism file, which step 2 repeats at
#    full size; GPU_SET=all runs it too)
# 2. train.deterministic (benchmarks/gpu_determinism.py): two identical deterministic runs, one
#    SIGKILLed and resumed, compared metrics file to metrics file; one ordinary run for the noise
#    it allows and the speed cost of deterministic mode
# 3. attnlab bench at gpt2-124m, B=16, T=1024, bf16, torch.compile: baseline, nanoGPT's model,
#    nonlinear query, pre-projection + skip; tokens/s, MFU, peak memory, decode tokens/s with and
#    without the KV cache
# 3b. issue 34's attention-engine table (benchmarks/attention_engine_model.sh with DEVICE=cuda):
#    the per-head temperature plugin, ALiBi, T5, sliding window, local+global and BigBird beside
#    the RoPE baseline (FlashAttention-2 through SDPA) and beside their pre-engine dense SDPA
#    forms, T=1024; on CUDA the engine runs flex (compiled once, its compile reported apart).
#    ENGINE=0 leaves it out; its budget T_ENGINE=120 is on top of the 570 s below
# 3c. tensor parallelism (issue 35), only where 2 GPUs are visible: torchrun --nproc_per_node=2
#    attnlab bench --tp 2 at gpt2-124m, bf16: cached greedy decode tokens/s whole and split over
#    the 2 GPUs (NCCL), greedy tokens equal, and per device the weights, the KV cache and the peak
#    allocated memory (bench_tp2.json); on one GPU it is recorded as not run
# 4. the results file (benchmarks/gpu_summary.py), with issue 13's item-4 targets met or not
#
# Each step has a time budget (seconds; override by environment): T_TESTS=240 T_DET=150
# T_BENCH=180 (T_TP=120 on a 2-GPU machine), 570 s in all plus preflight and summary; none of
# them has been timed on a GPU yet.
# PYTEST_K=EXPR narrows the test set. A step that fails or runs out of time is recorded as such
# and the next one runs. Work files go to runs/gpu-<date>/ (--out DIR to change).
# Exit status: 0 when every step succeeded (targets not met are reported, not failures), 1 if
# one did not, 3 if something must be installed first.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) WORK="$2"; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "gpu_h100.sh: unknown argument $1 (use --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

PY=${PY:-python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # a clean checkout: no install of attnlab needed
DATE=$(date -u +%F)
DRYFLAG=()
[ "$DRY" = 1 ] && DRYFLAG=(--dry-run)

"$PY" benchmarks/gpu_preflight.py "${DRYFLAG[@]}" || exit $?

TORCH=$("$PY" -c 'import torch; print(torch.__version__)')
if [ "$DRY" = 1 ]; then
  DEVICE="cpu (dry run)"
  SLUG="dryrun-cpu"
else
  DEVICE=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')
  SLUG="cuda-$(echo "$DEVICE" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^nvidia-//' -e 's/-$//')"
fi
WORK=${WORK:-runs/gpu-$DATE}
mkdir -p "$WORK"
if [ "$DRY" = 1 ]; then RESULT="$WORK/$SLUG-$DATE-torch$TORCH.md"
else RESULT="benchmarks/results/$SLUG-$DATE-torch$TORCH.md"; fi
KERNEL=$("$PY" -c '
import torch
from attnlab.model import linear_cross_entropy as l
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(l.resolve_kernel(l.KERNEL, dev, torch.bfloat16))')
echo "== $DEVICE, torch $TORCH, loss kernel $KERNEL; work files in $WORK, results in $RESULT"

STEPS=()
step() {  # step NAME BUDGET LOG COMMAND...: run with a time limit, remember exit code and time
  local name=$1 budget=$2 log=$3; shift 3
  local t0=$SECONDS
  echo "== $name (at most ${budget}s; log $log)"
  timeout -k 10 "$budget" "$@" >"$log" 2>&1
  local rc=$?
  STEPS+=(--step "$name=$rc:$((SECONDS - t0))")
  tail -n 3 "$log"
  return 0
}

# --- 1. the gpu test set -------------------------------------------------------------------------
# PYTEST_K narrows the set (pytest -k); the dry run's default skips compiling every variant on CPU
PYTEST=("$PY" -m pytest -m gpu -rs -p no:cacheprovider)
if [ "$DRY" = 1 ]; then
  PYTEST+=(-k "${PYTEST_K:-baseline and not unfused and not compiled or loss_kernels}")
  export ATTNLAB_GPU_TESTS_ON_CPU=1  # the test code on CPU, not a GPU result
elif [ -n "${PYTEST_K:-}" ]; then
  PYTEST+=(-k "$PYTEST_K")
fi
# tests/gpu/test_determinism.py checks at tiny size what step 2 checks at gpt2-124m size; it is left
# out here to stay within 10 minutes (GPU_SET=all keeps it)
[ "${GPU_SET:-}" = all ] || PYTEST+=(--ignore=tests/gpu/test_determinism.py)
step tests "${T_TESTS:-240}" "$WORK/pytest.log" "${PYTEST[@]}"
unset ATTNLAB_GPU_TESTS_ON_CPU

# --- 2. deterministic mode: equal metrics files, and its speed cost ------------------------------
if [ "$DRY" = 1 ]; then
  step determinism "${T_DET:-150}" "$WORK/determinism.log" "$PY" benchmarks/gpu_determinism.py \
    --out "$WORK/determinism" --dry-run --preset tiny --steps "${DRY_STEPS:-12}" --batch-size 4 \
    --seq-len 64
else
  step determinism "${T_DET:-150}" "$WORK/determinism.log" "$PY" benchmarks/gpu_determinism.py \
    --out "$WORK/determinism" --preset gpt2-124m --steps 30 --batch-size 8 --seq-len 256
fi

# --- 3. the item-4 bench table -------------------------------------------------------------------
if [ "$DRY" = 1 ]; then
  BENCH=(--preset tiny --device cpu --dtype float32 --seq-len 64 --batch-size 4 --steps 1
    --warmup 0 --repeats 1 --threads 2 --new-tokens 8 --decode-repeats 1)
else
  BENCH=(--preset gpt2-124m --device cuda --dtype bfloat16 --compile --seq-len 1024
    --batch-size 16 --steps 10 --warmup 2 --repeats 5 --new-tokens 256 --decode-repeats 3)
fi
step bench "${T_BENCH:-180}" "$WORK/bench.log" "$PY" -m attnlab bench "${BENCH[@]}" \
  --variants baseline,nonlinear_query,preproj_skip --peers nanogpt \
  --sections training,inference,memory --prompt-len 16 --out "$WORK/bench"

# --- 3b. issue 34: the attention engine's table (not measured on a GPU yet) ---------------------
if [ "${ENGINE:-1}" = 1 ]; then
  if [ "$DRY" = 1 ]; then
    step engine "${T_ENGINE:-120}" "$WORK/engine.log" env T=64 STEPS=1 REPEATS=1 THREADS=2 \
      SECTIONS=training bash benchmarks/attention_engine_model.sh "$WORK/attention-engine"
  else
    step engine "${T_ENGINE:-120}" "$WORK/engine.log" env DEVICE=cuda T=1024 STEPS=5 REPEATS=3 \
      bash benchmarks/attention_engine_model.sh "$WORK/attention-engine"
  fi
fi

# --- 3c. tensor parallelism: TP=2 decode tokens/s and memory per device ---------------------------
# (the dry run: 2 CPU processes over gloo at tiny shapes; a GPU machine: 2 GPUs over NCCL)
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$DRY" = 1 ]; then
  TP=(--preset tiny --device cpu --dtype float32 --threads 1 --new-tokens 8 --decode-repeats 1)
elif [ "$NGPU" -ge 2 ]; then
  TP=(--preset gpt2-124m --device cuda --dtype bfloat16 --new-tokens 256
    --decode-repeats 3)
fi
if [ "$DRY" = 1 ] || [ "$NGPU" -ge 2 ]; then
  step tp2 "${T_TP:-120}" "$WORK/bench_tp2.log" bash -c '"$0" -m torch.distributed.run \
    --standalone --nproc_per_node=2 -m attnlab bench "${@}" --variants baseline,nonlinear_query \
    --tp 2 --prompt-len 16 --json > "'"$WORK"'/bench_tp2.json"' "$PY" "${TP[@]}"
else
  echo "tensor parallelism: not run, $NGPU GPU(s) visible (needs 2)" > "$WORK/bench_tp2.log"
fi

# --- 4. the results file -------------------------------------------------------------------------
"$PY" benchmarks/gpu_summary.py --work "$WORK" --result "$RESULT" "${DRYFLAG[@]}" "${STEPS[@]}" \
  --header "device: $DEVICE; torch $TORCH; date $DATE (UTC); git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
  --header "loss kernel (ATTNLAB_LOSS_KERNEL=${ATTNLAB_LOSS_KERNEL:-auto}): $KERNEL" \
  --header "command: bash benchmarks/gpu_h100.sh${DRYFLAG[*]:+ ${DRYFLAG[*]}}" >/dev/null

for s in "${STEPS[@]}"; do
  case "$s" in *=0:*|--step) ;; *) echo "== a step did not succeed: ${s}" >&2; FAILED=1 ;; esac
done
echo "== wrote $RESULT"
exit "${FAILED:-0}"
