"""`perfd bench overhead`: what perfd costs a real Megatron-LM job (docs/design.md §4 targets).

Paired, interleaved runs of the same Megatron-LM job on the same GPUs, one variant after another
and the order rotated every round so drift (clocks, temperature, page cache) hits every variant:
  - ``plain``: torchrun pretrain_gpt.py, no perfd at all;
  - ``agent``: ``perfd launch --flight-recorder`` around it and ``perfd agent --launch-manifest``
    with every collector (NVML + GPM at 10 Hz, host at 1 Hz, the Megatron log tail, Flight
    Recorder dumps), streaming to a ``perfd aggregator``;
  - ``fr_timing``: the same + ``--fr-timing`` (TORCH_NCCL_ENABLE_TIMING=1);
  - ``hook``: the same + the step hook around every iteration (``-m perfd.hook.megatron``).
Per run: the median of Megatron's own "elapsed time per iteration" after the warm-up; per round,
each variant's median over the plain run's of the same round; reported: the median ratio and its
spread over rounds, the agent's CPU (share of one core, over the steady iterations) and its peak RSS.

Then the agent alone (no job) with NVML + GPM on 1 GPU and on 2 GPUs at 10 Hz and on 2 GPUs at 1 Hz:
the CPU of one GPU's samples, from which 8 GPUs at 1 Hz are projected (base + 8 × per-GPU cost).

    MEGATRON_DIR=/path/to/Megatron-LM perfd bench overhead OUT_DIR [--rounds 2] [--iters 40]

Needs 2 GPUs, torch with CUDA and a Megatron-LM checkout (core 0.20 was used; not part of perfd).
Writes OUT_DIR/overhead.json and overhead.md and prints the table. Exit 0 when every run finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "agent", "fr_timing", "hook")
_ELAPSED = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def megatron_args(megatron: Path, iters: int, layers: int, hidden: int) -> list[str]:
    """DP=2 on two GPUs, GPT with ``layers`` x ``hidden``, mock data."""
    return [str(megatron / "pretrain_gpt.py"), "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", "1", "--num-layers", str(layers), "--hidden-size", str(hidden),
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--micro-batch-size", "4", "--global-batch-size", "64", "--train-iters", str(iters),
            "--lr", "1e-4", "--lr-decay-style", "constant", "--bf16", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--transformer-impl", "local",
            "--no-persist-layer-norm", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--log-interval", "1", "--log-throughput", "--eval-iters", "0", "--eval-interval", "100000",
            "--disable-bias-linear"]


def elapsed_ms(log: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for m in _ELAPSED.finditer(text):
        out[int(m.group(1))] = float(m.group(2))
    return out


class Runner:
    def __init__(self, out: Path, megatron: Path, iters: int, warmup: int, model: tuple[int, int]) -> None:
        self.out, self.megatron, self.iters, self.warmup, self.model = out, megatron, iters, warmup, model
        self.env = {**os.environ, **ENV, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            self.env.pop(k, None)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.grpc_port = 0

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=(self.out / f"{name}.out").open("ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def aggregator(self) -> None:
        ready = self.out / "aggregator.ready"
        self.start("aggregator", [sys.executable, "-m", "perfd.app.cli", "aggregator", "--grpc-port", "0",
                                  "--http-port", str(free_port()), "--ready-file", str(ready), "--no-rules"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (ready.exists() and ready.read_text().strip()):
            time.sleep(0.2)
        self.grpc_port = int(ready.read_text().split()[0])

    def agent(self, name: str, manifest: Path | None, devices: list[int] | None, interval_s: float,
              host: bool) -> subprocess.Popen[bytes]:
        cfg = self.out / f"{name}.agent.json"
        collectors: dict[str, Any] = {"nvml": {"source": "real", "interval_s": interval_s, "gpm": "auto",
                                               "devices": devices if devices is not None else "all"}}
        cfg.write_text(json.dumps({"batch_interval_s": 0.5, "collectors": collectors}))  # JSON is YAML
        argv = [sys.executable, "-m", "perfd.app.cli", "agent", "--config", str(cfg), "--aggregator",
                f"127.0.0.1:{self.grpc_port}", "--host", "on" if host else "off", "--metrics-port", "-1"]
        if manifest is not None:
            argv += ["--launch-manifest", str(manifest)]
        return self.start(f"{name}.agent", argv)

    def job(self, variant: str, tag: str) -> dict[str, Any]:
        run_dir = self.out / tag
        run_dir.mkdir(parents=True, exist_ok=True)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(free_port())]
        if variant == "hook":
            torchrun += ["-m", "perfd.hook.megatron"]
        cmd = [*torchrun, *megatron_args(self.megatron, self.iters, *self.model)]
        log = run_dir / "output.log"
        agent = None
        t0 = time.monotonic()
        if variant == "plain":
            job = self.start(f"{tag}.job", cmd)
            log = self.out / f"{tag}.job.out"
        else:
            flags = ["--fr-timing"] if variant in ("fr_timing", "hook") else []
            job = self.start(f"{tag}.launch", [
                sys.executable, "-m", "perfd.app.cli", "launch", "--job", tag, "--run-dir", str(run_dir),
                "--flight-recorder", str(run_dir / "fr"), "--fr-buffer", "20000",
                "--agent-socket", str(run_dir / "hook.sock"), *flags, "--", *cmd])
            manifest = run_dir / "launch.json"
            while not manifest.exists() and job.poll() is None and time.monotonic() - t0 < 60:
                time.sleep(0.2)
            agent = self.agent(tag, manifest, None, 0.1, True)
        cpu0 = cpu1 = t_cpu0 = t_cpu1 = None
        rss = 0.0
        while job.poll() is None and time.monotonic() - t0 < 900:
            time.sleep(0.5)
            seen = elapsed_ms(log)
            if agent is not None and agent.poll() is None:
                rss = max(rss, proc_rss_mb(agent.pid))
                if cpu0 is None and seen and max(seen) >= self.warmup:
                    cpu0, t_cpu0 = proc_cpu_s(agent.pid), time.monotonic()
                elif cpu0 is not None and seen:
                    cpu1, t_cpu1 = proc_cpu_s(agent.pid), time.monotonic()
        rc = job.wait(timeout=60) if job.poll() is None else job.returncode
        ms = elapsed_ms(log)
        steady = [v for k, v in ms.items() if k > self.warmup]
        rec: dict[str, Any] = {"variant": variant, "run": tag, "job_exit": rc, "iterations": len(ms),
                               "seconds": round(time.monotonic() - t0, 1),
                               "median_step_ms": statistics.median(steady) if steady else None}
        if agent is not None:
            if cpu0 is not None and cpu1 is not None and t_cpu1 and t_cpu0 and t_cpu1 > t_cpu0:
                rec["agent_cpu_core_share"] = (cpu1 - cpu0) / (t_cpu1 - t_cpu0)
            rec["agent_rss_mb"] = rss
            agent.send_signal(signal.SIGTERM)
            try:
                rec["agent_exit"] = agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                agent.kill()
                rec["agent_exit"] = "killed"
        print(json.dumps(rec), flush=True)
        return rec

    def probe(self, devices: list[int], interval_s: float, seconds: float) -> dict[str, Any]:
        """The agent alone, NVML + GPM only: its CPU share and RSS after a settle period."""
        tag = f"probe_{len(devices)}gpu_{interval_s:g}s"
        a = self.agent(tag, None, devices, interval_s, False)
        time.sleep(3.0)  # imports, NVML init, the first GPM window
        c0, t0 = proc_cpu_s(a.pid), time.monotonic()
        time.sleep(seconds)
        share = (proc_cpu_s(a.pid) - c0) / (time.monotonic() - t0)
        rss = proc_rss_mb(a.pid)
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=20)
        rec = {"probe": tag, "gpus": len(devices), "interval_s": interval_s, "cpu_core_share": share,
               "rss_mb": rss}
        print(json.dumps(rec), flush=True)
        return rec

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def summarize(runs: list[dict[str, Any]], probes: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    by: dict[str, Any] = {}
    for v in VARIANTS[1:]:
        ratios = []
        for r in range(rounds):
            base = next((x for x in runs if x["variant"] == "plain" and x["round"] == r), None)
            this = next((x for x in runs if x["variant"] == v and x["round"] == r), None)
            if base and this and base["median_step_ms"] and this["median_step_ms"]:
                ratios.append(this["median_step_ms"] / base["median_step_ms"])
        cpu = [x["agent_cpu_core_share"] for x in runs if x["variant"] == v and "agent_cpu_core_share" in x]
        rss = [x["agent_rss_mb"] for x in runs if x["variant"] == v and "agent_rss_mb" in x]
        by[v] = {"ratios": ratios, "median_ratio": statistics.median(ratios) if ratios else None,
                 "spread": [min(ratios), max(ratios)] if ratios else None,
                 "agent_cpu_core_share": statistics.median(cpu) if cpu else None,
                 "agent_rss_mb": max(rss) if rss else None}
    proj: dict[str, Any] = {}
    p = {(x["gpus"], x["interval_s"]): x["cpu_core_share"] for x in probes}
    if (1, 0.1) in p and (2, 0.1) in p and (2, 1.0) in p:
        per_gpu_sample = max(0.0, (p[(2, 0.1)] - p[(1, 0.1)]) / 10.0)  # core-seconds per GPU sample
        proj = {"cpu_per_gpu_sample_core_s": per_gpu_sample,
                "projected_8gpu_1hz_core_share": p[(2, 1.0)] + 6 * per_gpu_sample}
    plain = [x["median_step_ms"] for x in runs if x["variant"] == "plain" and x["median_step_ms"]]
    return {"variants": by, "plain_median_step_ms": statistics.median(plain) if plain else None,
            "nvml_probes": probes, "projection": proj}


def _pct(x: float | None, digits: int = 2, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:+.{digits}f}%" if signed else f"{100 * x:.{digits}f}%"


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    plain = s["plain_median_step_ms"]
    head = (f"{res['gpu']}; Megatron-LM DP=2 ({res['layers']} layers, hidden {res['hidden']}, gbs 64, mbs 4, "
            "bf16, mock data), "
            f"{res['iters']} iterations per run, median after iteration {res['warmup']}, "
            f"{res['rounds']} rounds (order rotated). Plain median step: "
            + (f"{plain:.1f} ms." if plain else "n/a (no plain run finished)."))
    lines = [head, "", "| variant | step time vs plain (median) | spread over rounds | agent CPU (one core) "
             "| agent RSS |", "|---|---|---|---|---|"]
    for v, d in s["variants"].items():
        r, spread = d["median_ratio"], d["spread"]
        rss = d["agent_rss_mb"]
        lines.append(f"| {v} | {_pct(None if r is None else r - 1, signed=True)} | "
                     + (", ".join(_pct(x - 1, signed=True) for x in spread) if spread else "n/a")
                     + f" | {_pct(d['agent_cpu_core_share'], 1)} | "
                     + ("n/a" if rss is None else f"{rss:.0f} MB") + " |")
    lines += ["", "| agent alone, NVML + GPM | CPU (one core) | RSS |", "|---|---|---|"]
    lines += [f"| {p['gpus']} GPU(s) every {p['interval_s']:g} s | {_pct(p['cpu_core_share'])} | "
              f"{p['rss_mb']:.0f} MB |" for p in s["nvml_probes"]]
    proj = s["projection"]
    if proj:
        share = _pct(proj["projected_8gpu_1hz_core_share"])
        lines.append(f"\nProjected for 8 GPUs at 1 Hz: {share} of a core "
                     f"({1e3 * proj['cpu_per_gpu_sample_core_s']:.2f} ms of CPU per GPU sample).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="output directory")
    ap.add_argument("--megatron", default=os.environ.get("MEGATRON_DIR"),
                    help="Megatron-LM checkout (default: $MEGATRON_DIR)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every variant (default: %(default)s)")
    ap.add_argument("--iters", type=int, default=40, help="iterations per run (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=10, help="iterations left out (default: %(default)s)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="default: %(default)s")
    ap.add_argument("--layers", type=int, default=12, help="GPT layers (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=2048, help="GPT hidden size (default: %(default)s; "
                    "a small model's steps are host-bound and vary by +-15%% run to run on 2xH200)")
    ap.add_argument("--probe-s", type=float, default=10.0, help="seconds per NVML probe; 0: none "
                    "(default: %(default)s)")
    ns = ap.parse_args(argv)
    if not ns.megatron or not (Path(ns.megatron) / "pretrain_gpt.py").is_file():
        print("perfd bench overhead: --megatron (or $MEGATRON_DIR) must name a Megatron-LM checkout "
              "with pretrain_gpt.py", file=sys.stderr)
        return 2
    variants = [v for v in ns.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "plain" not in variants:
        print(f"perfd bench overhead: --variants must include plain and be among {VARIANTS}", file=sys.stderr)
        return 2
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    rn = Runner(out, Path(ns.megatron).resolve(), ns.iters, ns.warmup, (ns.layers, ns.hidden))
    runs: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    gpu = "unknown GPU"
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        gpu = f"{pynvml.nvmlDeviceGetCount()}x {name}"
    except Exception as exc:  # the bench still runs; the machine line says why it is unnamed
        gpu = f"unknown GPU ({type(exc).__name__})"
    try:
        rn.aggregator()
        for r in range(ns.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                rec = rn.job(v, f"r{r}_{v}")
                rec["round"] = r
                runs.append(rec)
                (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")  # kept if stopped
        if ns.probe_s > 0:
            for devices, interval in (([0], 0.1), ([0, 1], 0.1), ([0, 1], 1.0)):
                probes.append(rn.probe(devices, interval, ns.probe_s))
    finally:
        rn.stop()
    res = {"gpu": gpu, "layers": ns.layers, "hidden": ns.hidden, "iters": ns.iters, "warmup": ns.warmup,
           "rounds": ns.rounds, "runs": runs,
           "summary": summarize(runs, probes, ns.rounds),
           "command": "perfd bench overhead " + " ".join(argv if argv is not None else sys.argv[1:])}
    (out / "overhead.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (out / "overhead.md").write_text(md)
    print(md)
    return 0 if all(x["job_exit"] == 0 for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
