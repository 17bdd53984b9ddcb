"""On 1 GPU (docs/evidence/entries/26-plain-pytorch-loops-no-rank-irregular-steps-a-data-bound-loa.md): two
plain-PyTorch loops (no Megatron, no torchrun, no RANK), checked against their own clocks.

    python3 tests/gpu/plain_loop_live.py OUT_DIR [--jobs data,varlen]

``data``: a GPT-like decoder stack (embedding, pre-norm causal layers, LM head; bf16 autocast, fused
AdamW) fed by a ``torch.utils.data.DataLoader`` with 2 workers whose samples cost real CPU time
(a busy loop standing for decode and augmentation), sized so that the GPU waits on data about a
third of the time; the two workers make the waits alternate (a short one, a long one). SLOW_AT
seconds in, for SLOW_S seconds, the samples cost SLOW_X times as much. Each batch carries whether a
sample of it was made in the slow phase: the truth of the slow stretch. Started as ``python3
train.py`` under ``perfd launch`` (no ``--kineto``) with a real agent (NVML) and aggregator holding a
rule that captures the job once it has stepped CAPTURE_AFTER_S seconds.

``varlen``: the same stack with no data wait, a sequence of 512, 1024 or 2048 drawn per step (steps
vary ~4x by design), ``step_end(tokens=, flops=)`` per step; a co-tenant bf16 matmul process on the
same GPU from BURN_AT for BURN_S seconds.

Each loop writes its own clock per step (begin, data ready, end after a device sync; the batch's
slow flag or the step's FLOPs). After each job the script reads the aggregator's summary, incidents,
report and captures and compares (OUT_DIR/plain_loop.json, .md):

- data: steady data share (Σ wait ÷ Σ step outside the slow stretch) within 3 points, class
  data-bound, one incident over the slow stretch whose ends are within 20 steps of the truth and
  whose cost is within 10% of Σ(step − steady mean step) over it, none elsewhere, R1 a data-loading
  remedy; the rank's GPU placed and its host evidence present with no RANK set;
- varlen: MFU's TFLOP/s within 2% of Σ FLOPs ÷ Σ time over the steps clear of the co-tenant, no
  step-jitter finding, an incident naming the co-tenant's pid.

The loops' clocks are kept (OUT_DIR/<job>_steps.json.gz): the CPU suite replays them
(tests/analytics/test_irregular_loops.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu.verdict_live import BURN, RULES, view
from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

WARMUP = 10  # steps of the loops' own clocks left out of every truth (compile, allocator, workers)
RUN_S = float(os.environ.get("RUN_S", "130"))
SLOW_AT = float(os.environ.get("SLOW_AT", "50"))
SLOW_S = float(os.environ.get("SLOW_S", "50"))
SLOW_X = float(os.environ.get("SLOW_X", "3"))
VAR_RUN_S = float(os.environ.get("VAR_RUN_S", "80"))
BURN_AT = float(os.environ.get("BURN_AT", "30"))
BURN_S = float(os.environ.get("BURN_S", "35"))
CAPTURE_AFTER_S = float(os.environ.get("CAPTURE_AFTER_S", "20"))

MODEL = r'''
import math, torch
import torch.nn.functional as F
V, H, L, HEADS = 8192, 2048, 4, 16


class GPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, H)
        layer = torch.nn.TransformerEncoderLayer(H, HEADS, 4 * H, dropout=0.0, batch_first=True,
                                                   norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.head = torch.nn.Linear(H, V, bias=False)

    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.body(self.emb(x), mask=mask, is_causal=True))


def flops(model, b, s):
    """Model FLOPs of one step: 6 x matmul parameters x tokens, plus attention's scores and context
    (4 s h per token per layer forward, x3 with backward)."""
    p = sum(q.numel() for n, q in model.named_parameters() if not n.startswith("emb."))
    return 6 * p * b * s + 12 * L * s * H * b * s


def train_step(model, opt, toks):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(toks[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, V), toks[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''

TRAIN_DATA = MODEL + r'''
import json, sys, time
from torch.utils.data import DataLoader, Dataset
from perfd.hook import StepHook

OUT, RUN_S, SLOW_AT, SLOW_S, SLOW_X = sys.argv[1], *map(float, sys.argv[2:6])
B, S = 16, 1024
T0 = time.time()


class Samples(Dataset):
    """Each sample costs CPU (decode, augment): a busy loop of sample_ms, SLOW_X times that while the
    slow phase lasts (wall clock: the workers are forked and share it)."""

    def __init__(self, sample_ms):
        self.sample_ms, self.slow_from, self.slow_to = sample_ms, T0 + SLOW_AT, T0 + SLOW_AT + SLOW_S

    def __len__(self):
        return 10 ** 8

    def __getitem__(self, i):
        slow = self.slow_from <= time.time() < self.slow_to
        t, n = time.perf_counter(), 0
        end = t + self.sample_ms * (SLOW_X if slow else 1.0) / 1e3
        while time.perf_counter() < end:
            n += 1
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, V, (S + 1,), generator=g), slow


model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
F_STEP = flops(model, B, S)
x = torch.randint(0, V, (B, S + 1), device="cuda")
for _ in range(3):
    train_step(model, opt, x)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(5):
    train_step(model, opt, x)
torch.cuda.synchronize()
compute_ms = (time.perf_counter() - t) / 5 * 1e3
# Two workers, each a batch of B samples: data-bound when a batch's CPU time / 2 > compute; the data
# wait is about a third of the step when a batch costs 3x compute.
sample_ms = 3.0 * compute_ms / B
loader = DataLoader(Samples(sample_ms), batch_size=B, num_workers=2, pin_memory=True, persistent_workers=True)
hook = StepHook(tokens_per_step=B * S, flops_per_step=F_STEP, dtype="bf16", warmup_steps=5)
rows, it, i = [], iter(loader), 0
while time.time() - T0 < RUN_S:
    i += 1
    tb = time.perf_counter()
    hook.step_begin(i)
    toks, slow = next(it)
    toks = toks.cuda(non_blocking=True)
    hook.data_ready()
    td = time.perf_counter()
    train_step(model, opt, toks)
    hook.step_end()
    torch.cuda.synchronize()  # the loop's own clock: a step ends when the device is done
    te = time.perf_counter()
    rows.append([i, round(tb, 6), round(td, 6), round(te, 6), int(bool(slow.any())), time.time()])
json.dump({"compute_ms": compute_ms, "sample_ms": sample_ms, "flops_per_step": F_STEP, "B": B, "S": S,
           "pid": __import__("os").getpid(), "steps": rows}, open(OUT, "w"))
'''

TRAIN_VARLEN = MODEL + r'''
import json, random, sys, time
from perfd.hook import StepHook

OUT, RUN_S = sys.argv[1], float(sys.argv[2])
B = 8
SEQS = (512, 1024, 2048)
T0 = time.time()
model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
hook = StepHook(dtype="bf16", warmup_steps=5)
rng = random.Random(44)
rows, i = [], 0
while time.time() - T0 < RUN_S:
    i += 1
    s = rng.choice(SEQS)
    tb = time.perf_counter()
    hook.step_begin(i)
    toks = torch.randint(0, V, (B, s + 1), device="cuda")
    hook.data_ready()
    td = time.perf_counter()
    train_step(model, opt, toks)
    f = flops(model, B, s)
    hook.step_end(tokens=B * s, flops=f)
    torch.cuda.synchronize()
    te = time.perf_counter()
    rows.append([i, round(tb, 6), round(td, 6), round(te, 6), s, f, time.time()])
json.dump({"B": B, "pid": __import__("os").getpid(), "steps": rows}, open(OUT, "w"))
'''



def _incidents(base: str, job: str) -> list[dict[str, Any]]:
    got = get_json(f"{base}/jobs/{job}/incidents")
    return list(got.get("incidents") or []) if isinstance(got, dict) else list(got)


def run_job(out: Path, job: str, train: str, argv: list[str], seconds: float,
            during: Any = None) -> dict[str, Any]:
    """One loop under perfd launch, an agent with real NVML, an aggregator with the capture rule."""
    raw = out / f"raw_{job}"
    raw.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"job": job}
    env = run_env(drop=("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON"))
    procs = Procs(raw, env)
    own = raw / "own_steps.json"
    try:
        (raw / "rules.yaml").write_text(RULES.format(for_s=int(CAPTURE_AFTER_S)))
        (raw / "train.py").write_text(train)
        grpc_port, _, url = start_aggregator(procs, "--rules", raw / "rules.yaml", "--rules-interval", "1")
        base = f"{url}/api"
        run_dir = raw / "run"
        launch = procs.perfd("launch", "launch", "--job", job, "--run-dir", str(run_dir), "--",
                             sys.executable, str(raw / "train.py"), str(own), *argv)
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (raw / "agent.yaml").write_text(f"capture_dir: {raw / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml",
                    nvml=os.environ.get("PERFD_NVML", "real"))
        t0 = time.time()
        extra = during(procs, raw, env, t0) if during is not None else None
        polls: list[dict[str, Any]] = []
        while launch.poll() is None and time.time() - t0 < seconds + 120:
            try:
                s = get_json(f"{base}/jobs/{job}/summary")
                polls.append({"t": round(time.time() - t0, 1), "bottleneck": (s.get("summary") or {})
                              .get("bottleneck"), "n_inc": len(_incidents(base, job))})
            except Exception as exc:
                polls.append({"t": round(time.time() - t0, 1), "error": repr(exc)})
            time.sleep(5)
        res["job_exit"] = launch.poll()
        res["polls"] = polls
        time.sleep(8)
        full = get_json(f"{base}/jobs/{job}/summary")
        res["view"] = view(full)
        summ = full.get("summary") or {}
        res["medians"] = summ.get("medians")
        res["step_time_cv"] = summ.get("step_time_cv")
        res["steady"] = {k: summ.get(k) for k in ("steady_first_iteration", "steady_last_iteration",
                                                  "n_steady", "warmup_records", "jitter")}
        rep = full.get("report") or {}
        res["findings"] = [{"id": f.get("id"), "title": f.get("title")} for f in rep.get("findings") or []]
        res["recommendations"] = [{k: r.get(k) for k in ("finding_id", "remedy", "title", "action", "detail",
                                                         "impact")}
                                  for r in (rep.get("recommendations") or [])[:3]]
        res["slow_steps"] = summ.get("slow_steps")
        res["incidents"] = _incidents(base, job)
        res["placement"] = full.get("ranks")
        res["gpus"] = json.dumps(get_json(f"{base}/jobs/{job}/gpus"), default=str)[:6000]
        res["captures"] = [{k: c.get(k) for k in ("id", "state", "tool", "mechanism", "error", "ranks",
                                                  "findings", "reason")}
                           for c in get_json(f"{base}/captures").get("captures") or []]
        res["extra"] = extra
        if own.exists():
            res["own"] = json.loads(own.read_text())
        res["agent_tail"] = (raw / "agent.out").read_text()[-1500:] if (raw / "agent.out").exists() else None
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["agent_tail"] = (raw / "agent.out").read_text()[-1500:] if (raw / "agent.out").exists() else None
        launched = raw / "launch.out"
        res["train_tail"] = launched.read_text()[-3000:] if launched.exists() else None
    finally:
        procs.stop()
    return res


def truth_data(own: dict[str, Any]) -> dict[str, Any]:
    rows = own["steps"][WARMUP:]
    step = {r[0]: (r[3] - r[1]) * 1e3 for r in rows}
    wait = {r[0]: (r[2] - r[1]) * 1e3 for r in rows}
    slow = [r[0] for r in rows if r[4]]
    first, last = (min(slow), max(slow)) if slow else (None, None)
    steady = [i for i in step if first is None or not first <= i <= last]
    base = statistics.fmean(step[i] for i in steady)
    return {"data_share": sum(wait[i] for i in steady) / sum(step[i] for i in steady),
            "steady_step_ms": base, "slow_first": first, "slow_last": last,
            "cost_s": sum(step[i] - base for i in slow if first is not None) / 1e3 if slow else None,
            "n_steps": len(own["steps"]), "compute_ms": own["compute_ms"], "sample_ms": own["sample_ms"],
            "waits_ms_first_steady": [round(wait[i], 1) for i in steady[:8]]}


def check_data(res: dict[str, Any]) -> dict[str, Any]:
    t = truth_data(res["own"])
    med = res.get("medians") or {}
    incs = [i for i in res.get("incidents") or [] if "capture" not in (i.get("kinds") or [])]
    over = [i for i in incs if t["slow_first"] is not None and i["last_iteration"] >= t["slow_first"] - 20
            and i["first_iteration"] <= t["slow_last"] + 20]
    r1 = (res.get("recommendations") or [{}])[0]
    c: dict[str, Any] = {"truth": t, "data_share": med.get("data_share"),
                         "bottleneck": (res.get("view") or {}).get("bottleneck"),
                         "incidents": [(i["first_iteration"], i["last_iteration"], i.get("cost_s"),
                                        i.get("kinds")) for i in incs], "r1": r1}
    c["ok_share"] = med.get("data_share") is not None and abs(med["data_share"] - t["data_share"]) <= 0.03
    c["ok_class"] = c["bottleneck"] == "data-bound"
    c["ok_one_incident"] = len(over) == 1 and len(incs) == 1
    if len(over) == 1:
        inc = over[0]
        c["start_off"] = inc["first_iteration"] - t["slow_first"]
        c["end_off"] = inc["last_iteration"] - t["slow_last"]
        c["cost_ratio"] = (inc.get("cost_s") or 0) / t["cost_s"] if t["cost_s"] else None
        c["ok_edges"] = abs(c["start_off"]) <= 20 and abs(c["end_off"]) <= 20
        c["ok_cost"] = c["cost_ratio"] is not None and abs(c["cost_ratio"] - 1) <= 0.10
    c["ok_r1"] = r1.get("remedy") == "data_loader" or "data" in str(r1.get("finding_id"))
    return c


def burner(procs: Procs, raw: Path, env: dict[str, str], t0: float) -> dict[str, Any]:
    (raw / "burn.py").write_text(BURN)
    info: dict[str, Any] = {}

    def start() -> None:
        p = subprocess.Popen([sys.executable, str(raw / "burn.py")], env={**env, "BURN_S": str(BURN_S)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        info.update(pid=p.pid, start=time.time(), end=time.time() + BURN_S)

    import threading

    threading.Timer(BURN_AT, start).start()
    return info


def clean_steps(rows: list[list[Any]], span: int = 25) -> list[list[Any]]:
    """The varlen loop's steps after warm-up outside the co-tenant's stretch, by the loop's own clock
    alone: those whose run of ``span`` steps around them keeps its FLOPs rate within 20% of the run's
    median run. (Not the co-tenant's planned start and end: its CUDA start-up puts its real stretch
    seconds later, seen on the H100.)"""
    def rate(rs: list[list[Any]]) -> float:
        return float(sum(r[5] for r in rs) / sum(r[3] - r[1] for r in rs))

    rows = rows[WARMUP:]
    rates = [rate(rows[max(0, i - span // 2):i + span // 2 + 1]) for i in range(len(rows))]
    typical = statistics.median(rates)
    return [r for r, x in zip(rows, rates, strict=True) if x > 0.8 * typical]


def check_varlen(res: dict[str, Any]) -> dict[str, Any]:
    own, extra = res["own"], res.get("extra") or {}
    clear = clean_steps(own["steps"])
    tflops = sum(r[5] for r in clear) / sum(r[3] - r[1] for r in clear) / 1e12
    med = res.get("medians") or {}
    got = med.get("model_tflops_per_gpu")
    incs = res.get("incidents") or []
    pid = extra.get("pid")
    c: dict[str, Any] = {"truth_tflops": tflops, "tflops": got, "mfu": med.get("mfu"),
                         "cv": res.get("step_time_cv"), "co_tenant_pid": pid,
                         "incidents": [(i["first_iteration"], i["last_iteration"], i.get("cost_s"),
                                        (i.get("cause") or "")[:300]) for i in incs]}
    c["ok_mfu"] = got is not None and abs(got / tflops - 1) <= 0.02
    c["ok_no_jitter"] = not any(f.get("id") == "step-jitter" for f in res.get("findings") or [])
    c["ok_cotenant_named"] = pid is not None and any(str(pid) in json.dumps(i) for i in incs)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", default="data,varlen")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    for job in args.jobs.split(","):
        if job == "data":
            r = run_job(args.out, "plain-data", TRAIN_DATA,
                        [str(RUN_S), str(SLOW_AT), str(SLOW_S), str(SLOW_X)], RUN_S)
            checks[job] = check_data(r) if "own" in r else {"error": r.get("error")}
        else:
            r = run_job(args.out, "plain-varlen", TRAIN_VARLEN, [str(VAR_RUN_S)], VAR_RUN_S, during=burner)
            checks[job] = check_varlen(r) if "own" in r else {"error": r.get("error")}
        if "own" in r:
            with gzip.open(args.out / f"{job}_steps.json.gz", "wt") as f:
                json.dump(r.pop("own"), f)
        results[job] = r
        (args.out / "plain_loop.json").write_text(json.dumps({"results": results, "checks": checks},
                                                             indent=1, default=str))
        print(json.dumps({job: checks[job]}, default=str), flush=True)
    ok = all(v for c in checks.values() for k, v in c.items() if k.startswith("ok_"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
