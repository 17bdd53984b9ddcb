#!/usr/bin/env bash
# The PP=2 question (a 2026-11-21 nsys capture of Megatron-LM PP=2 showed no NCCL kernel
# on its second device): the same PP=2 run, each rank in its own nsys session (`perfd nsys-prefix`,
# nothing killed), both sessions recorded for the same 3 s window in steady state (`nsys start` /
# `nsys stop` from outside: no stall), then `perfd analyze nsys --check-sql` on each rank's report.
#   source .gpu-libs/nsys-env.sh; MEGATRON_DIR=... bash tests/gpu/megatron_pp2_sessions.sh OUT_DIR
set -u
OUT=${1:?output dir}; mkdir -p "$OUT"
MEGATRON_DIR=${MEGATRON_DIR:?set MEGATRON_DIR}
NSYS=${PERFD_NSYS:?source .gpu-libs/nsys-env.sh first}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$ROOT:$MEGATRON_DIR:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=1
PREFIX=$(python3 -m perfd.app.cli nsys-prefix --job pp2)
echo "prefix: $PREFIX" | tee "$OUT/driver.log"
(cd "$MEGATRON_DIR" && timeout 260 python3 -m torch.distributed.run --nproc_per_node 2 --no-python $PREFIX \
  python3 pretrain_gpt.py --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 1024 --num-attention-heads 16 \
  --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 64 \
  --train-iters 2000 --lr 1e-4 --lr-decay-style constant --bf16 --mock-data \
  --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local \
  --no-persist-layer-norm --no-gradient-accumulation-fusion --no-masked-softmax-fusion \
  --log-interval 1 --log-throughput --timing-log-level 2 --eval-iters 0 --eval-interval 100000 \
  --disable-bias-linear) > "$OUT/megatron.log" 2>&1 &
JOB=$!
# Wait for steady state: iteration 40 logged.
for i in $(seq 1 400); do grep -qE "iteration +40/" "$OUT/megatron.log" 2>/dev/null && break; sleep 0.5; done
grep -E "iteration +40/" "$OUT/megatron.log" | cut -c1-200 | tee -a "$OUT/driver.log"
"$NSYS" sessions list 2>&1 | tee -a "$OUT/driver.log"
for r in 0 1; do "$NSYS" start --session=perfd-pp2-r$r --sample=none --cpuctxsw=none --force-overwrite=true -o "$OUT/rank$r" 2>&1 | tee -a "$OUT/driver.log"; done
echo "window start $(date +%s.%N)" | tee -a "$OUT/driver.log"
sleep 3
for r in 0 1; do "$NSYS" stop --session=perfd-pp2-r$r 2>&1 | grep -v "^\[" | tee -a "$OUT/driver.log"; done
echo "window stopped $(date +%s.%N)" | tee -a "$OUT/driver.log"
kill -TERM $JOB 2>/dev/null; sleep 5; pkill -f pretrain_gpt.py; wait $JOB 2>/dev/null
for r in 0 1; do
  python3 -m perfd.app.cli analyze nsys "$OUT/rank$r.nsys-rep" --json --check-sql > "$OUT/rank${r}_analysis.json" 2> "$OUT/rank${r}_analysis.err"
  echo "analyze rank $r exit $?"
  python3 - "$OUT/rank${r}_analysis.json" "$r" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
sql = d["sql_check"]["devices"]
for dev in d["devices"]:
    ref = sql.get(dev["device"]) or sql.get(str(dev["device"]))
    print(f"rank {sys.argv[2]} device {dev['device']}: span {dev['span_ms']:.1f} busy {dev['busy_ms']:.2f} "
          f"(SQL {ref['busy_union_ms']:.2f}) NCCL {dev['comm_ms']:.2f} (SQL {ref['nccl_union_ms']:.2f}) "
          f"SendRecv {dev['sendrecv_ms']:.1f} exposed {dev['comm_exposed_ms']:.1f} kernels {dev.get('kernel_count')}")
PY
done 2>&1 | tee "$OUT/summary.txt"
grep "iteration .*/" "$OUT/megatron.log" | tail -2 | cut -c1-200 | tee -a "$OUT/summary.txt"
rm -f "$OUT"/*.nsys-rep "$OUT"/*.sqlite
