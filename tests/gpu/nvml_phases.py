"""GPU load generator for the NVML collector's verification: known loads, one after another.

Each phase runs ~``--phase-s`` seconds and writes its name to a marker file first, so a concurrent
NVML recording (collectors/nvml/record.py) knows which load was running. Phases, chosen to
reproduce docs/design.md §2's GPM table and to exercise the rest of the collector:

  idle            nothing (the CUDA context exists, no kernel runs)
  matmul          bf16 8192x8192 matmul loop               -> tensor util high
  copy            1 GiB device-to-device copy loop         -> DRAM bandwidth util high
  launch          x.add_(1) on a 1-element tensor, in a loop -> NVML util > 0, SM util ~0
  h2d             256 MiB pinned host -> device copies     -> PCIe RX rate (checks GPM's PCIe units)
  second_process  another python process allocates 2 GiB and runs small kernels on the same GPU
                  (this one stays idle) -> the collector must name a foreign process

Writes a timeline JSON (phase start/end epoch times, achieved TFLOP/s and bytes/s, pids).
Needs torch with CUDA, except with ``--dry-run`` (phases only sleep: tests the orchestration).

    python3 tests/gpu/nvml_phases.py --marker /tmp/phase --timeline /tmp/timeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ALL_PHASES = ("idle", "matmul", "copy", "launch", "h2d", "second_process")


def write_marker(path: str, text: str) -> None:
    """Atomic: a reader never sees a half-written phase name."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)


class Loads:
    """The GPU work of each phase. Buffers are allocated once, before the first phase."""

    def __init__(self, torch: Any, device: str = "cuda") -> None:
        self.torch = torch
        self.dev = device
        n = 8192
        self.a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        self.src = torch.empty(2**30, device=device, dtype=torch.uint8)  # 1 GiB
        self.dst = torch.empty_like(self.src)
        self.src.fill_(1)
        self.tiny = torch.zeros(1, device=device)
        self.host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
        self.host_dst = torch.empty(256 * 2**20, device=device, dtype=torch.uint8)
        torch.matmul(self.a, self.b, out=self.c)  # warm up cuBLAS outside the measured phases
        torch.cuda.synchronize()

    def _loop(self, deadline: float, body: Callable[[], None], per_sync: int) -> int:
        """Run ``body`` until the deadline; synchronise every ``per_sync`` calls so the queue of
        launched-but-not-run work stays short and the phase ends on time."""
        sync = self.torch.cuda.synchronize
        done = 0
        while time.monotonic() < deadline:
            for _ in range(per_sync):
                body()
            done += per_sync
            sync()
        return done

    def matmul(self, deadline: float) -> dict[str, float]:
        t0 = time.perf_counter()
        n = self._loop(deadline, lambda: self.torch.matmul(self.a, self.b, out=self.c), 20)
        dt = time.perf_counter() - t0
        return {"iterations": n, "tflops": 2 * 8192**3 * n / dt / 1e12}

    def copy(self, deadline: float) -> dict[str, float]:
        t0 = time.perf_counter()
        n = self._loop(deadline, lambda: self.dst.copy_(self.src), 10)
        dt = time.perf_counter() - t0
        # a copy reads and writes every byte
        return {"iterations": n, "dram_bytes_per_s": 2 * self.src.numel() * n / dt}

    def launch(self, deadline: float) -> dict[str, float]:
        t0 = time.perf_counter()
        n = self._loop(deadline, lambda: self.tiny.add_(1), 2000)
        dt = time.perf_counter() - t0
        return {"iterations": n, "launches_per_s": n / dt}

    def h2d(self, deadline: float) -> dict[str, float]:
        t0 = time.perf_counter()
        n = self._loop(deadline, lambda: self.host_dst.copy_(self.host, non_blocking=True), 4)
        dt = time.perf_counter() - t0
        return {"iterations": n, "h2d_bytes_per_s": self.host.numel() * n / dt}


def child_main(seconds: float, mem_gib: float) -> int:
    """The "foreign" process of the second_process phase: memory plus small kernels."""
    import torch

    hold = torch.empty(int(mem_gib * 2**30), dtype=torch.uint8, device="cuda")
    hold.fill_(7)
    x = torch.randn(1024, 1024, device="cuda")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(50):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
    return 0


def run(marker: str, timeline_path: str, phases: list[str], phase_s: float, dry_run: bool,
        child_mem_gib: float) -> dict[str, Any]:
    timeline: dict[str, Any] = {"pid": os.getpid(), "phase_s": phase_s, "dry_run": dry_run, "phases": []}
    write_marker(marker, "setup")
    loads: Loads | None = None
    if not dry_run:
        import torch

        loads = Loads(torch)
        props = torch.cuda.get_device_properties(0)
        timeline["device_name"] = props.name
        timeline["device_uuid"] = str(getattr(props, "uuid", ""))
        timeline["torch"] = torch.__version__

    def save() -> None:
        with open(timeline_path, "w", encoding="utf-8") as fh:
            json.dump(timeline, fh, indent=1)

    for name in phases:
        write_marker(marker, name)
        start = time.time()
        deadline = time.monotonic() + phase_s
        stats: dict[str, Any] = {}
        if name == "second_process":
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--child-seconds",
                   str(phase_s), "--child-mem-gib", str(child_mem_gib)]
            if dry_run:
                cmd = [sys.executable, "-c", f"import time; time.sleep({phase_s})"]
            child = subprocess.Popen(cmd)
            stats["child_pid"] = child.pid
            timeline["child_pid"] = child.pid
            try:
                stats["child_rc"] = child.wait(timeout=phase_s + 60)
            except subprocess.TimeoutExpired:
                child.kill()
                stats["child_rc"] = "killed"
        elif loads is None or name == "idle":
            time.sleep(max(0.0, deadline - time.monotonic()))
        else:
            stats = getattr(loads, name)(deadline)
        timeline["phases"].append({"name": name, "start": start, "end": time.time(), "stats": stats})
        save()
    write_marker(marker, "done")
    timeline["done"] = time.time()
    save()
    return timeline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--marker", help="file to write the current phase name to")
    ap.add_argument("--timeline", help="JSON file for phase times and achieved rates")
    ap.add_argument("--phases", default=",".join(ALL_PHASES), help=f"subset of {','.join(ALL_PHASES)}")
    ap.add_argument("--phase-s", type=float, default=4.0, help="seconds per phase (default 4)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: phases only sleep")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-seconds", type=float, default=4.0, help=argparse.SUPPRESS)
    ap.add_argument("--child-mem-gib", type=float, default=2.0, help="memory the second process holds")
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child_seconds, args.child_mem_gib)
    if not args.marker or not args.timeline:
        ap.error("--marker and --timeline are required")
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(ALL_PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}")
    run(args.marker, args.timeline, phases, args.phase_s, args.dry_run, args.child_mem_gib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
