"""On a real GPU machine (1 or 2 GPUs): the agent's capture executors against real CUDA training loops.

    source .gpu-libs/nsys-env.sh     # LD_LIBRARY_PATH for nsys export, and PERFD_NSYS
    python3 tests/gpu/verify_captures.py OUT_DIR [--parts kineto,nsys[,range]]

Parts (each independent and bounded; kineto + nsys: about 2 minutes, under 4 at their time limits):

- ``kineto``: a torchrun job (one rank per GPU, NCCL all-reduce of the gradients when there are two
  GPUs; two ranks without a process group on one GPU) started with ``kineto_env(poll_s=1)``. A
  :class:`KinetoDaemon` and a :class:`CaptureManager` (as the agent runs them) capture 3
  iterations of rank 1 only. Checks: one trace, from rank 1's pid, none from rank 0 or the torchrun
  launcher (which polls too); kernels in it; latency command → daemon answered → trace complete.
- ``nsys``: the same loop under ``nsys launch --session-new=perfd-<job>``; the manager runs
  ``nsys start``/``stop`` for 2 s, exports SQLite and analyses it; per device, busy and NCCL time
  must match :func:`direct_sql_check` (plain SQL) within 1%.
- ``range`` (optional): the loop with the perfd step hook under
  ``nsys profile -c cudaProfilerApi --capture-range-end=repeat`` (one nsys per rank, via
  ``torchrun --no-python``); the manager asks rank 1's hook for 3 steps; its report is analysed.

Prints a compact JSON summary and writes it to OUT_DIR/captures_summary.json. Exit 0 when every part
that ran passed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfd.capture.binaries import find_nsys  # noqa: E402
from perfd.capture.kineto_daemon import KinetoDaemon, KinetoDaemonError, kineto_env  # noqa: E402
from perfd.capture.manager import CaptureManager  # noqa: E402
from perfd.capture.nsys_exec import NsysExecutor, nsys_launch_argv, nsys_range_argv, session_name  # noqa: E402
from perfd.capture.nsys_sqlite import direct_sql_check  # noqa: E402
from perfd.capture.store import CaptureStore  # noqa: E402

TRAIN = r'''
import os, sys, time
import torch
out, seconds = sys.argv[1], float(sys.argv[2])
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
cuda = torch.cuda.is_available()  # without a GPU (a dry run of this script's plumbing): CPU, small
ngpu = torch.cuda.device_count()
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % ngpu) if cuda else torch.device("cpu")
sync = torch.cuda.synchronize if cuda else (lambda: None)
if cuda:
    torch.cuda.set_device(dev)
dist = cuda and world > 1 and ngpu >= world
if dist:
    torch.distributed.init_process_group("nccl", device_id=dev)
H = 4096 if cuda else 256
model = torch.nn.Sequential(*[torch.nn.Linear(H, H) for _ in range(4)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
hook = None
if os.environ.get("PERFD_HOOK") == "1":
    from perfd.hook import StepHook
    hook = StepHook(warmup_steps=2, flush_interval_s=0.05)
with open(f"{out}/rank{rank}.pid", "w") as f:
    f.write(str(os.getpid()))
t0, step = time.time(), 0
while time.time() - t0 < seconds:
    step += 1
    if hook:
        hook.step_begin(step)
    with torch.autograd.profiler.record_function(f"step{step}"):
        loss = model(torch.randn(256, H, device=dev)).square().mean()
        opt.zero_grad()
        loss.backward()
        if dist:
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
        opt.step()
    if hook:
        hook.step_end()
    if step == 20:
        sync()
        open(f"{out}/rank{rank}.ready", "w").write(str(step))
    time.sleep(0.01)
if hook:
    hook.close(1.0)
sync()
if dist:
    torch.distributed.destroy_process_group()
'''


@dataclass
class Cmd:
    """perfd.transport.codec.Command's fields (the manager needs no more; no protobuf needed here)."""

    kind: str
    job: str
    ranks: tuple[int, ...] = ()
    args: dict[str, str] = field(default_factory=dict)
    id: str = ""


def gpu_count() -> int:
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return 0
    return len([ln for ln in res.stdout.splitlines() if ln.startswith("GPU ")])


