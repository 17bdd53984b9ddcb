#!/usr/bin/env bash
# Can an nsys interactive session record step-aligned ranges, each reported when it closes? One GPU,
# a CUDA loop under `nsys launch --session-new` that opens a cudaProfilerApi range at ~6 s and ~16 s
# (each 2 s long) and runs to ~26 s; before each range the driver runs
# `nsys start --session=S -c cudaProfilerApi --capture-range-end=stop -o OUT_i`, then watches for
# OUT_i.nsys-rep. Usage (GPU machine): source .gpu-libs/nsys-env.sh; bash tests/gpu/nsys_session_range.sh OUT
# Why: nsys_range_timing.sh showed that `nsys profile -c cudaProfilerApi
# --capture-range-end=repeat` (nsys 2025.3.1) writes every range's report only at process exit.
set -u
OUT=${1:?OUT dir}
mkdir -p "$OUT"
NSYS=${PERFD_NSYS:?source .gpu-libs/nsys-env.sh first}
cat > /tmp/rng2.py <<'PY'
import time, torch
x = torch.randn(4096, 4096, device="cuda")
rt = torch.cuda.cudart()
t0 = time.time()
ranges = [(6, 8), (16, 18)]
state = [0, 0]
while time.time() - t0 < 26:
    y = x @ x
    torch.cuda.synchronize()
    el = time.time() - t0
    for i, (a, b) in enumerate(ranges):
        if state[i] == 0 and el > a:
            rt.cudaProfilerStart(); state[i] = 1; print(f"START{i} {time.time():.3f}", flush=True)
        if state[i] == 1 and el > b:
            torch.cuda.synchronize(); rt.cudaProfilerStop(); state[i] = 2; print(f"STOP{i} {time.time():.3f}", flush=True)
print(f"EXIT {time.time():.3f}", flush=True)
PY
S=perfd-rngtest
( timeout 90 "$NSYS" launch --session-new=$S --trace=cuda,nvtx python3 /tmp/rng2.py > "$OUT/app.log" 2>&1; echo "APP_DONE $(date +%s.%N)" >> "$OUT/app.log" ) &
APP=$!
watch() {  # file
  for i in $(seq 1 200); do [ -f "$1" ] && { echo "SEEN $1 $(date +%s.%N)"; return; }; sleep 0.1; done; echo "NOT_SEEN $1"
}
sleep 2
for i in 0 1; do
  echo "START_CMD$i $(date +%s.%N)"
  timeout 30 "$NSYS" start --session=$S -c cudaProfilerApi --capture-range-end=stop --sample=none --cpuctxsw=none \
      --force-overwrite=true -o "$OUT/r$i" 2>&1 | sed "s/^/start$i: /"
  echo "START_CMD_RC$i ${PIPESTATUS[0]} $(date +%s.%N)"
  watch "$OUT/r$i.nsys-rep"
  timeout 10 "$NSYS" sessions list 2>&1 | sed "s/^/sessions$i: /"
  sleep 1
done 2>&1 | tee "$OUT/driver.log"
wait $APP
cat "$OUT/app.log" | grep -v "^\[" | head -30
ls -la "$OUT"
for f in "$OUT"/r*.nsys-rep; do [ -f "$f" ] && "$NSYS" stats -q --report cuda_gpu_kern_sum --format csv "$f" 2>/dev/null | head -3; done | tee "$OUT/stats.txt"
rm -f "$OUT"/*.nsys-rep "$OUT"/*.sqlite
