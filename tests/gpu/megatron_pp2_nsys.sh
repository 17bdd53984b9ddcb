#!/usr/bin/env bash
# A real Megatron-LM PP=2 run (the shared fixture's configuration) under nsys for a 3 s window in
# steady state, then `perfd analyze nsys --check-sql` on the report: perfd's per-device busy, idle
# and NCCL time against a plain SQL sum over the same export. Megatron-LM is not part of this
# repository: MEGATRON_DIR points at a checkout (core 0.20 was used).
#   source .gpu-libs/nsys-env.sh; MEGATRON_DIR=... bash tests/gpu/megatron_pp2_nsys.sh OUT_DIR
set -u
OUT=${1:?output dir}; mkdir -p "$OUT"
MEGATRON_DIR=${MEGATRON_DIR:?set MEGATRON_DIR}
NSYS=${PERFD_NSYS:?source .gpu-libs/nsys-env.sh first}
WORK=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=1
(cd "$MEGATRON_DIR" && timeout 200 "$NSYS" profile -o "$WORK/pp2" --trace=cuda,nvtx --sample=none \
  --cpuctxsw=none --delay "${DELAY:-45}" --duration 3 --kill=sigterm --force-overwrite=true \
  torchrun --nproc_per_node 2 pretrain_gpt.py --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 1024 --num-attention-heads 16 \
  --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 64 \
  --train-iters 400 --lr 1e-4 --lr-decay-style constant --bf16 --mock-data \
  --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local \
  --no-persist-layer-norm --no-gradient-accumulation-fusion --no-masked-softmax-fusion \
  --log-interval 1 --log-throughput --timing-log-level 2 --eval-iters 0 --eval-interval 100000 \
  --disable-bias-linear) > "$OUT/megatron_nsys.log" 2>&1
echo "nsys profile exit $?"
ls -la "$WORK"
python3 -m perfd.app.cli analyze nsys "$WORK/pp2.nsys-rep" --json --check-sql > "$OUT/pp2_analysis.json"
echo "analyze exit $?"
python3 - "$OUT/pp2_analysis.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
sql = d["sql_check"]["devices"]
for dev in d["devices"]:
    ref = sql.get(dev["device"]) or sql.get(str(dev["device"]))
    print(f"device {dev['device']}: span {dev['span_ms']:.1f} busy {dev['busy_ms']:.2f} (SQL {ref['busy_union_ms']:.2f}) "
          f"idle {dev['idle_ms']:.1f} NCCL {dev['comm_ms']:.2f} (SQL {ref['nccl_union_ms']:.2f}) "
          f"SendRecv {dev['sendrecv_ms']:.1f} exposed {dev['comm_exposed_ms']:.1f}")
PY
grep "iteration .*/" "$OUT/megatron_nsys.log" | tail -2 | cut -c1-160
