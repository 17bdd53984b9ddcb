"""On 1 GPU: perfd's plan for a real Megatron-LM job, written down before anything changes, then each item
that can run here applied alone and the plan's set together (issue "the plan an engineer would make").

    MEGATRON_DIR=... python3 tests/gpu/plan_ab_live.py OUT --configs gqa_swiglu [--prior DIR] [--budget-s 530]
        [--pin 2-5] [--base-every 1] [--repeat 2] [--estimate median] [--job-flags "--manual-gc"]
    python3 tests/gpu/plan_ab_live.py OUT --table-only --prior DIR [--prior DIR2]   # the tables again

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20), run beside the
project (`--transformer-impl local`, no Transformer Engine, Apex or flash-attn on the GPU machine). Per
configuration (:data:`CONFIGS`, two beyond the remedies' H100 job of
docs/evidence/entries/25-remedies-applied-one-at-a-time-on-the-issue-s-h100-job-attri.md: a GQA + SwiGLU +
RoPE model at micro-batch 2, and a 4096-token sequence at micro-batch 1):

1. ``capture``: the job with ``KINETO_USE_DAEMON=1`` beside perfd's own Kineto daemon; one steady 3-step
   capture (Kineto's on-demand default: CPU ops, no stacks), cut to what the attribution reads
   (tests/gpu/remedies_live.py ``cut_trace``);
2. the plan: `perfd analyze megatron LOG --capture TRACE` in the process (the same functions), written to
   ``plan_<config>.json`` with the time it was written, BEFORE any change runs;
3. the job as it ran (``base``), then each plan item whose options can be applied here alone and the
   plan's set together, the base again after each (``base_<n>``: a change is held to the base runs
   either side of it, the machine's drift between runs cancelling), the plan re-read at the first base
   run's step before any change; each measured from Megatron-LM's own logged iteration times (the
   median of the iterations from :data:`STEADY_FROM` on). A configuration takes more than one call:
   ``--prior`` resumes it. ``--repeat N`` (default 1): the changes (the singles, then the set) run N times
   in turn, pass after pass, the bases still between them per ``--base-every`` (numbered on: with a base
   after every change, pass 2 of 6 changes is ``<change>@2``, ``base_7``, ...); a change's k-th run is
   ``<change>@<k>`` from the second on, the first keeps its plain name (so an A/B made before
   ``--repeat``, resumed with ``--repeat 2``, gains a second pass). The table's saving is then the mean of
   each run's against the bases either side of it (:func:`run_order` gives the order).

Everything is written to OUT as it happens (``ab_<config>.json`` after every run) and printed with its
timings. ``--prior DIR``: a directory an earlier call wrote (carried to this one): its configurations'
results are kept, an unfinished one is resumed (the runs done are not run again) and the tables cover them
all. ``--budget-s``: the call stops starting runs that would end past it (the tables are still written).
Output: ``table.json`` and ``table.md`` (tests/gpu/plan_ab_table.py), the cut trace and the capture run's
log of each configuration (the CPU tests replay them).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu import host_procs
from tests.gpu.plan_ab_table import ESTIMATES, estimate_of, is_base, markdown, repeat_key, split_repeat, table
from tests.gpu.remedies_live import apply_flags, capture, cut_trace, log_steps, rank_pid
from tests.procs import ROOT, run_env

ITERS = int(os.environ.get("ITERS", "30"))  # 24 steady steps: remedies.RUN_SPREAD_STEPS and more
CAPTURE_ITERS = 400  # a ceiling: the captured run stops once its trace is written and steady steps follow
STEADY_AFTER = 8  # steady iterations kept after the trace was written (the captured run's own reference)
CAPTURE_AT = 9  # the iteration after which the capture is armed (steady by then)
STEADY_FROM = 6  # iterations before this one are warm-up
RUN_TIMEOUT_S = 240
# Set by --pin / --base-every. On the H200 (16 vCPUs, one NUMA node, no steal) the base stepped 368-409 ms
# in three runs left to the scheduler and 382-392 ms held to four cores (tests/gpu/host_noise_live.py):
# a host-bound job's clock moves with where its main thread runs.
PREFIX: list[str] = []
BASE_EVERY = 1  # a base run after this many changes (1: ABAB)
# Set by --job-flags: options every run takes, the captured one too (the job as it is: e.g. Megatron-LM's
# --manual-gc, should it quiet the host; docs/evidence/plan_h100_v4/host_noise)
JOB_FLAGS: list[str] = []
REPEAT = 1  # set by --repeat: how many times the changes run, in turn (a base-bounded noise average)
ESTIMATE = ESTIMATES[0]  # set by --estimate: a change's saving over its runs (plan_ab_table), fixed first
START_S = 45.0  # a run's start-up and teardown, before its first measurement (Megatron-LM, torch)

# Beyond the remedies' H100 job, big2048 (MHA, GELU, seq 2048, micro-batch 4) and the h=1024 job.
CONFIGS: dict[str, dict[str, Any]] = {
    # GQA (4 groups of 16 heads), SwiGLU, RoPE, micro-batch 2 (4 micro-batches a step)
    "gqa_swiglu": {
        "layers": 12,
        "hidden": 2048,
        "heads": 16,
        "seq": 2048,
        "mbs": 2,
        "gbs": 8,
        "extra": [
            "--group-query-attention",
            "--num-query-groups",
            "4",
            "--swiglu",
            "--position-embedding-type",
            "rope",
            "--no-rope-fusion",
            "--no-bias-swiglu-fusion",
        ],
    },
    # a long sequence: attention's s² work dominates; micro-batch 1 (4 micro-batches a step)
    "long_seq": {"layers": 8, "hidden": 1024, "heads": 8, "seq": 4096, "mbs": 1, "gbs": 4, "extra": []},
    # a wide model whose kernels hide the host (H100: host noise moved a host-bound job's 25-step median by
    # ±20 ms between identical runs, docs/evidence/plan_h100_v6): what a change saves here is its own
    "wide_gpu": {"layers": 8, "hidden": 3072, "heads": 24, "seq": 2048, "mbs": 2, "gbs": 8, "extra": []},
    # wide_gpu's width with GQA (8 groups of 24 heads), SwiGLU and RoPE: kernels still hide the host
    "wide_swiglu": {
        "layers": 8,
        "hidden": 3072,
        "heads": 24,
        "seq": 2048,
        "mbs": 2,
        "gbs": 8,
        "extra": ["--group-query-attention", "--num-query-groups", "8", "--swiglu",
                  "--position-embedding-type", "rope", "--no-rope-fusion", "--no-bias-swiglu-fusion"],
    },
    # a configuration no gain model was fitted on: hidden 4096 (the widest GEMMs yet), 6 layers, micro-batch 1
    # (8 micro-batches of 2k rows a step); MHA, GELU. Chosen before its first run, for gain model 7's A/B
    "wide4k_mb1": {"layers": 6, "hidden": 4096, "heads": 32, "seq": 2048, "mbs": 1, "gbs": 8, "extra": []},
    # many small micro-batches (8 a step, 2k rows each), a short sequence: the host's launches dominate
    "many_mb": {"layers": 12, "hidden": 1536, "heads": 12, "seq": 1024, "mbs": 2, "gbs": 16, "extra": []},
}


def megatron_argv(megatron: Path, c: dict[str, Any], iters: int) -> list[str]:
    base = [
        "--num-layers",
        str(c["layers"]),
        "--hidden-size",
        str(c["hidden"]),
        "--num-attention-heads",
        str(c["heads"]),
        "--seq-length",
        str(c["seq"]),
        "--max-position-embeddings",
        str(c["seq"]),
        "--micro-batch-size",
        str(c["mbs"]),
        "--global-batch-size",
        str(c["gbs"]),
        "--train-iters",
        str(iters),
        "--lr",
        "1e-4",
        "--lr-decay-style",
        "constant",
        "--bf16",
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "32000",
        "--transformer-impl",
        "local",
        "--no-persist-layer-norm",
        "--no-gradient-accumulation-fusion",
        "--no-masked-softmax-fusion",
        "--log-interval",
        "1",
        "--log-throughput",
        "--timing-log-level",
        "2",
        "--timing-log-option",
        "all",
        "--eval-iters",
        "0",
        "--eval-interval",
        "100000",
        "--disable-bias-linear",
        "--exit-interval",
        str(iters),
    ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        "29547",
        str(megatron / "pretrain_gpt.py"),
        *base,
        *c.get("extra", []),
        *JOB_FLAGS,
    ]


def steady_of(steps: dict[int, float], skip: tuple[int, int] | None = None) -> dict[str, Any]:
    xs = [v for k, v in sorted(steps.items()) if k >= STEADY_FROM and not (skip and skip[0] <= k <= skip[1])]
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "median_ms": statistics.median(xs),
        "mean_ms": statistics.fmean(xs),
        "min_ms": min(xs),
        "max_ms": max(xs),
    }


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget_s = time.time(), budget_s

    def elapsed(self) -> float:
        return time.time() - self.t0

    def fits(self, need_s: float) -> bool:
        return self.elapsed() + need_s <= self.budget_s

    def say(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {msg}", flush=True)


def _save(out: Path, name: str, res: dict[str, Any]) -> None:
    tmp = out / f".ab_{name}.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(out / f"ab_{name}.json")


def _est_run_s(res: dict[str, Any]) -> float:
    """A run's expected wall time: the longest measured run's (start-up + steps), else the captured run's
    scaled to ITERS, else a guess."""
    walls = [r["wall_s"] for r in res.get("runs", {}).values() if isinstance(r.get("wall_s"), (int, float))]
    if walls:
        return float(max(walls)) * 1.1
    cap = res.get("capture") or {}
    steady = (cap.get("steady") or {}).get("median_ms")
    return START_S + ITERS * (float(steady) / 1e3 if steady else 1.0)


# --- 1. the captured run -------------------------------------------------------------------------
def capture_run(
    out: Path,
    name: str,
    c: dict[str, Any],
    megatron: Path,
    env: dict[str, str],
    res: dict[str, Any],
    clock: Clock,
) -> None:
    from perfd.capture.kineto_daemon import KinetoDaemon, kineto_env

    raw = Path(f"/tmp/plan_ab_{name}")
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir(parents=True)
    sock_dir, trace_dir = Path("/tmp/perfd-kab"), raw / "traces"
    sock_dir.mkdir(exist_ok=True)
    trace_dir.mkdir()
    kenv = kineto_env(1, config_dir=raw / "kineto", socket_dir=str(sock_dir), trace_dir=trace_dir)
    daemon = KinetoDaemon(socket_dir=str(sock_dir)).start()
    log = raw / "megatron.log"
    got: dict[str, Any] = {}
    t0 = time.time()
    try:
        with log.open("wb") as f:
            p = subprocess.Popen(
                [*PREFIX, *megatron_argv(megatron, c, CAPTURE_ITERS)],
                cwd=megatron,
                env={**env, **kenv},
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pid, stop_at = None, float("inf")
        # The job runs on (train-iters CAPTURE_ITERS, a ceiling) until its trace is written and
        # STEADY_AFTER steady iterations followed it, then it is stopped: Kineto writes the trace from
        # inside the process, which must not exit first.
        while p.poll() is None and time.time() - t0 < RUN_TIMEOUT_S:
            steps = log_steps(log.read_text(errors="replace"))
            pid = pid or rank_pid(p.pid)
            if pid and steps and max(steps) >= CAPTURE_AT and "capture" not in got:
                clock.say(f"{name}: capture armed at iteration {max(steps)}")
                capture(daemon, pid, trace_dir / "default.json", False, log, got, "capture")
                clock.say(f"{name}: trace {'written' if got['capture'].get('trace') else 'MISSING'}")
                steps = log_steps(log.read_text(errors="replace"))
                stop_at = max(steps or {0: 0.0}) + float(STEADY_AFTER)
            if "capture" in got and steps and max(steps) >= stop_at:
                break
            time.sleep(0.5)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    finally:
        daemon.stop()
    text = log.read_text(errors="replace")
    steps = log_steps(text)
    at = int((got.get("capture") or {}).get("iteration_at_arming") or 0)
    trace = (got.get("capture") or {}).get("trace")
    res["capture"] = {
        "exit": p.returncode,  # stopped by this script once it had what it needs (a signal's code)
        "wall_s": round(time.time() - t0, 1),
        "steps": steps,
        "arming": {k: v for k, v in (got.get("capture") or {}).items() if k != "config"},
        # the captured iterations and the one after (the trace's flush) are not steady
        "steady": steady_of(steps, (at, at + CAPTURED_AFTER) if at else None),
        "tail": "" if steps and trace else text[-3000:],
    }
    with gzip.open(out / f"log_{name}.log.gz", "wb") as g:
        g.write(log.read_bytes())
    if trace:
        res["capture"]["cut"] = cut_trace(Path(trace), out / f"trace_{name}.json.gz")
    clock.say(f"{name}: captured run done, steady {res['capture']['steady']}")


# --- 2. the plan, written down before any change -------------------------------------------------
def captured_of(res: dict[str, Any]) -> tuple[int, int] | None:
    """The iterations the capture touched (armed, captured, the trace's flush): CAPTURED_AFTER from
    the one it was armed at."""
    at = int(((res.get("capture") or {}).get("arming") or {}).get("iteration_at_arming") or 0)
    return (at, at + CAPTURED_AFTER) if at else None


CAPTURED_AFTER = 5  # the captured iterations and the one after (the trace's flush) are not steady


def plan_from(trace: Path, log: Path, gpu: str, name: str,
              captured: tuple[int, int] | None = None, clock_ms: float | None = None,
              remedies: list[str] | None = None) -> dict[str, Any]:
    """perfd's analysis of the capture and its log (what `perfd analyze megatron LOG --capture TRACE`
    prints): the plan, the recommendations and the budget, and the items that can run here (options
    only: nothing to install). ``captured``: the iterations the capture touched, marked as the live
    aggregator marks them (StepRecord.disturbed_by_capture): the job's clock is its other steps.
    ``clock_ms``: the plan read at this steady step instead (the job re-measured before any change: the
    replayed gains move with the job's step, perfd.analytics.advice.replay_gains); ``remedies``: the set
    to combine (else the plan's promised items)."""
    from perfd.analytics.run.run_analysis import analyze_run
    from perfd.collectors.megatron import parse_file
    from tests.trace_cache import timeline_class  # once per test session (the A/B tests read each twice)

    parsed = parse_file(log, job=name)
    records = [dataclasses.replace(r, disturbed_by_capture=True)
               if captured and captured[0] <= r.iteration <= captured[1] else r for r in parsed.records]
    a = analyze_run(
        parsed.job_info,
        records,
        gpu_name=gpu,
        job_name=name,
        timeline=timeline_class(str(trace)),
        live=False,
    )
    budget = a.summary.step_budget
    if clock_ms is not None and budget is not None:
        from perfd.analytics.run.run_findings import job_plan

        budget = dataclasses.replace(budget, steady_step_ms=clock_ms)
        plan = job_plan(a, parsed.job_info, budget)
    else:
        plan = a.plan
    if plan is None:
        return {"error": "no plan: the capture gave no budget with remedies"}
    # every item that is options only runs here alone: the plan's own (stage 0) and those it lists apart
    # to measure (stage -1: a range reaching below zero); the set is the plan's, its promised items
    here = [i for i in plan.items if i.effort.value == "flag" and (i.flags or i.remove)]
    promised = [i for i in here if (i.stage >= 0 if remedies is None else i.remedy in remedies)]
    from perfd.analytics.advice.remedies import GAIN_MODEL
    from perfd.report.remedy_text import worded_plan, worded_remedy

    shown = worded_plan(plan)  # the plan and its recommendations as the report words them
    return {
        "model": GAIN_MODEL,
        "plan": shown.to_json() if shown is not None else None,
        "recommendations": [
            {
                "id": r.id,
                "remedy": r.remedy,
                "action": r.action,
                "gain_ms": r.gain_ms,
                "flags": r.flags,
                "remove": r.remove,
                "needs": r.needs,
                "effort": r.effort,
            }
            for r in map(worded_remedy, a.recommendations)
            if r.remedy
        ],
        "budget": budget.to_json() if budget is not None else None,
        "apply_here": {
            i.remedy: {
                "flags": list(i.flags),
                "remove": list(i.remove),
                "gain_ms": list(i.gain_ms) if i.gain_ms else None,
            }
            for i in here
        },
        "set": {"remedies": [i.remedy for i in promised],
                "gain_ms": list(plan.combined(i.remedy for i in promised))},
        "cannot_run_here": {
            i.remedy: {
                "effort": i.effort.value,
                "gain_ms": list(i.gain_ms) if i.gain_ms else None,
                "needs": [p.package for p in i.prerequisites],
            }
            for i in plan.items
            if i not in here
        },
    }


# --- 3. the measurements ---------------------------------------------------------------------------
def run_order(changes: list[str], base_every: int = 1, repeat: int = 1) -> list[str]:
    """The run keys of a configuration in the order they run: the base, then the changes ``repeat``
    times in turn (pass k's runs keyed ``<change>@<k>`` from k = 2; the first pass keeps the plain
    names), a base run (``base_<n>``, numbered on across passes) after every ``base_every`` changes and
    after the last. ``repeat`` 1 is the order before --repeat."""
    base_every = max(1, base_every)
    runs = [repeat_key(c, k) for k in range(1, max(1, repeat) + 1) for c in changes]
    order = ["base"]
    for i, label in enumerate(runs):
        order.append(label)
        if (i + 1) % base_every == 0 or i == len(runs) - 1:
            order.append(f"base_{(i + base_every) // base_every}")
    return order


def measure(
    megatron: Path,
    c: dict[str, Any],
    env: dict[str, str],
    flags: list[str],
    remove: list[str],
    out: Path,
    label: str,
    keep_log: bool = False,
    prefix: list[str] | None = None,
) -> dict[str, Any]:
    """One run of ITERS iterations measured from its own log (``keep_log``: the log kept gzipped in
    ``out`` as ``log_run_<label>.log.gz``, its timers for a later reading; ``prefix``: a command the
    job runs under, such as ``taskset -c 0-7``)."""
    argv = [*(prefix or []), *apply_flags(megatron_argv(megatron, c, ITERS), flags, remove)]
    vlog = out / f".run_{label}.log"
    t0 = time.time()
    before = host_procs.snapshot()
    with vlog.open("wb") as f:
        p = subprocess.Popen(argv, cwd=megatron, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            code: int | str = p.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.time() - t0
    after = host_procs.snapshot()
    others = host_procs.others(before, after, p.pid, wall)
    left = host_procs.left_behind(p.pid, after)  # the leader's session (killed: the next run is alone)
    if code == "timeout":
        p.wait()
    text = vlog.read_text(errors="replace")
    if keep_log:
        with gzip.open(out / f"log_run_{label}.log.gz", "wb") as g:
            g.write(vlog.read_bytes())
    vlog.unlink()
    steps = log_steps(text)
    return {
        "exit": code,
        "wall_s": round(wall, 1),
        "started_at": t0,
        "others_cpu": others,
        "left_behind": left,
        "flags": flags,
        "remove": remove,
        "steady": steady_of(steps),
        "steps": steps,
        "tail": "" if steps and code == 0 else text[-2500:],
    }


def run_config(
    out: Path,
    name: str,
    megatron: Path,
    env: dict[str, str],
    gpu: str,
    res: dict[str, Any],
    clock: Clock,
    files: Path | None = None,
) -> None:
    """One configuration, resumed where ``res`` (and ``files``: the directory of an earlier call, which
    holds its trace and log) left it."""
    c = CONFIGS[name]
    res.setdefault("config", {**c, "name": name})
    res.setdefault("runs", {})
    if "capture" not in res:
        if not clock.fits(START_S + 90):
            clock.say(f"{name}: no time left for the captured run")
            return
        capture_run(out, name, c, megatron, env, res, clock)
        _save(out, name, res)
    src = out if (out / f"trace_{name}.json.gz").exists() or files is None else files
    trace, log = src / f"trace_{name}.json.gz", src / f"log_{name}.log.gz"
    if "plan" not in res:
        if not trace.exists():
            res["plan"] = {"error": "the capture wrote no trace", "tail": res["capture"].get("tail")}
            _save(out, name, res)
            return
        t0 = time.time()
        got = plan_from(trace, log, gpu, name, captured_of(res))
        now = time.time()
        got["written_at"] = now
        got["written_at_utc"] = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat()
        got["analysis_s"] = round(now - t0, 1)
        (out / f"plan_{name}.json").write_text(json.dumps(got, indent=1, default=str))  # before any change
        res["plan"] = got
        _save(out, name, res)
        clock.say(
            f"{name}: plan written ({got.get('analysis_s')} s): apply here "
            f"{list(got.get('apply_here', {}))}, "
            f"set {got.get('set')}"
        )
    plan = res["plan"]
    if "error" in plan:
        return
    singles = list(plan["apply_here"])
    # the base between every two changes (ABAB): on the H200 the same command stepped 25% apart in runs
    # minutes apart, so each change is held to the base runs just before and after it
    changes = singles + (["set"] if len(plan["set"]["remedies"]) > 1 else [])
    order = run_order(changes, BASE_EVERY, REPEAT)
    res.setdefault("pinned", " ".join(PREFIX) or None)
    res.setdefault("base_every", BASE_EVERY)
    res.setdefault("job_flags", list(JOB_FLAGS))
    # the estimate is the A/B's from its first change on: a resumed one keeps it (an A/B begun before
    # --estimate read the mean), and a call that asks for another is refused, never re-read after the runs
    began = any(not is_base(k) for k in res["runs"])
    if began and estimate_of(res) != ESTIMATE:
        raise SystemExit(f"{name}: this A/B reads its changes by the {estimate_of(res)}, fixed when its "
                         f"first change ran; --estimate {ESTIMATE} would re-read them after the runs")
    res.setdefault("estimate", ESTIMATE)
    res["repeat"] = max(int(res.get("repeat") or 1), REPEAT)  # a resumed A/B may add passes
    for label in order:
        if label in res["runs"] and res["runs"][label].get("steady", {}).get("n"):
            continue
        first = (res["runs"].get("base") or {}).get("steady") or {}
        if not is_base(label) and "plan_at_base" not in res and first.get("n"):
            # the plan read at the job's step as re-measured now, still before any change runs
            got = plan_from(trace, log, gpu, name, captured_of(res), float(first["median_ms"]),
                            plan["set"]["remedies"])
            got["written_at"] = time.time()
            got["written_at_utc"] = datetime.datetime.fromtimestamp(got["written_at"],
                                                                    datetime.timezone.utc).isoformat()
            res["plan_at_base"] = got
            _save(out, name, res)
            gains = {k: v["gain_ms"] for k, v in got.get("apply_here", {}).items()}
            clock.say(f"{name}: plan at the base's {first['median_ms']} ms: {gains}, set {got.get('set')}")
        if not clock.fits(_est_run_s(res)):
            clock.say(f"{name}: {label} left for the next call (budget)")
            break
        change = split_repeat(label)[0]
        if is_base(label):
            flags, remove = [], []
        elif change == "set":
            flags = [f for r in plan["set"]["remedies"] for f in plan["apply_here"][r]["flags"]]
            remove = [f for r in plan["set"]["remedies"] for f in plan["apply_here"][r]["remove"]]
        else:
            flags, remove = plan["apply_here"][change]["flags"], plan["apply_here"][change]["remove"]
        got = measure(megatron, c, env, flags, remove, out, f"{name}_{label}", prefix=PREFIX)
        res["runs"][label] = got
        _save(out, name, res)
        clock.say(
            f"{name}: {label} {' '.join(flags)} {' '.join('-' + r for r in remove)}: "
            f"{got['steady']} exit {got['exit']} ({got['wall_s']} s); others {got['others_cpu']['cores']} "
            f"cores, left behind {[x['name'] for x in got['left_behind']]}"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--configs", default="", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--prior", action="append", default=[], help="a directory an earlier call wrote")
    ap.add_argument("--budget-s", type=float, default=530.0, help="start no run that would end after this")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--pin", default="",
                    help="cores every run (the captured one too) is held to (taskset -c)")
    ap.add_argument("--base-every", type=int, default=1, help="a base run after this many changes")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the changes (singles and the set) this many times in turn, bases between")
    ap.add_argument("--estimate", choices=ESTIMATES, default=ESTIMATES[0],
                    help="a change's saving over its --repeat runs: the mean (default) or the median, "
                    "which one base run far from the others cannot move; fixed for the A/B when its first "
                    "change runs")
    ap.add_argument("--job-flags", default="",
                    help="Megatron-LM options every run takes, the captured one too (split on spaces)")
    a = ap.parse_args()
    global BASE_EVERY, REPEAT, ESTIMATE
    PREFIX[:] = ["taskset", "-c", a.pin] if a.pin else []
    JOB_FLAGS[:] = a.job_flags.split()
    BASE_EVERY = max(1, a.base_every)
    REPEAT = max(1, a.repeat)
    ESTIMATE = a.estimate
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(a.budget_s)
    results: dict[str, dict[str, Any]] = {}
    where: dict[str, Path] = {}
    for d in a.prior:  # an earlier call's results, kept and resumed (its traces and logs are read there: they
        for f in sorted(Path(d).glob("ab_*.json")):  # came back with that call, and the files back are few)
            results[f.stem[3:]] = json.loads(f.read_text())
            where[f.stem[3:]] = Path(d)
            _save(out, f.stem[3:], results[f.stem[3:]])
    megatron = Path(os.environ.get("MEGATRON_DIR", ROOT / ".megatron")).resolve()
    if not a.table_only and not (megatron / "pretrain_gpt.py").is_file():
        print(f"plan_ab_live: no Megatron-LM checkout at {megatron} (set MEGATRON_DIR)", file=sys.stderr)
        return 2
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    try:
        if not a.table_only:
            gpu = subprocess.run(
                [sys.executable, "-c", "import torch;print(torch.cuda.get_device_name(0))"],
                capture_output=True,
                text=True,
                env=env,
            ).stdout.strip()
            clock.say(f"GPU {gpu}; Megatron-LM at {megatron}")
            for name in [x for x in a.configs.split(",") if x]:
                res = results.setdefault(name, {"gpu": gpu})
                run_config(out, name, megatron, env, gpu, res, clock, where.get(name))
                _save(out, name, res)
    except Exception:
        (out / "error.txt").write_text(traceback.format_exc())
        traceback.print_exc()
    t = table(results)
    (out / "table.json").write_text(json.dumps(t, indent=1))
    (out / "table.md").write_text(markdown(t))
    print(markdown(t), flush=True)
    clock.say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
