# What does a process under ncu with profiling off pay per kernel launch? A launch-heavy loop.
NCU=$(ls -d /opt/nvidia/nsight-compute/*/ncu | head -1)
cat > /tmp/tiny.py <<'PY'
import time, torch, sys
x = torch.zeros(1024, device="cuda")
for step in range(1, 31):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(2000): x.add_(1.0)
    torch.cuda.synchronize()
    if step > 5: print(f"step {step} {1000*(time.perf_counter()-t):.2f} ms", flush=True)
PY
run() { echo "== $1"; shift; "$@" python3 /tmp/tiny.py 2>/dev/null | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {print "median ms per 2000 launches:", a[int(NR/2)+1]}'; }
run "no ncu" env
run "ncu off, no filter" $NCU --profile-from-start off --target-processes all --launch-count 40 --clock-control none -o /tmp/r1 -f
run "ncu off, regex filter" $NCU --profile-from-start off --target-processes all --launch-count 40 --clock-control none --kernel-name "regex:^(vectorized_elementwise_kernel|nvjet_x)$" -o /tmp/r2 -f
run "ncu off, regex filter, mangled base" $NCU --profile-from-start off --target-processes all --launch-count 40 --clock-control none --kernel-name-base mangled --kernel-name "regex:elementwise" -o /tmp/r3 -f
run "ncu off, application-only" $NCU --profile-from-start off --target-processes application-only --launch-count 40 --clock-control none -o /tmp/r4 -f
run "ncu off, no launch-count" $NCU --profile-from-start off --target-processes all --clock-control none -o /tmp/r5 -f
