"""Record real Flight Recorder dumps (and NCCL Inspector lines, if the plugin exists) on 2 GPUs.

One command, from the repository root on the 2-GPU machine:

    python3 tests/gpu/make_nccl_fixtures.py $OUT/nccl_fixtures

It runs ``torchrun --nproc_per_node 2`` on this same file three times:
  - ``normal``: a small DDP loop plus explicit all_gather / reduce_scatter / broadcast / send-recv on
    the default group and a subgroup, Flight Recorder on (ring of 50 entries, to keep files small);
  - ``timing``: the same with ``TORCH_NCCL_ENABLE_TIMING=1`` (``duration_ms`` filled);
  - ``hang``: rank 1 sleeps before an all_reduce that rank 0 has already entered and waits on;
  - ``batch_p2p``: ``timing`` + a batch_isend_irecv (send to and receive from the peer, as
    Megatron-LM's pipeline does) every 5 steps: ProcessGroupNCCL records its ops without events and
    one ``nccl:coalesced`` entry with the batch's timing;
  - ``only_active``: ``batch_p2p`` with ``TORCH_INCLUDE_ONLY_ACTIVE=1`` (what Megatron-LM sets by
    default once a dump path is in its environment): dumps hold only in-flight work.
While each job runs, this driver does what the perfd agent does: write a byte to every
``frp_<rank>.pipe`` and keep each new, completely written ``fr_dump_<rank>`` it finds (in ``hang``
mode, during rank 0's wait). Files are the raw bytes torch wrote. NCCL Inspector is enabled when
``libnccl-profiler-inspector*.so`` is found (its JSON lines are cut to 50 lines per file); if not,
the output says so. ``manifest.json`` lists everything with versions and timings.

Worker mode (what torchrun runs): ``make_nccl_fixtures.py --worker MODE DIR``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfd.collectors.nccl.flight_recorder import DumpError, load_dump_bytes  # noqa: E402
from perfd.collectors.nccl.trigger import find_pipes, trigger_dump  # noqa: E402
from perfd.core.flight_recorder_env import env_for_flight_recorder  # noqa: E402

RING = 50
MODES = ("normal", "timing", "hang", "batch_p2p", "only_active")
BATCHED = ("batch_p2p", "only_active")
HANG_SLEEP_S = 25.0


# ------------------------------------------------------------------------------------ worker


def worker(mode: str, run_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world = dist.get_world_size()
    dev = torch.device("cuda", local)
    if rank == 0:
        nccl_version: Any = torch.cuda.nccl.version()
        info = {"torch": torch.__version__, "nccl": ".".join(map(str, nccl_version)),
                "gpu": torch.cuda.get_device_name(dev), "world_size": world}
        (run_dir / "versions.json").write_text(json.dumps(info))
    sub = dist.new_group(list(range(world)))
    if mode == "hang":
        t = torch.ones(1 << 20, device=dev)
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        if rank == 1:
            time.sleep(HANG_SLEEP_S)  # rank 0 is inside the next all_reduce, waiting for us
        else:
            (run_dir / "hang_started").write_text(str(time.time_ns()))
        dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()
        return
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local], bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    steps = int(os.environ.get("FIXTURE_STEPS", "60"))
    for step in range(steps):
        x = torch.randn(64, 1024, device=dev)
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 5 == 0:  # some other ops, so the fixtures hold more than all_reduce
            shard = torch.full((4096,), float(rank), device=dev, dtype=torch.bfloat16)
            out = torch.empty(4096 * world, device=dev, dtype=torch.bfloat16)
            dist.all_gather_into_tensor(out, shard)
            red = torch.empty(4096 // world, device=dev, dtype=torch.bfloat16)
            dist.reduce_scatter_tensor(red, torch.ones(4096, device=dev, dtype=torch.bfloat16), group=sub)
            dist.broadcast(torch.arange(8, device=dev, dtype=torch.int64), src=0)
            buf = torch.ones(1000, device=dev)
            if rank == 0:
                dist.send(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
            if mode in BATCHED:
                peer = 1 - rank
                sbuf = torch.full((4, 1024), float(rank), device=dev, dtype=torch.bfloat16)
                rbuf = torch.empty(4, 1024, device=dev, dtype=torch.bfloat16)
                ops = [dist.P2POp(dist.isend, sbuf, peer), dist.P2POp(dist.irecv, rbuf, peer)]
                for req in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
                    req.wait()
        torch.cuda.synchronize()
        time.sleep(0.2)  # stretch the run to ~15 s so the driver can trigger several dumps
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------ driver


def find_inspector() -> str | None:
    if os.environ.get("PERFD_NCCL_INSPECTOR"):
        return os.environ["PERFD_NCCL_INSPECTOR"]
    roots = [str(ROOT / ".gpu-libs"), "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu",
             "/opt"]
    for var in ("NCCL_HOME", "CUDA_HOME"):
        if os.environ.get(var):
            roots.append(os.environ[var])
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        roots += list(spec.submodule_search_locations or []) if spec else []
    except Exception:
        pass
    for root in roots:
        hits = glob.glob(os.path.join(root, "**", "libnccl-profiler-inspector*.so*"), recursive=True)
        if hits:
            return sorted(hits)[0]
    print(f"NCCL Inspector plugin (libnccl-profiler-inspector*.so) not found under {roots}: "
          "no Inspector fixtures (build it from NVIDIA/nccl ext-profiler/inspector)", flush=True)
    return None


def _complete(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
        load_dump_bytes(data)
    except (OSError, DumpError):
        return None
    return data


def collect_dumps(run_dir: Path, out_dir: Path, stop: threading.Event, interval_s: float,
                  wait_for: Path | None, log: list[dict[str, Any]]) -> None:
    """The agent's part: trigger through the FIFOs, keep each new complete dump."""
    pipe_prefix = str(run_dir / "frp_")
    seen: dict[int, int] = {}
    n = 0
    while not stop.is_set() and n < 6:
        if wait_for is not None:
            if not wait_for.exists():
                time.sleep(0.2)
                continue
            time.sleep(5.0)  # rank 0 has been waiting a while; rank 1 is still asleep
        pipes = find_pipes(pipe_prefix)
        if not pipes:
            time.sleep(0.2)
            continue
        t_trigger = time.time_ns()
        statuses = {r: trigger_dump(p) for r, p in pipes.items()}
        deadline = time.monotonic() + 10
        got: dict[int, bytes] = {}
        while time.monotonic() < deadline and len(got) < len(pipes) and not stop.is_set():
            for r in pipes:
                f = run_dir / f"fr_dump_{r}"
                if r in got or not f.exists() or f.stat().st_mtime_ns == seen.get(r):
                    continue
                data = _complete(f)
                if data is not None:
                    got[r] = data
                    seen[r] = f.stat().st_mtime_ns
            time.sleep(0.1)
        if got:
            for r, data in got.items():
                (out_dir / f"dump{n:02d}_rank{r}").write_bytes(data)
            log.append({"dump": n, "trigger_time_ns": t_trigger, "trigger": statuses,
                        "ranks": sorted(got), "bytes": {r: len(d) for r, d in got.items()}})
            n += 1
        if wait_for is not None:
            return  # one dump during the hang is what the fixture needs
        stop.wait(interval_s)


