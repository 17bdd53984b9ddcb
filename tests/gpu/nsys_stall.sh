#!/usr/bin/env bash
# How long does each way of taking an nsys capture stall the process being captured? One GPU, one
# process under `nsys launch --session-new` running short CUDA iterations and logging every
# iteration over 0.1 s and how long its cudaProfilerStart/Stop calls took. Three captures of ~0.5 s:
#   A  nsys start -c cudaProfilerApi --capture-range-end=stop   (the app's range at ~6 s)
#   B  nsys start (no range) ... nsys stop 0.5 s later          (time window at ~15 s)
#   C  nsys start -c cudaProfilerApi --capture-range-end=repeat (range at ~26 s), nsys stop at ~29 s
# Usage (GPU machine): source .gpu-libs/nsys-env.sh; bash tests/gpu/nsys_stall.sh OUT
set -u
OUT=${1:?OUT dir}
mkdir -p "$OUT"
NSYS=${PERFD_NSYS:?source .gpu-libs/nsys-env.sh first}
cat > /tmp/stall.py <<'PY'
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
rt = torch.cuda.cudart()
for _ in range(20):
    x @ x
torch.cuda.synchronize()
print(f"READY {time.time():.3f}", flush=True)
t0 = time.time()
ranges = {6.0: "A", 26.0: "C"}
open_at = None
last = time.time()
while time.time() - t0 < 34:
    for _ in range(4):
        y = x @ x
    torch.cuda.synchronize()
    now = time.time()
    el = now - t0
    for at, name in list(ranges.items()):
        if el > at:
            a = time.time(); rt.cudaProfilerStart(); b = time.time()
            print(f"START{name} at {a:.3f} took {b - a:.3f}", flush=True)
            open_at = (name, b); del ranges[at]
    if open_at and time.time() - open_at[1] > 0.5:
        torch.cuda.synchronize()
        a = time.time(); rt.cudaProfilerStop(); b = time.time()
        print(f"STOP{open_at[0]} at {a:.3f} took {b - a:.3f}", flush=True)
        open_at = None
    now = time.time()
    if now - last > 0.1:
        print(f"GAP {now - last:.3f} ending {now:.3f}", flush=True)
    last = now
print(f"EXIT {time.time():.3f}", flush=True)
PY
S=perfd-stall
( timeout 120 "$NSYS" launch --session-new=$S --trace=cuda,nvtx python3 /tmp/stall.py > "$OUT/app.log" 2>&1 ) &
APP=$!
for i in $(seq 1 600); do grep -q READY "$OUT/app.log" 2>/dev/null && break; sleep 0.1; done
T0=$(date +%s.%N)
at() { python3 -c "import sys, time; time.sleep(max(0.0, float(sys.argv[1]) + float(sys.argv[2]) - time.time()))" "$T0" "$1"; }
{
  at 3;  echo "A start $(date +%s.%N)"; "$NSYS" start --session=$S -c cudaProfilerApi --capture-range-end=stop --sample=none --cpuctxsw=none --force-overwrite=true -o "$OUT/A"; echo "A start returned $(date +%s.%N)"
  at 15; echo "B start $(date +%s.%N)"; "$NSYS" start --session=$S --sample=none --cpuctxsw=none --force-overwrite=true -o "$OUT/B"; echo "B started $(date +%s.%N)"
  sleep 0.5; echo "B stop $(date +%s.%N)"; "$NSYS" stop --session=$S; echo "B stop returned $(date +%s.%N)"
  at 23; echo "C start $(date +%s.%N)"; "$NSYS" start --session=$S -c cudaProfilerApi --capture-range-end=repeat --sample=none --cpuctxsw=none --force-overwrite=true -o "$OUT/C"; echo "C start returned $(date +%s.%N)"
  at 30; echo "C stop $(date +%s.%N)"; "$NSYS" stop --session=$S; echo "C stop returned $(date +%s.%N)"
} > "$OUT/driver.log" 2>&1
wait $APP
grep -v "^\[\|^\r" "$OUT/app.log" | tr '\r' '\n' | grep -E "READY|START|STOP|GAP|EXIT|Generat|rror" | tee "$OUT/summary.txt"
cat "$OUT/driver.log" | grep -v "^\[" | tee -a "$OUT/summary.txt"
ls -la "$OUT"/*.nsys-rep 2>&1 | tee -a "$OUT/summary.txt"
rm -f "$OUT"/*.nsys-rep
