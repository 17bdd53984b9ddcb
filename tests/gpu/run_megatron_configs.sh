#!/usr/bin/env bash
# Runs small real Megatron-LM jobs on a 2-GPU machine in several parallel layouts, so that
# perfd's FLOPs formula and log parser can be checked against Megatron's own figures.
# Megatron-LM itself is NOT part of this repository: point MEGATRON_DIR at a checkout of it
# (core 0.20 was used). Logs go to $OUT_DIR (default ./megatron-runs).
#   MEGATRON_DIR=/path/to/Megatron-LM OUT_DIR=/tmp/runs bash tests/gpu/run_megatron_configs.sh
set -u
MEGATRON_DIR=${MEGATRON_DIR:?set MEGATRON_DIR to a Megatron-LM checkout}
OUT_DIR=${OUT_DIR:-megatron-runs}
ITERS=${ITERS:-30}
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONUNBUFFERED=1

COMMON=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
  --max-position-embeddings 1024 --train-iters "$ITERS" --lr 1e-4 --lr-decay-style constant --bf16
  --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local
  --no-persist-layer-norm --no-gradient-accumulation-fusion --no-masked-softmax-fusion
  --log-throughput --timing-log-level 2 --eval-iters 0 --eval-interval 100000
  --log-straggler --disable-bias-linear)

run() {  # name, then Megatron arguments
  local name=$1; shift
  echo "=== $name: $*" | tee "$OUT_DIR/$name.cmd"
  local t0=$(date +%s)
  (cd "$MEGATRON_DIR" && timeout 240 torchrun --nproc_per_node 2 pretrain_gpt.py "${COMMON[@]}" "$@") \
    > "$OUT_DIR/$name.log" 2>&1
  echo "=== $name: exit $? in $(( $(date +%s) - t0 )) s"
  grep -c "iteration .*/" "$OUT_DIR/$name.log"
  grep "throughput per GPU" "$OUT_DIR/$name.log" | tail -1 | cut -c1-220
}

# Tensor parallel, MHA + GELU, tied embeddings; 'max' timer format.
run tp2_mha_gelu --tensor-model-parallel-size 2 --micro-batch-size 4 --global-batch-size 32 \
  --log-interval 1 --timing-log-option max
# Tensor parallel, SwiGLU + grouped-query attention + RoPE, untied embeddings.
run tp2_swiglu_gqa_untied --tensor-model-parallel-size 2 --micro-batch-size 4 --global-batch-size 32 \
  --swiglu --ffn-hidden-size 2816 --group-query-attention --num-query-groups 4 \
  --position-embedding-type rope --no-rope-fusion --untie-embeddings-and-output-weights --log-interval 1
# Interleaved pipeline (2 stages x 2 virtual), log every 2 iterations (timers are averages).
run pp2_vpp2_interleaved --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 \
  --micro-batch-size 4 --global-batch-size 64 --log-interval 2
# Data parallel with per-rank timer rows ('all' format) and the distributed optimizer.
run dp2_all_timers --micro-batch-size 4 --global-batch-size 64 --log-interval 1 \
  --timing-log-option all --use-distributed-optimizer
# Mixture of experts: 4 experts, top-2 routing, expert parallel 2.
run dp2_ep2_moe_top2 --micro-batch-size 4 --global-batch-size 32 --log-interval 1 \
  --num-experts 4 --moe-router-topk 2 --expert-model-parallel-size 2 --moe-ffn-hidden-size 2048 \
  --moe-token-dispatcher-type alltoall