def run_mode(mode: str, out: Path, plugin: str | None) -> dict[str, Any]:
    run_dir = Path(f"/tmp/perfd_fr_{mode}_{os.getpid()}")
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    mode_out = out / mode
    mode_out.mkdir(parents=True, exist_ok=True)
    timing = mode not in ("normal", "hang")
    env = {**os.environ, **env_for_flight_recorder(run_dir, buffer_entries=RING, timing=timing)}
    env["TORCH_INCLUDE_ONLY_ACTIVE"] = "1" if mode == "only_active" else "0"
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NVLink multicast off on these machines
    if plugin is not None and mode != "hang":
        insp = run_dir / "inspector"
        env.update(NCCL_PROFILER_PLUGIN=plugin, NCCL_INSPECTOR_ENABLE="1", NCCL_INSPECTOR_DUMP_DIR=str(insp),
                   NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS="100000")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + MODES.index(mode)), str(Path(__file__).resolve()), "--worker", mode, str(run_dir)]
    print(f"[{mode}] {' '.join(cmd)}", flush=True)
    log: list[dict[str, Any]] = []
    stop = threading.Event()
    wait_for = run_dir / "hang_started" if mode == "hang" else None
    collector = threading.Thread(target=collect_dumps, args=(run_dir, mode_out, stop, 3.0, wait_for, log))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    collector.start()
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    stop.set()
    collector.join(timeout=15)
    (mode_out / "torchrun.log").write_text("\n".join(output.splitlines()[-200:]) + "\n")
    result: dict[str, Any] = {"mode": mode, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
                              "dumps": log, "ring_entries": RING, "timing": mode not in ("normal", "hang"),
                              "only_active": mode == "only_active"}
    if mode == "hang":
        started = run_dir / "hang_started"
        result["hang_started_ns"] = int(started.read_text()) if started.exists() else None
        result["hang_sleep_s"] = HANG_SLEEP_S
    versions = run_dir / "versions.json"
    if versions.exists():
        result["versions"] = json.loads(versions.read_text())
    insp_dir = run_dir / "inspector"
    if insp_dir.is_dir():
        (mode_out / "inspector").mkdir(exist_ok=True)
        files = sorted(insp_dir.glob("*.log"))
        for f in files:  # JSON lines: cutting at a line boundary keeps them valid
            lines = f.read_text(errors="replace").splitlines(keepends=True)[:50]
            (mode_out / "inspector" / f.name).write_text("".join(lines))
        result["inspector_files"] = [f.name for f in files]
    print(f"[{mode}] rc={proc.returncode}, {len(log)} dump rounds, {result['seconds']} s", flush=True)
    if proc.returncode != 0:
        print("\n".join(output.splitlines()[-40:]), flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], Path(sys.argv[3]))
        return
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(MODES)
    out.mkdir(parents=True, exist_ok=True)
    plugin = find_inspector()
    manifest = {"plugin": plugin, "runs": [run_mode(m, out, plugin) for m in modes]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({total / 1024:.0f} KiB)", flush=True)


if __name__ == "__main__":
    main()
