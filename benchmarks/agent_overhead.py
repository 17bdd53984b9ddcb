"""Overhead of `perfd agent` on a real training step, on a real GPU (paired runs, same GPU).

A bf16 transformer-like training step (forward, backward, AdamW) runs in blocks; the agent runs
beside it in every other block with NVML+GPM sampled at 10 Hz, host metrics at 1 Hz and the
Megatron collector tailing a log the loop appends to, and the ranks collector following this
process when it runs with RANK=0 in its environment. Step time is compared as a ratio between
neighbouring blocks (ABAB...), so drift in clocks and temperature cancels. The agent's CPU time
and resident memory are read from /proc while it runs.

    RANK=0 python3 benchmarks/agent_overhead.py OUT_DIR [--pairs 4] [--block-s 8]

Needs torch with CUDA (the GPU machine's python3). Writes OUT_DIR/agent_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(parts[11]) + int(parts[12])) / ticks  # utime + stime


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def ranks_followed(port: int) -> int | None:
    """Rank processes the agent's ranks collector reports on its /metrics (None: no answer)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(1 for line in text.splitlines() if line.startswith("perfd_host_rank_state_info{"))


def build_step(torch: Any, hidden: int, layers: int, tokens: int) -> Any:
    dev = "cuda"
    blocks = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
        torch.nn.Linear(4 * hidden, hidden)) for _ in range(layers)]).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=True)
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        y = blocks(x)
        y.float().pow(2).mean().backward()
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--block-s", type=float, default=8.0)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8192)
    ns = ap.parse_args(argv)
    import torch

    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    step = build_step(torch, ns.hidden, ns.layers, ns.tokens)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    log = out / "train.log"
    log.write_text("")
    cfg = out / "agent.yaml"
    port = free_port()
    cfg.write_text(json.dumps({  # JSON is YAML
        "job": "overhead", "metrics_port": port, "metrics_host": "127.0.0.1",
        "collectors": {"nvml": {"source": "real", "interval_s": 0.1, "gpm": "auto"},
                       "host": {"interval_s": 1.0},
                       "megatron": {"path": str(log), "interval_s": 0.5},
                       # This process is the rank it follows when started with RANK=0 in its
                       # environment (the GPU process list names it): the per-rank host cost.
                       "ranks": {"interval_s": 1.0}}}))
    blocks: list[dict[str, Any]] = []
    it = 0
    for pair in range(ns.pairs):
        for cond in ("off", "on") if pair % 2 == 0 else ("on", "off"):
            agent = None
            if cond == "on":
                agent = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "agent", "--config",
                                          str(cfg)],
                                         cwd=ROOT, stdout=(out / "agent.out").open("a"),
                                         stderr=subprocess.STDOUT)
                time.sleep(2.0)  # start-up (imports, NVML init, first GPM window) outside the block
                cpu0 = proc_cpu_s(agent.pid)
            times = []
            t_end = time.perf_counter() + ns.block_s
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                it += 1
                with log.open("a") as f:  # what Megatron would print: one line per iteration
                    f.write(f" [2026-01-01 00:00:00.000000] iteration {it:8d}/ 1000000 | elapsed time per "
                            f"iteration (ms): {1000 * times[-1]:.1f} | lm loss: 1.0E+00 |\n")
            rec: dict[str, Any] = {"pair": pair, "cond": cond, "steps": len(times),
                                   "median_ms": 1000 * statistics.median(times),
                                   "p90_ms": 1000 * sorted(times)[int(0.9 * len(times))]}
            if agent is not None:
                rec["agent_cpu_core_share"] = (proc_cpu_s(agent.pid) - cpu0) / ns.block_s
                rec["ranks_followed"] = ranks_followed(port)
                rec["agent_rss_mb"] = proc_rss_mb(agent.pid)
                agent.send_signal(signal.SIGTERM)
                rec["agent_exit"] = agent.wait(timeout=20)
            blocks.append(rec)
            print(json.dumps(rec), flush=True)
    ratios = []
    for pair in range(ns.pairs):
        on = next(b for b in blocks if b["pair"] == pair and b["cond"] == "on")
        off = next(b for b in blocks if b["pair"] == pair and b["cond"] == "off")
        ratios.append(on["median_ms"] / off["median_ms"])
    ons = [b for b in blocks if b["cond"] == "on"]
    summary = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
        "step": f"{ns.layers} MLP blocks hidden {ns.hidden}, {ns.tokens} tokens, bf16, AdamW",
        "median_step_ms_off": statistics.median(b["median_ms"] for b in blocks if b["cond"] == "off"),
        "median_step_ms_on": statistics.median(b["median_ms"] for b in ons),
        "pair_ratios_on_over_off": ratios,
        "median_slowdown": statistics.median(ratios) - 1,
        "agent_cpu_core_share_median": statistics.median(b["agent_cpu_core_share"] for b in ons),
        "agent_rss_mb_max": max(b["agent_rss_mb"] for b in ons),
        "ranks_followed": [b.get("ranks_followed") for b in ons],
        "blocks": blocks,
    }
    (out / "agent_overhead.json").write_text(json.dumps(summary, indent=1))
    md = [f"GPU {summary['gpu']}, torch {summary['torch']}; step: {summary['step']}", "",
          "| | value |", "|---|---|",
          f"| median step, agent off | {summary['median_step_ms_off']:.3f} ms |",
          "| median step, agent on (NVML+GPM 10 Hz, host 1 Hz, log tail) | "
          f"{summary['median_step_ms_on']:.3f} ms |",
          f"| per-pair ratio on/off | {', '.join(f'{r:.4f}' for r in ratios)} |",
          f"| median slowdown | {100 * summary['median_slowdown']:+.2f}% |",
          f"| agent CPU (share of one core) | {100 * summary['agent_cpu_core_share_median']:.1f}% |",
          f"| agent RSS | {summary['agent_rss_mb_max']:.0f} MB |",
          f"| rank processes the ranks collector followed, per 'on' block | {summary['ranks_followed']} |"]
    (out / "agent_overhead.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