class Job:
    """A process group we started, stopped by group at the end (never anything else)."""

    def __init__(self, argv: list[str], workdir: Path, env: dict[str, str], log: Path) -> None:
        self.workdir = workdir
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, ranks: int, timeout_s: float) -> bool:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if all((self.workdir / f"rank{r}.ready").exists() for r in range(ranks)):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.2)
        return False

    def pids(self) -> dict[int, int]:
        out = {}
        for p in self.workdir.glob("rank*.pid"):
            out[int(p.stem[4:])] = int(p.read_text())
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def base_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    env.update(extra)
    return env


def torchrun(nproc: int, script: Path, workdir: Path, seconds: int, per_rank_prefix: list[str] | None = None
             ) -> list[str]:
    """torchrun of the training script; ``per_rank_prefix`` (e.g. ``nsys profile ...``) wraps each rank."""
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    rank_cmd = [sys.executable, str(script), str(workdir), str(seconds)]
    if per_rank_prefix is not None:  # --no-python: torchrun runs the program given, once per rank
        return [*head, "--no-python", *per_rank_prefix, *rank_cmd]
    return [*head, *rank_cmd[1:]]


def summarize(manifest: Mapping[str, Any]) -> dict[str, Any]:
    t = manifest.get("timings") or {}
    req = t.get("requested_at") or 0.0

    def rel(key: str) -> float | None:
        return round(t[key] - req, 3) if t.get(key) else None

    return {"id": manifest.get("id"), "status": manifest.get("status"), "reason": manifest.get("reason"),
            "tool": manifest.get("tool"), "mode": manifest.get("mode"), "ranks": manifest.get("ranks"),
            "latency_s": manifest.get("latency_s"), "first_event_s": rel("first_event_at"),
            "trace_ready_s": rel("trace_ready_at"), "finished_s": rel("finished_at"),
            "artifacts": [(a["name"], a["bytes"]) for a in manifest.get("artifacts", [])],
            "devices": {k: v.get("summary", v.get("error"))
                        for k, v in (manifest.get("analysis") or {}).items()}}


# --- (a) Kineto --------------------------------------------------------------------------------
def part_kineto(out: Path, ngpu: int) -> dict[str, Any]:
    work = out / "kineto"
    work.mkdir(parents=True, exist_ok=True)
    store = CaptureStore(work / "captures", 4 * 2**30)
    script = work / "train.py"
    script.write_text(TRAIN)
    nproc = max(2, min(ngpu, 2))
    try:
        daemon = KinetoDaemon(socket_dir="").start()  # the real abstract name "\0dynolog\0"
        sock_dir = None
    except KinetoDaemonError as exc:
        print(f"abstract dynolog name in use ({exc}); using a socket directory", flush=True)
        sock_dir = str(work / "ipc")
        Path(sock_dir).mkdir(exist_ok=True)
        daemon = KinetoDaemon(socket_dir=sock_dir).start()
    env = base_env(kineto_env(poll_s=1, config_dir=work, socket_dir=sock_dir, trace_dir=store.root))
    events: list[dict[str, Any]] = []
    job = Job(torchrun(nproc, script, work, 120), work, env, work / "job.log")
    result: dict[str, Any] = {"nproc": nproc, "nccl": ngpu >= 2}
    try:
        if not job.wait_ready(nproc, 45):
            return {**result, "ok": False, "error": "job not ready", "log": job.log.name}
        pids = job.pids()
        mgr = CaptureManager(store, daemon, pids_for_ranks=lambda j, r: pids, emit=events.append)
        t0 = time.time()
        args = {"tool": "kineto", "steps": "3", "timeout_s": "40"}
        cid = mgr.handle(Cmd("capture", "gpu-kineto", (1,), args, "k1"))  # type: ignore[arg-type]
        mgr.wait_idle(45)
        m = store.read(str(cid))
        result["capture"] = summarize(m)
        traces = sorted(p.name for p in store.root.rglob("*.json") if p.name != "manifest.json")
        strays = [f"/tmp/libkineto_activities_{p}.json" for p in pids.values()
                  if os.path.exists(f"/tmp/libkineto_activities_{p}.json")]
        trace_ok = traces == [f"rank1_{pids[1]}.json"] and not strays
        doc = json.loads((store.capture_dir(str(cid)) / traces[0]).read_text()) if traces else {}
        evs = doc.get("traceEvents", [])
        annotations = [str(e.get("name", "")) for e in evs if e.get("cat") == "user_annotation"]
        result.update({
            "pids": pids, "pollers": sorted(daemon.requests_seen), "launcher_polled": any(
                p not in pids.values() for p in daemon.requests_seen),
            "answers_sent": daemon.answers_sent, "traces": traces, "stray_default_traces": strays,
            "trace_rank": (doc.get("distributedInfo") or {}).get("rank"),
            "optimizer_steps_in_trace": len([e for e in annotations if e.startswith("Optimizer.step")]),
            "step_annotations_in_trace": sorted(
                {e for e in annotations if e[:4] == "step" and e[4:].isdigit()}, key=lambda n: int(n[4:])),
            "kernels_in_trace": sum(1 for e in evs if e.get("cat") == "kernel"),
            "events": [e["kind"] for e in events], "wall_s": round(time.time() - t0, 2),
        })
        devices = (m.get("analysis") or {}).get("1", {}).get("devices") or []
        result["ok"] = bool(m["status"] == "ok" and trace_ok and result["kernels_in_trace"] > 0 and devices
                            and daemon.answers_sent == 1)
        return result
    finally:
        job.stop()
        daemon.stop()


