#!/usr/bin/env bash
# The GPU check, one prepared run (under 8 minutes): NCCL data plane, tensor-parallel
# equality (TP = 2 vs TP = 1; two ranks on one GPU when only one is visible), then ar / sd / psd on
# random-weight real-size models (Qwen3-32B-shaped target, Qwen3-1.7B-shaped draft) with
# synthetic acceptance. One GPU: drafter and verifier share it; several: drafter on its own.
#
#   scripts/gpu_check.sh OUT_DIR              # on a CUDA machine
#   scripts/gpu_check.sh OUT_DIR --device cpu # dry run of the same path at tiny sizes
set -euo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [--device cpu]}
DEVICE=${3:-cuda}
[[ "${2:-}" == "--device" ]] || DEVICE=cuda
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY=${PYTHON:-python3}   # the interpreter that has the project installed
MODELS=$(mktemp -d)

if [[ "$DEVICE" == "cuda" ]]; then
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
  $PY scripts/make_model_config.py qwen3-32b "$MODELS/target"
  $PY scripts/make_model_config.py qwen3-1.7b "$MODELS/draft"
  TARGET_DEV=cuda:0; DRAFT_DEV=cuda:$(( NGPU > 1 ? 1 : 0 )); DTYPE=bfloat16; PLANE=inband
  [[ $NGPU -gt 1 ]] && PLANE=gloo
  BLOCKS=2048; CONC="16 32"; KS="2 4"; WARMUP=3
else
  NGPU=0
  $PY scripts/make_model_config.py tiny-target "$MODELS/target"
  $PY scripts/make_model_config.py tiny-draft "$MODELS/draft"
  TARGET_DEV=cpu; DRAFT_DEV=cpu; DTYPE=float32; PLANE=gloo; BLOCKS=512; CONC="4"; KS="2"; WARMUP=0
fi
echo "device=$DEVICE gpus=$NGPU target=$TARGET_DEV draft=$DRAFT_DEV data_plane=$PLANE" | tee "$OUT/setup.txt"

# 1. The data plane: one step over the pair group (NCCL needs two GPUs; gloo otherwise).
$PY scripts/check_data_plane.py 2>&1 | tee "$OUT/data_plane.txt"

# 2. Tensor parallelism: TP = 2 gives TP = 1's logits and greedy tokens.
$PY scripts/check_tensor_parallel.py --device "$DEVICE" 2>&1 | tee "$OUT/tensor_parallel.txt"

# 3. The modes side by side on real-size shapes, synthetic acceptance 0.8.
$PY -m minedraft.cli bench --modes ar sd psd --k $KS --concurrency $CONC --max-tokens 64 \
  --target "$MODELS/target" --draft "$MODELS/draft" --random-weights --synthetic-acceptance 0.8 \
  --dtype $DTYPE --target-device $TARGET_DEV --draft-device $DRAFT_DEV --data-plane $PLANE \
  --num-blocks $BLOCKS --all-cpus 0-1 --warmup-s $WARMUP --out "$OUT" 2>&1 | tr '\r' '\n' | grep -v 'req/s]' | tee "$OUT/bench.txt"
