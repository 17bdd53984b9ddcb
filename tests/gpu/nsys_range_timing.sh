#!/usr/bin/env bash
# When does nsys write a cudaProfilerApi range's report? One GPU, a CUDA loop that opens a range at
# ~4 s, closes it at ~6 s and runs on to ~40 s; each variant's report directory is watched and the
# time its .nsys-rep appears is printed (relative to the range's close). Usage (GPU machine):
#   source .gpu-libs/nsys-env.sh; bash tests/gpu/nsys_range_timing.sh OUT
# Why: the rule path's nsys range was reported only at process exit. Run on an H100 with
# nsys 2025.3.1: docs/evidence/README.md "nsys ranges reported when they close".
set -u
OUT=${1:?OUT dir}
mkdir -p "$OUT"
NSYS=${PERFD_NSYS:?source .gpu-libs/nsys-env.sh first}
"$NSYS" --version | tee "$OUT/nsys_version.txt"
cat > /tmp/rng.py <<'PY'
import sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
rt = torch.cuda.cudart()
t0 = time.time()
opened = closed = False
while time.time() - t0 < float(sys.argv[1]):
    y = x @ x
    torch.cuda.synchronize()
    el = time.time() - t0
    if not opened and el > 4:
        rt.cudaProfilerStart(); opened = True; print(f"START {time.time():.3f}", flush=True)
    if opened and not closed and el > 6:
        torch.cuda.synchronize(); rt.cudaProfilerStop(); closed = True; print(f"STOP {time.time():.3f}", flush=True)
print(f"EXIT {time.time():.3f}", flush=True)
PY
run() {  # name, extra nsys args...
  local name=$1; shift
  local d="$OUT/$name"; mkdir -p "$d"
  ( timeout 120 "$NSYS" profile -c cudaProfilerApi "$@" --trace=cuda,nvtx --sample=none --cpuctxsw=none \
      --force-overwrite=true -o "$d/rep" python3 /tmp/rng.py 40 > "$d/app.log" 2>&1; echo "NSYS_DONE $(date +%s.%N)" >> "$d/app.log" ) &
  local pid=$!
  ( for i in $(seq 1 400); do
      for f in "$d"/rep*.nsys-rep; do [ -f "$f" ] && ! grep -q "$f" "$d/seen" 2>/dev/null && echo "$f $(date +%s.%N)" >> "$d/seen"; done
      sleep 0.25; kill -0 $pid 2>/dev/null || break
    done ) &
  wait $pid
}
run repeat --capture-range-end=repeat &
run stop --capture-range-end=stop &
run repeat_flush --capture-range-end=repeat --flush-on-cudaprofilerstop=true &
wait
for v in repeat stop repeat_flush; do
  echo "== $v"; cat "$OUT/$v/app.log" | grep -E "START|STOP|EXIT|NSYS_DONE|rror|arning" | head; cat "$OUT/$v/seen" 2>/dev/null; ls -la "$OUT/$v"
done | tee "$OUT/summary.txt"
rm -f "$OUT"/*/rep*.nsys-rep "$OUT"/*/rep*.qdstrm