# --- (b) nsys interactive session --------------------------------------------------------------
def compare(analysis: dict[str, Any], sql: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
    rows, ok = [], True
    for d in analysis.get("devices", []):
        s = sql["devices"].get(d["device"]) or sql["devices"].get(str(d["device"])) or {}
        row = {"device": d["device"], "busy_ms": d["busy_ms"], "sql_busy_ms": s.get("busy_union_ms"),
               "comm_ms": d["comm_ms"], "sql_nccl_ms": s.get("nccl_union_ms"),
               "kernels": d["kernel_count"], "sql_kernels": s.get("kernel_count")}
        for a, b in (("busy_ms", "sql_busy_ms"), ("comm_ms", "sql_nccl_ms")):
            x, y = row[a], row[b]
            good = y is not None and abs(x - y) <= max(0.01 * abs(y), 1e-6)
            row[f"{a}_within_1pct"] = good
            ok = ok and good
        ok = ok and row["kernels"] == row["sql_kernels"]
        rows.append(row)
    return ok and bool(rows), rows


def part_nsys(out: Path, ngpu: int) -> dict[str, Any]:
    work = out / "nsys"
    work.mkdir(parents=True, exist_ok=True)
    store = CaptureStore(work / "captures", 8 * 2**30)
    script = work / "train.py"
    script.write_text(TRAIN)
    nsys = find_nsys()
    nproc = max(1, min(ngpu, 2))
    job_name = "gpu-nsys"
    argv = nsys_launch_argv(nsys, session_name(job_name), torchrun(nproc, script, work, 150))
    job = Job(argv, work, base_env({}), work / "job.log")
    events: list[dict[str, Any]] = []
    result: dict[str, Any] = {"nproc": nproc, "nsys": nsys, "argv": argv[:8]}
    try:
        if not job.wait_ready(nproc, 60):
            return {**result, "ok": False, "error": "job not ready under nsys launch", "log": job.log.name}
        pids = job.pids()
        ex = NsysExecutor(timeout_s=60, export_timeout_s=120)
        result["sessions"] = ex.sessions()
        mgr = CaptureManager(store, None, ex, pids_for_ranks=lambda j, r: pids, emit=events.append)
        cid = mgr.handle(Cmd("capture", job_name, (), {"tool": "nsys", "duration_ms": "2000",
                                                        "timeout_s": "75"}, "n1"))  # type: ignore[arg-type]
        mgr.wait_idle(80)
        m = store.read(str(cid))
        result["capture"] = summarize(m)
        result["events"] = [e["kind"] for e in events]
        sqlite = next((a["path"] for a in m.get("artifacts", []) if a["kind"] == "nsys_sqlite"), None)
        if m["status"] != "ok" or sqlite is None:
            return {**result, "ok": False}
        analysis = next(iter(m["analysis"].values()))
        ok, rows = compare(analysis, direct_sql_check(sqlite))
        result.update({"ok": ok, "vs_sql": rows})
        return result
    finally:
        job.stop()


# --- (c) step-aligned range through the hook ---------------------------------------------------
def part_range(out: Path, ngpu: int) -> dict[str, Any]:
    from perfd.collectors.hook.collector import HookCollector

    work = out / "range"
    work.mkdir(parents=True, exist_ok=True)
    store = CaptureStore(work / "captures", 8 * 2**30)
    script = work / "train.py"
    script.write_text(TRAIN)
    nsys = find_nsys()
    job_name = "gpu-range"
    ex = NsysExecutor(timeout_s=120, range_dir=store.root / "nsys-ranges")
    base1 = ex.range_base(job_name, 0)
    assert base1 is not None
    base1.parent.mkdir(parents=True, exist_ok=True)
    sock = str(work / "hook.sock")
    hook = HookCollector({"socket_path": sock, "job": job_name, "mode": 0o666})
    hook.start()
    nproc = 2
    # nsys_range_argv(nsys, BASE, CMD) is [nsys, profile, ..., -o, BASE, *CMD]: its head wraps each rank.
    wrapper = nsys_range_argv(nsys, str(base1.parent / "rank%q{RANK}"), ["CMD"])[:-1]
    job = Job(torchrun(nproc, script, work, 150, per_rank_prefix=wrapper), work,
              base_env({"PERFD_HOOK": "1", "PERFD_HOOK_SOCKET": sock}), work / "job.log")
    events: list[dict[str, Any]] = []
    stop = threading.Event()
    mgr = CaptureManager(store, None, ex, hook_requester=hook.request_profile,
                         pids_for_ranks=lambda j, r: {k: v for k, v in job.pids().items() if not r or k in r},
                         emit=events.append,
                         hook_last_step=lambda r: hook.peers[r].last_step if r in hook.peers else None)

    def pump() -> None:  # what the agent's scheduler does: collect, forward hook events
        while not stop.is_set():
            for ev in hook.collect(time.time()).events:
                mgr.on_hook_event(ev)
            time.sleep(0.05)

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    result: dict[str, Any] = {"nproc": nproc, "argv": wrapper}
    try:
        if not job.wait_ready(nproc, 150):
            return {**result, "ok": False, "error": "job not ready under nsys profile", "log": job.log.name}
        time.sleep(1.0)  # the hook's records reach the collector: the peers are known
        cid = mgr.handle(Cmd("capture", job_name, (1,), {"tool": "nsys", "mode": "range", "steps": "3",
                                                         "timeout_s": "150"}, "r1"))  # type: ignore[arg-type]
        mgr.wait_idle(170)
        m = store.read(str(cid))
        result.update({"capture": summarize(m), "events": [e["kind"] for e in events],
                       "steps": m.get("steps"),
                       "range_files": sorted(p.name for p in base1.parent.iterdir()),
                       "hook_peers": sorted(hook.peers)})
        sqlite = next((a["path"] for a in m.get("artifacts", []) if a["kind"] == "nsys_sqlite"), None)
        if m["status"] != "ok" or sqlite is None:
            return {**result, "ok": False}
        ok, rows = compare(next(iter(m["analysis"].values())), direct_sql_check(sqlite))
        result.update({"ok": ok, "vs_sql": rows})
        return result
    finally:
        stop.set()
        job.stop()
        hook.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="kineto,nsys")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ngpu = gpu_count()
    summary: dict[str, Any] = {"gpus": ngpu, "python": sys.version.split()[0]}
    parts = {"kineto": part_kineto, "nsys": part_nsys, "range": part_range}
    for name in [p.strip() for p in a.parts.split(",") if p.strip()]:
        t0 = time.time()
        try:
            summary[name] = parts[name](a.out, ngpu)
        except Exception as exc:  # one part failing must not hide the others
            summary[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        summary[name]["part_s"] = round(time.time() - t0, 1)
        print(name, json.dumps(summary[name], default=str), flush=True)
    (a.out / "captures_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    ok = all(summary[n].get("ok") for n in parts if n in summary)
    print(json.dumps({"ok": ok, **{n: summary[n].get("ok") for n in parts if n in summary}}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
