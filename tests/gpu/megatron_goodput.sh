#!/usr/bin/env bash
# Records the Megatron-LM logs that goodput's checkpoint, evaluation, restart and redone parts are
# checked on (perfd.analytics.steps.goodput; tests/analytics/test_goodput_recorded.py, on the H100
# recordings tests/data/megatron/h100_resume_*.log). On a 1- or 2-GPU machine, one job, two runs appended to ONE log, as a job
# restarted by its scheduler writes it:
#   run 1: --save DIR --save-interval 20 --eval-interval 25, stopped by --exit-interval 50 after
#          iteration 50 (saves at 20, 40 and the final one at 50; evaluations at 25 and 50);
#   run 2: the same command with --load DIR and --train-iters 80: resumes from iteration 50.
# Then a third log where run 2 resumes from an OLDER checkpoint (iteration 40: the tracker file is
# rewritten), so iterations 41-50 are trained again (goodput's "redone").
# Megatron-LM is NOT part of this repository: point MEGATRON_DIR at a checkout (core 0.20 was used).
#   MEGATRON_DIR=/path/to/Megatron-LM OUT_DIR=/tmp/goodput bash tests/gpu/megatron_goodput.sh
# Then copy $OUT_DIR/{resume,resume_older}.log(+.cmd) to tests/data/megatron/ and check:
#   perfd analyze megatron $OUT_DIR/resume.log --gpu "NVIDIA H200" --json | jq .summary.goodput
# What it proves: runs == 2; checkpoint = the sum of the save-checkpoint timers (and of
# 'successfully saved' − 'saving checkpoint' stamps) within 1%; evaluation = the evaluate timers;
# restart = run 2's first step start − run 1's last step end − the final save; the parts add up.
set -u
MEGATRON_DIR=${MEGATRON_DIR:?set MEGATRON_DIR to a Megatron-LM checkout}
OUT_DIR=${OUT_DIR:-megatron-goodput}
NPROC=${NPROC:-2}  # GPUs (one is enough for the goodput parts)
NAMES=${NAMES:-resume resume_older}
ITERS=${ITERS:-80}; FIRST=${FIRST:-50}  # train-iters of the job; where run 1 stops
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONUNBUFFERED=1

COMMON=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
  --max-position-embeddings 1024 --lr 1e-4 --lr-decay-style constant --bf16
  --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local
  --no-persist-layer-norm --no-gradient-accumulation-fusion --no-masked-softmax-fusion
  --log-throughput --timing-log-level 2 --timing-log-option all --log-straggler --disable-bias-linear
  --micro-batch-size 4 --global-batch-size 64 --log-interval 1
  --eval-interval ${EVAL_INTERVAL:-25} --eval-iters 5 --save-interval ${SAVE_INTERVAL:-20} --ckpt-format torch_dist)

run() {  # log name, then Megatron arguments; appends to the log
  local name=$1; shift
  echo "=== $name: $*" >> "$OUT_DIR/$name.cmd"
  (cd "$MEGATRON_DIR" && timeout "${RUN_TIMEOUT:-400}" torchrun --nproc_per_node "$NPROC" pretrain_gpt.py "${COMMON[@]}" "$@") \
    >> "$OUT_DIR/$name.log" 2>&1
  echo "=== $name: exit $?"
}

for name in $NAMES; do
  rm -rf "$OUT_DIR/ckpt-$name" "$OUT_DIR/$name.log" "$OUT_DIR/$name.cmd"
  run "$name" --save "$OUT_DIR/ckpt-$name" --train-iters "$ITERS" --exit-interval "$FIRST"
  if [ "$name" = resume_older ]; then
    # resume from an earlier save (OLDER, default 40): the iterations after it are trained again
    echo "${OLDER:-40}" > "$OUT_DIR/ckpt-$name/latest_checkpointed_iteration.txt"
  fi
  run "$name" --save "$OUT_DIR/ckpt-$name" --load "$OUT_DIR/ckpt-$name" --train-iters "$ITERS"
  grep -c "saving checkpoint at iteration" "$OUT_DIR/$name.log"
  grep -c "validation loss at iteration" "$OUT_DIR/$name.log"
  grep "loading .*checkpoint from\|successfully loaded checkpoint" "$OUT_DIR/$name.log" | head -4
done
