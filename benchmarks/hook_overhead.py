"""Host cost of the perfd step hook (docs/design.md §4 target: <= 10 µs per step on the training
thread, never blocking).

What is timed is the training thread inside the hook calls: ``step_begin()`` (+ ``data_ready()``)
and ``step_end()``, each pair on its own, median and p99, minus the cost of the timer itself. With
CUDA events the hook only records events there; querying, elapsed times, records and sending run on
its harvester thread, whose CPU time per step is given in the notes ("harvester ... ns/step"):
that work still takes the GIL, so the paired loop rows are the end-to-end check.

CPU part (runs anywhere, torch not needed):
  - host timing (harvested inline in step_end) with the agent absent, present (drained by another
    process) and slow (bound, never read); batched (default) and unbatched (one datagram a step);
  - with steps of 20 µs of host work that release the GIL once (as a torch op does): host timing
    with the harvester thread (``harvest_interval_s=0.05``) and inline, and the CUDA step path with
    no-op events (no GPU: the hook's Python around the event record) with the harvester thread
    (the CUDA default) and inline;
  - encoding one step record: ``struct`` (what the hook uses) against ``json.dumps``.
GPU part (``--gpu``, needs torch with CUDA):
  - the CUDA calls one by one with an idle launch queue (torch API and perfd's driver fast path);
  - the training-thread cost per step with CUDA events: 1 event a step (the default), 2 events
    (``cuda_data_event=True``), the harvester inline on the training thread
    (``harvest_interval_s=0``, as the hook did before), and through the torch API;
  - a cross-check that the driver and torch paths measure the same GPU time;
  - paired loop timing: the same loop (compute-bound: 4 bf16 8192^3 matmuls; launch-bound: 200
    64^3 matmuls) with and without the hook, alternating blocks (ABAB...) so drift hits both,
    reporting the median per-step difference and its IQR, for each hook variant.

    python benchmarks/hook_overhead.py                 # CPU part
    python3 benchmarks/hook_overhead.py --gpu          # both (on the GPU machine)
    python benchmarks/hook_overhead.py --pairs 20000   # quicker
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfd.hook import (
    StepHook,
    wire,
)

Row = tuple[str, float, float, str]  # name, median ns, p99 ns, note


def _timer_floor(n: int) -> float:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = pc()
        t1 = pc()
        samples.append(t1 - t0)
    return statistics.median(samples)


def _pairs(hook: StepHook, n: int, floor: float, data: bool = False,
           work: Callable[[], None] | None = None, warmup: int = 0) -> tuple[float, float]:
    """Median and p99 ns of the hook calls alone, per step (timed around the hook calls only).
    ``warmup`` untimed steps first (the first step creates the hook's CUDA events)."""
    for _ in range(warmup):
        hook.step_begin()
        if data:
            hook.data_ready()
        if work is not None:
            work()
        hook.step_end()
    pc = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        t0 = pc()
        hook.step_begin()
        if data:
            hook.data_ready()
        t1 = pc()
        if work is not None:
            work()
        t2 = pc()
        hook.step_end()
        t3 = pc()
        samples[i] = (t1 - t0) + (t3 - t2)
    samples.sort()
    return max(0.0, samples[n // 2] - 2 * floor), max(0.0, samples[int(n * 0.99)] - 2 * floor)


def _drain_forever(path: str, ready: Any) -> None:
    """The 'agent': another process, so its reads never compete with the loop for the GIL."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    ready.set()
    while True:
        s.recv(65536)


def _encode_costs(n: int) -> list[Row]:
    args = (wire.VERSION, wire.KIND_STEP2, 9, 3, 12345, 1000, time.time_ns(), 123_456_789, 1_234_567,
            122_000_000, 123_000_000, 125_000_000, 130_000_000, 100, 0, 0, 8192.0, 1.5e15, 124_000_000,
            20_000)
    keys = ("v", "k", "flags", "rank", "pid", "step", "end_ns", "step_ns", "data_ns", "compute_ns",
            "p50", "p90", "p99", "n", "sd", "hd", "tokens", "flops", "period_ns", "outside_ns")
    pack = wire.STEP2.pack
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        pack(*args)
    t_struct = (pc() - t0) / n
    d = dict(zip(keys, args, strict=True))
    dumps = json.dumps
    t0 = pc()
    for _ in range(n):
        dumps(d, separators=(",", ":")).encode()
    t_json = (pc() - t0) / n
    size_json = len(json.dumps(d, separators=(",", ":")))
    return [("encode: struct (used)", t_struct, math.nan, f"{wire.STEP2.size} bytes"),
            ("encode: json.dumps", t_json, math.nan, f"{size_json} bytes")]


def cpu_part(n: int) -> list[Row]:
    rows: list[Row] = []
    floor = _timer_floor(n)
    with tempfile.TemporaryDirectory() as tmp:
        absent = os.path.join(tmp, "absent.sock")
        for label, kw in (("agent absent", {}), ("agent absent, unbatched", {"flush_interval_s": 0})):
            hook = StepHook(absent, cuda=False, rank=0, **kw)  # type: ignore[arg-type]
            med, p99 = _pairs(hook, n, floor)
            rows.append((f"host timing, {label}", med, p99, _drops(hook)))
            hook.close()
        slow = os.path.join(tmp, "slow.sock")
        sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sink.bind(slow)  # bound, never read: its queue stays full
        for label, kw in (("agent slow", {}), ("agent slow, unbatched", {"flush_interval_s": 0})):
            hook = StepHook(slow, cuda=False, rank=0, **kw)  # type: ignore[arg-type]
            med, p99 = _pairs(hook, n, floor)
            rows.append((f"host timing, {label}", med, p99, _drops(hook)))
            hook.close()
        sink.close()
        present = os.path.join(tmp, "present.sock")
        ready = mp.Event()
        proc = mp.Process(target=_drain_forever, args=(present, ready), daemon=True)
        proc.start()
        ready.wait(10)
        try:
            for label, kw, data in (("agent present", {}, False),
                                    ("agent present, with data_ready", {}, True),
                                    ("agent present, unbatched", {"flush_interval_s": 0}, False)):
                hook = StepHook(present, cuda=False, rank=0, **kw)  # type: ignore[arg-type]
                med, p99 = _pairs(hook, n, floor, data=data)
                hook.close()
                rows.append((f"host timing, {label}", med, p99, _drops(hook) + _harvester(hook)))
            # With 20 µs of host work a step that lets go of the GIL once, as a torch op does: a
            # harvester thread gets to run only when the training thread releases the GIL (or
            # after sys.getswitchinterval(), 5 ms, of pure Python), and a step of no work at all
            # would only measure how a starved harvester drops.
            cases: tuple[tuple[str, bool, dict[str, Any]], ...] = (
                    ("host timing, harvester thread", False, {"harvest_interval_s": 0.05}),
                    ("host timing, inline harvest", False, {}),
                    # The CUDA step path without a GPU: events whose record() does nothing, so
                    # what is left is the hook's own Python around it (add a cuEventRecord, ~3 µs).
                    ("no-op events, harvester thread (CUDA default)", True, {}),
                    ("no-op events, inline harvest", True, {"harvest_interval_s": 0}))
            for label, cuda, extra in cases:
                if cuda:
                    extra = {**extra, "marker_factory": _NoopEvent}
                hook = StepHook(present, cuda=cuda, rank=0, **extra)
                med, p99 = _pairs(hook, n, floor, data=True, work=_host_work, warmup=100)
                hook.close()
                rows.append((f"{label}, 20 µs steps", med, p99, _drops(hook) + _harvester(hook)))
        finally:
            proc.terminate()
    rows += _encode_costs(n)
    rows += _fetch_stamp_cost(n, floor)
    rows.append(("(timer floor, subtracted)", floor, math.nan, "perf_counter_ns pair"))
    return rows


def _fetch_stamp_cost(n: int, floor: float) -> list[Row]:
    """What a stamped fetch adds to each batch (hook.loader; torch's DataLoader iterators get the
    same wrapper): ``next()`` through the Loader against ``next()`` on the bare iterator. Per batch,
    on the training thread, outside the hook's step calls."""
    from perfd.hook.loader import FetchClock, Loader

    def per_next(it: Any) -> tuple[float, float]:
        pc = time.perf_counter_ns
        samples = [0] * n
        for i in range(n):
            t0 = pc()
            next(it)
            samples[i] = pc() - t0
        samples.sort()
        return samples[n // 2] - floor, samples[int(n * 0.99)] - floor

    bare = per_next(iter(range(n)))
    stamped = per_next(iter(Loader(range(n), FetchClock())))
    return [("fetch stamp (hook.loader, DataLoader), per batch", stamped[0] - bare[0], stamped[1] - bare[1],
             f"next() {stamped[0]:.0f} ns stamped, {bare[0]:.0f} ns bare")]


def _drops(hook: StepHook) -> str:
    c = hook.counters()
    return f"sent {c['sent']}, dropped {c['send_drops']}"


def _harvester(hook: StepHook) -> str:
    """Where the harvesting ran and, for the thread, its CPU time and queries per reported step."""
    c = hook.counters()
    drops = f", harvest drops {c['harvest_drops']}"
    if c["harvester"] != "thread":
        return f"{drops}, harvested inline"
    n = max(1, c["steps_reported"])
    return (f"{drops}, harvester {c['harvest_cpu_ns'] / n:.0f} ns/step CPU, {c['queries'] / n:.3f} "
            f"queries/step, {c['harvest_passes']} passes")


def _host_work() -> None:
    """20 µs of host work that releases the GIL once (as any torch op does)."""
    time.sleep(0)
    t_end = time.perf_counter_ns() + 20_000
    while time.perf_counter_ns() < t_end:
        pass


class _NoopEvent:
    """A marker that costs nothing: the CPU-only stand-in for a CUDA event."""

    __slots__ = ()

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_ns(self, end: Any) -> int:
        return 1000


# ------------------------------------------------------------------------------------ GPU


def _median_call(f: Callable[[], Any], n: int) -> tuple[float, float]:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = pc()
        f()
        samples.append(pc() - t0)
    samples.sort()
    return samples[n // 2], samples[int(n * 0.99)]


def gpu_part(n: int, blocks: int, steps_per_block: int) -> list[Row]:
    import torch  # only here: the CPU part needs no torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu: torch.cuda is not available")
    rows: list[Row] = []
    floor = _timer_floor(n)
    dev = torch.device("cuda")
    small = torch.randn(64, 64, device=dev)
    torch.cuda.synchronize()
    # Raw API costs with an idle launch queue (what the hook pays per call).
    tc: Any = torch.cuda  # torch's stubs leave Event untyped
    e1, e2 = tc.Event(enable_timing=True), tc.Event(enable_timing=True)
    e1.record()
    e2.record()
    torch.cuda.synchronize()
    st = torch.cuda.current_stream()
    for name, fn in (("torch: Event.record()", lambda: e1.record()),
                     ("torch: Event.record(stream)", lambda: e1.record(st)),
                     ("torch: current_stream()", torch.cuda.current_stream),
                     ("torch: Event.query()", e2.query),
                     ("torch: Event.elapsed_time()", lambda: e1.elapsed_time(e2))):
        if "record" in name:
            torch.cuda.synchronize()
        med, p99 = _median_call(fn, min(n, 20000))
        rows.append((name, med, p99, "idle launch queue"))
    torch.cuda.synchronize()
    from perfd.hook.timing import CudaApi, CudaMarker

    api = CudaApi(torch)
    m1, m2 = CudaMarker(api), CudaMarker(api)
    m1.prime()
    m2.prime()  # torch creates the events (the hook does this for its pool before the first step)
    torch.cuda.synchronize()
    drv, raw = api.driver, api.raw_stream()
    calls: list[tuple[str, Callable[[], Any]]] = [("perfd: CudaApi.raw_stream()", api.raw_stream)]
    if drv is not None:  # the bare ctypes call, without the current-stream lookup
        calls.append(("perfd: cuEventRecord via ctypes", lambda: drv.record(m1.handle, raw)))
    for name, fn in (*calls,
                     (f"perfd: CudaMarker.record() [{api.name}]", m1.record),
                     (f"perfd: CudaMarker.query() [{api.name}]", m2.query),
                     (f"perfd: CudaMarker.elapsed_ns() [{api.name}]", lambda: m1.elapsed_ns(m2))):
        if "record" in name:
            torch.cuda.synchronize()
        med, p99 = _median_call(fn, min(n, 20000))
        rows.append((name, med, p99, "idle launch queue"))
    torch.cuda.synchronize()

    def host_bound() -> None:
        # A tiny kernel and 100 µs of host work: the GPU idles, so no launch ever waits for
        # queue space and the hook's own host time is what is measured.
        torch.mm(small, small)
        t_end = time.perf_counter_ns() + 100_000
        while time.perf_counter_ns() < t_end:
            pass

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "agent.sock")
        ready = mp.Event()
        proc = mp.Process(target=_drain_forever, args=(path, ready), daemon=True)
        proc.start()
        ready.wait(10)
        try:
            # The training thread's cost per step: the hook calls only (the harvester runs beside).
            variants: tuple[tuple[str, str, dict[str, Any]], ...] = (
                    ("auto", "1 event/step, harvester thread (default)", {}),
                    ("auto", "2 events/step (cuda_data_event=True)", {"cuda_data_event": True}),
                    ("auto", "1 event/step, inline harvest", {"harvest_interval_s": 0}),
                    ("torch", "1 event/step, harvester thread", {}))
            for which, label, kw in variants:
                os.environ["PERFD_HOOK_CUDA_API"] = which
                hook = StepHook(path, cuda=True, rank=0, **kw)
                assert hook.cuda, hook.last_error
                med, p99 = _pairs(hook, min(n, 20000), floor, data=True, work=host_bound, warmup=100)
                hook.close(timeout_s=5)
                c = hook.counters()
                rows.append((f"CUDA via {c['cuda_api']}, {label}", med, p99,
                             f"{_drops(hook)}, driver errors {c['cuda_driver_errors']}{_harvester(hook)}"))
            os.environ.pop("PERFD_HOOK_CUDA_API", None)
            rows += _cross_check(torch, path)
            for label, size, per_step in (("compute-bound step", 8192, 4), ("launch-bound step", 64, 200)):
                for variant in _VARIANTS:
                    rows.append(_paired(torch, path, label, size, per_step, blocks, steps_per_block, variant))
        finally:
            proc.terminate()
    return rows


def _cross_check(torch: Any, path: str) -> list[Row]:
    """Both marker paths must measure the same GPU time: a step of a known GPU sleep."""
    rows: list[Row] = []
    for api in ("auto", "torch"):
        os.environ["PERFD_HOOK_CUDA_API"] = api
        hook = StepHook(path, cuda=True, rank=0, warmup_steps=2)
        for _ in range(30):
            with hook.step():
                torch.cuda._sleep(2_000_000)  # ~1 ms of GPU spin at ~2 GHz
        hook.close(timeout_s=5)
        p50 = hook.stats.percentile(50)
        rows.append((f"check: GPU-sleep step p50 via {hook.counters()['cuda_api']}", float(p50 or 0),
                     math.nan, "both paths must agree"))
    os.environ.pop("PERFD_HOOK_CUDA_API", None)
    return rows


# Paired-loop hook variants: StepHook keyword arguments.
_VARIANTS: dict[str, dict[str, Any]] = {
    "cuda": {},  # the default: 1 event a step, harvester thread
    "cuda, data event": {"cuda_data_event": True},
    "cuda, inline harvest": {"harvest_interval_s": 0},
    "host timing": {"cuda": False},
}


def _paired(torch: Any, path: str, label: str, size: int, per_step: int, blocks: int,
            steps_per_block: int, variant: str) -> Row:
    """Throughput with and without the hook: blocks of steps alternate (ABAB...), each block ends
    with a synchronize (the benchmark's, never the hook's), and the per-block difference is taken
    pairwise so that clock and thermal drift hit both sides alike."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        for _ in range(per_step):
            torch.mm(a, a)

    hook = StepHook(path, rank=0, **_VARIANTS[variant])
    for _ in range(20):  # warm-up both paths
        step()
        with hook.step():
            step()
    torch.cuda.synchronize()
    without: list[float] = []
    with_hook: list[float] = []
    for b in range(2 * blocks):
        use = b % 2 == 1
        t0 = time.perf_counter_ns()
        for _ in range(steps_per_block):
            if use:
                hook.step_begin()
                hook.data_ready()
                step()
                hook.step_end()
            else:
                step()
        torch.cuda.synchronize()
        (with_hook if use else without).append((time.perf_counter_ns() - t0) / steps_per_block)
    hook.close(timeout_s=5)
    base = statistics.median(without)
    diffs = sorted(w - o for w, o in zip(with_hook, without, strict=True))
    d = statistics.median(diffs)
    q1, q3 = diffs[len(diffs) // 4], diffs[(3 * len(diffs)) // 4]
    return (f"paired: {label}, hook {variant}", d, math.nan,
            f"step {base / 1e6:.3f} ms, overhead {100 * d / base:+.3f}% "
            f"(IQR {100 * q1 / base:+.3f}..{100 * q3 / base:+.3f}), {blocks} block pairs x {steps_per_block}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100_000, help="step_begin+step_end pairs per case")
    ap.add_argument("--gpu", action="store_true", help="also the CUDA-event and paired-loop GPU part")
    ap.add_argument("--blocks", type=int, default=20, help="GPU paired timing: block pairs")
    ap.add_argument("--steps-per-block", type=int, default=50)
    args = ap.parse_args()
    rows = cpu_part(args.pairs)
    if args.gpu:
        rows += gpu_part(args.pairs, args.blocks, args.steps_per_block)
    print(f"perfd step hook overhead  (python {sys.version.split()[0]}, {args.pairs} pairs per case, "
          f"record {wire.STEP2.size} B; target <= 10000 ns/step)")
    width = max(46, *(len(r[0]) for r in rows))
    print(f"{'case':<{width}} {'median ns':>10} {'p99 ns':>10}  note")
    for name, med, p99, note in rows:
        p99s = "" if math.isnan(p99) else f"{p99:10.0f}"
        print(f"{name:<{width}} {med:10.0f} {p99s:>10}  {note}")


if __name__ == "__main__":
    main()
