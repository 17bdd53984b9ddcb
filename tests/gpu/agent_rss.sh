#!/usr/bin/env bash
# Where does the agent's resident memory go with every collector on? One GPU: a 1-rank NCCL torch
# job with the step hook under `perfd launch --kineto --flight-recorder` (its log tailed as a
# Megatron log), `perfd agent --launch-manifest` with NVML+GPM at 10 Hz and host metrics, streaming
# to an aggregator. Three agent runs of 40 s in turn: as shipped, MALLOC_ARENA_MAX=2, NVML off.
# For each: VmRSS, smaps_rollup (RSS split into anonymous and file-backed) and the 12 mappings that
# hold the most RSS. Usage (GPU machine): bash tests/gpu/agent_rss.sh OUT
set -u
OUT=${1:?OUT dir}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$ROOT:${PYTHONPATH:-}
cat > "$OUT/train.py" <<'PY'
import os, time, torch, torch.distributed as dist
from perfd.hook import StepHook
dist.init_process_group("nccl")
torch.cuda.set_device(0)
x = torch.randn(4096, 4096, device="cuda")
hook = StepHook(warmup_steps=2, cuda=True)
t0 = time.time()
i = 0
while time.time() - t0 < float(os.environ["RSS_SECONDS"]):
    with hook.step():
        y = x @ x
        dist.all_reduce(y)
        torch.cuda.synchronize()
    i += 1
    time.sleep(0.05)
dist.destroy_process_group()
PY
python3 -m perfd.app.cli aggregator --grpc-port 0 --http-port 0 --no-rules --ready-file "$OUT/agg.ready" > "$OUT/agg.out" 2>&1 &
AGG=$!
for i in $(seq 200); do [ -s "$OUT/agg.ready" ] && break; sleep 0.1; done
GP=$(cut -d' ' -f1 "$OUT/agg.ready")
RSS_SECONDS=150 python3 -m perfd.app.cli launch --job rss --kineto --flight-recorder "$OUT/fr" --agent-socket "$OUT/hook.sock" \
  --manifest "$OUT/launch.json" --log "$OUT/job.log" -- python3 -m torch.distributed.run --standalone --nproc_per_node 1 "$OUT/train.py" > "$OUT/launch.out" 2>&1 &
JOB=$!
for i in $(seq 300); do [ -s "$OUT/launch.json" ] && break; sleep 0.1; done
echo '{"batch_interval_s": 0.5, "collectors": {"nvml": {"source": "real", "interval_s": 0.1, "gpm": "auto", "devices": "all"}}}' > "$OUT/agent.json"
probe() {  # name, env..., -- agent extra args
  local name=$1; shift
  env "$@" python3 -m perfd.app.cli agent --config "$OUT/agent.json" --aggregator 127.0.0.1:$GP --launch-manifest "$OUT/launch.json" \
     --host on --metrics-port -1 ${AGENT_EXTRA:-} > "$OUT/$name.agent.out" 2>&1 &
  local pid=$!
  sleep 40
  {
    echo "== $name: VmRSS $(grep VmRSS /proc/$pid/status) threads $(ls /proc/$pid/task | wc -l)"
    grep -E "^(Rss|Pss|Anonymous|Shared_Clean|Private_Clean|Private_Dirty)" /proc/$pid/smaps_rollup
    python3 - "$pid" <<'PY'
import collections, sys
rss = collections.Counter(); name = None
for line in open(f"/proc/{sys.argv[1]}/smaps"):
    parts = line.split()
    if len(parts) >= 5 and "-" in parts[0] and ":" in parts[3]:
        name = parts[5] if len(parts) > 5 else "[anon]"
    elif parts[0] == "Rss:":
        rss[name] += int(parts[1])
for n, kb in rss.most_common(12):
    print(f"{kb / 1024:8.1f} MB  {n}")
PY
    grep -c . "$OUT/$name.agent.out"
  } | tee -a "$OUT/summary.txt"
  kill $pid; wait $pid 2>/dev/null
}
probe shipped X=1
probe arena2 MALLOC_ARENA_MAX=2
AGENT_EXTRA="--nvml off" probe nvml_off X=1
kill $JOB $AGG 2>/dev/null; wait 2>/dev/null
tail -5 "$OUT/job.log" >> "$OUT/summary.txt"
