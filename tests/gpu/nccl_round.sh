#!/usr/bin/env bash
# One 2-GPU round for the NCCL timings and the rule path (run from the repository root on the
# GPU machine; OUT is where everything is written as it happens):
#   PARTS=fixtures,pp2,nsys MEGATRON_DIR=... bash tests/gpu/nccl_round.sh OUT
#   fixtures: Flight Recorder dumps of a batch_isend_irecv job and of an only-active job, with NCCL
#             Inspector files when the plugin is in .gpu-libs/ (tests/gpu/make_nccl_fixtures.py)
#   pp2:      Megatron-LM PP=2 under `perfd launch`, Flight Recorder share vs Kineto timeline
#   dp2:      the same for DP=2
#   nsys:     a rule → an nsys range of 3 steps on one rank (tests/gpu/verify_rule_capture.py)
#   overhead: `perfd bench overhead` (paired Megatron-LM runs)
set -u
DEST=${1:?usage: nccl_round.sh OUT}
# Everything is written under a work folder and packed into DEST/round.tgz at the end (and after
# each part), so that a few files carry back all of it.
OUT=/tmp/perfd_round
mkdir -p "$OUT" "$DEST"
pack() { find "$OUT" -type f -size +20M -delete; tar -czf "$DEST/round.tgz" -C /tmp perfd_round; }
PARTS=${PARTS:-fixtures,pp2,nsys}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
export NCCL_NVLS_ENABLE=0
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } 2>&1 | tee "$OUT/machine.txt"
if has fixtures; then
  timeout 240 python3 tests/gpu/make_nccl_fixtures.py "$OUT/nccl_fixtures" batch_p2p,only_active 2>&1 | tee "$OUT/fixtures.log"; pack
fi
if has pp2; then
  MEGATRON_PP=2 timeout 330 python3 tests/gpu/megatron_pp2_live.py "$OUT/pp2" 2>&1 | tail -60 | tee "$OUT/pp2.log"; pack
fi
if has dp2; then
  MEGATRON_PP=1 timeout 330 python3 tests/gpu/megatron_pp2_live.py "$OUT/dp2" 2>&1 | tail -60 | tee "$OUT/dp2.log"; pack
fi
if has nsys; then
  ( source .gpu-libs/nsys-env.sh && timeout 200 python3 tests/gpu/verify_rule_capture.py "$OUT/rule_nsys" --tool nsys ) 2>&1 | tail -60 | tee "$OUT/rule_nsys.log"; pack
fi
if has overhead; then
  timeout 560 python3 -m perfd.app.cli bench overhead "$OUT/overhead" ${OVERHEAD_ARGS:-} 2>&1 | tee "$OUT/overhead.log"; pack
fi
pack
ls -la "$DEST"
