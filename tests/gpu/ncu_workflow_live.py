"""On 1 GPU (docs/evidence/entries/29-the-documented-ncu-workflow-both-ways-each-figure-from-its-r.md): the
documented Nsight Compute workflow on real Megatron-LM, both ways (a fresh restart and a checkpoint resume),
every figure from the run it describes.

    PYTHONPATH=. python3 tests/gpu/ncu_workflow_live.py OUT --megatron DIR

Megatron-LM core 0.20 at ``--megatron`` (or MEGATRON_DIR); the issue's model (12 layers, hidden 1024, seq
2048, mbs 1, gbs 8: tests/gpu/megatron_ncu.issue_args). One job, three runs, one state directory:

1. run 1: ``perfd launch --kineto`` around ``torchrun --no-python python -m perfd.hook.megatron
   pretrain_gpt.py ... --save CKPT --exit-interval RUN1_ITERS``; a rule takes a Kineto capture of rank 0
   for 3 steps; Megatron saves its checkpoint at RUN1_ITERS and exits.
2. run 2, the same job restarted from iteration 1 under ``$(perfd ncu-prefix --job J --ranks 0
   --kernels-from latest)`` (no --load), a rule ``tool: ncu`` with ``for: 20s`` (NCU_RULE_FOR_S).
3. run 3, the same job resumed from run 1's checkpoint (``--load CKPT``), armed the same way, its own ncu
   rule.
Each phase has its own aggregator process over the same ``--state-dir`` (the job's records, captures and
runs carried across by the state store): a rule set is read when an aggregator starts, and a rule
``tool: ncu`` loaded while run 1 (unarmed) runs would fire there, be refused ("not under ncu") and take
its cooldown. Rule names differ by phase (rule state survives the restart too).

What the job's own clock says is Megatron's logged per-iteration times (each run's ``output.log``).
Checks (``ncu_workflow_live.json`` / ``.md`` in OUT):
- ``run1_ended_at_once``: after run 1's launch exits the job reads ``ended`` within ENDED_WITHIN_S;
- for runs 2 and 3: ``figures_equal_unarmed``: the job's MFU, step time and class equal run 1's within
  2% (the armed run's figures are run 1's: ``summary.runs.figures_run``); ``arming_within_15pct``:
  ``report.arming.ratio`` within 15% of the armed/unarmed ratio of Megatron's logged steps (medians,
  warm-up, capture and range steps left out) against run 1 (basis previous_run); ``no_arming_jitter``:
  any step-jitter finding is run 1's (its CV and span); ``ncu_captured``: the rule's ncu capture finished
  on rank 0 with rows; ``ncu_rows_coverage``: the rows carry their op (or part) and the capture states
  its coverage (phases, layers); ``goodput_runs``: runs and restarts counted (2 and 1, then 3 and 2);
  ``ended_with_incidents_closed``: once the job is stopped it reads ended and no incident stays open;
- ``step_vs_megatron``: run 1's steady median step (perfd) within 2% of Megatron's logged median.
Exit 0 when all hold, 1 otherwise, 2 for a setup problem. Bounds: TOTAL_S (default 530 s) overall, each
phase a deadline, every wait bounded, every process started here stopped (leftovers swept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's perfd

from perfd.core.model import CaptureFailure
from tests.gpu.megatron_ncu import issue_args, kill_job_leftovers, log_iterations, ncu_prefix, stats
from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "ncu-workflow"
TOTAL_S = float(os.environ.get("TOTAL_S", "530"))
RUN1_ITERS = int(os.environ.get("RUN1_ITERS", "45"))  # run 1 saves here and exits
TRAIN_ITERS = RUN1_ITERS + 2000  # every run's --train-iters (the checkpoint holds it)
RUN1_MAX_S = float(os.environ.get("RUN1_MAX_S", "170"))
ARMED_RESERVE_S = float(os.environ.get("ARMED_RESERVE_S", "175"))  # what run 3 needs after run 2
POST_STEPS = int(os.environ.get("POST_STEPS", "10"))  # steps logged after the ncu capture ended
# How long runs 2 and 3 step armed before their ncu rule fires (its ``for:``); the CPU smoke
# (tests/e2e/test_ncu_workflow_smoke.py) waits less, its steps being 0.1 s.
NCU_RULE_FOR_S = int(os.environ.get("NCU_RULE_FOR_S", "20"))
LAUNCH_COUNT = os.environ.get("NCU_LAUNCH_COUNT", "20")
# None: ncu-prefix's own, which fits the launch window it chooses (a 60 s budget took a 72-launch window
# that held its range 78 s on the H100: cancelled, "overran its time budget")
TIME_BUDGET_S = os.environ.get("NCU_TIME_BUDGET_S") or None
ENDED_WITHIN_S = float(os.environ.get("ENDED_WITHIN_S", "15"))
WARMUP = 10  # iterations of each run left out of the job's-clock medians
TOLERANCE_FIGURES = 0.02
TOLERANCE_ARMING = 0.15
ENDED = ("finished", "failed", "undeliverable", "refused")

RULE = """
  - name: {name}
    expr: {expr}
    scope: job
    for: {for_s}s
    severity: info
    action:
      type: capture
      tool: {tool}
      targets: {{ranks: [0]}}
      steps: {steps}
      cooldown: 1h
      max_per_hour: 1
"""


def rules(name: str, expr: str, for_s: int, tool: str, steps: int) -> str:
    return "rules:" + RULE.format(name=name, expr=expr, for_s=for_s, tool=tool, steps=steps)


def walk(obj: Any) -> Iterator[Any]:
    """Every value nested in a JSON document."""
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk(v)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class Workflow:
    def __init__(self, out: Path, megatron: Path) -> None:
        self.out, self.megatron = out, megatron
        self.t0 = time.time()
        self.deadline = self.t0 + TOTAL_S
        self.env = run_env(megatron, CUDA_DEVICE_MAX_CONNECTIONS="1", NCCL_NVLS_ENABLE="0")
        self.res: dict[str, Any] = {"job": JOB, "stage": "setup", "checks": {}, "phases": {}}
        self.progress = (out / "progress.log").open("a", buffering=1)
        self.procs = Procs(out, self.env, say=self.say)
        self.captures, self.ckpt, self.state = out / "captures", out / "ckpt", out / "state"
        (out / "agent.yaml").write_text(f"capture_dir: {self.captures}\nbatch_interval_s: 0.5\n")
        self.api = ""
        self.seen: set[tuple[Any, ...]] = set()

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.progress.write(line + "\n")

    def left_s(self, limit_s: float) -> float:
        return max(1.0, min(limit_s, self.deadline - time.time()))

    # ---- one phase: an aggregator over the state directory, a launch, an agent -------------------------
    def start(self, name: str, rule_text: str, launch_opts: list[str], prefix: list[str],
              extra: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        (self.out / f"rules_{name}.yaml").write_text(rule_text)
        gpu = ["--gpu", os.environ["AGG_GPU"]] if os.environ.get("AGG_GPU") else []  # else NVML names it
        grpc, _, url = start_aggregator(self.procs, "--rules", self.out / f"rules_{name}.yaml", *gpu,
                                        "--rules-interval", "1", "--state-dir", str(self.state),
                                        ready=self.out / f"agg_{name}.ready", name=f"aggregator_{name}",
                                        timeout=self.left_s(90))
        self.api = f"{url}/api"
        run_dir = self.out / f"run_{name}"
        job_s = max(60, int(self.deadline - time.time() - 30))
        cmd = ["timeout", "--signal=TERM", "--kill-after=20", str(job_s), sys.executable, "-m",
               "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "--no-python", *prefix,
               sys.executable, "-m", "perfd.hook.megatron", *issue_args(self.megatron, TRAIN_ITERS, extra)]
        sock = str(self.out / f"hook_{name}.sock")
        launch = self.procs.perfd(f"launch_{name}", "launch", "--job", JOB, "--run-dir", str(run_dir),
                                  "--agent-socket", sock, *launch_opts, "--", *cmd)
        manifest = wait_manifest(run_dir / "launch.json", launch, timeout=self.left_s(90))
        start_agent(self.procs, grpc, manifest=manifest, config=self.out / "agent.yaml", name=f"agent_{name}")
        return launch, run_dir / "output.log"

    def get(self, path: str, timeout: float = 30.0) -> Any:
        try:
            return get_json(f"{self.api}{path}", timeout=timeout)
        except (OSError, ValueError) as exc:
            self.say(f"aggregator API {path}: {exc}")
            return None

    def job_row(self) -> dict[str, Any] | None:
        got = self.get("/jobs", 10)
        return next((j for j in (got or {}).get("jobs") or [] if j.get("job") == JOB), None)

    def captures_of(self) -> list[dict[str, Any]]:
        got = self.get("/captures", 10)
        return [c for c in (got or {}).get("captures") or [] if c.get("job") == JOB]

    def events(self) -> None:
        got = self.get("/events?limit=200", 10)
        for e in (got or {}).get("events") or []:
            if e.get("kind") not in ("rule_firing", "capture_started", "capture_finished", "capture_failed",
                                     "hook_profile", "incident_opened", "incident_closed"):
                continue
            key = (e.get("kind"), e.get("time"), str(e.get("text"))[:200])
            if key not in self.seen:
                self.seen.add(key)
                self.say(f"event {e.get('kind')}: {str(e.get('text'))[:300]}")

    def wait_ended(self, name: str) -> float | None:
        """Seconds until the job reads ``ended`` after its launch exited (None: not within the bound)."""
        t = time.time()
        while time.time() - t < ENDED_WITHIN_S + 5 and time.time() < self.deadline + 30:
            row = self.job_row()
            if row is not None and row.get("state") == "ended":
                took = round(time.time() - t, 1)
                self.say(f"{name}: the job reads ended {took} s after its launch exited: "
                         f"{row.get('state_reason')}")
                return took
            time.sleep(0.5)
        return None

    def finish_phase(self, name: str, launch: subprocess.Popen[bytes], log: Path) -> None:
        ph = self.res["phases"][name]
        if launch.poll() is None:
            self.say(f"{name}: stopping the job")
            self.procs.end(f"launch_{name}", grace_s=25)
        ph["ended_after_s"] = self.wait_ended(name)
        ph["summary_after_end"] = self.get(f"/jobs/{JOB}/summary", 60)
        ph["captures"] = self.captures_of()
        its = log_iterations(log)
        ph["steps"] = {i: ms for i, (ms, _) in sorted(its.items())}
        ph["log_times"] = {i: (ms, at) for i, (ms, at) in sorted(its.items())}
        for p in (f"agent_{name}", f"aggregator_{name}"):
            self.procs.end(p, grace_s=20)
        kill_job_leftovers(JOB, self.say)

    # ---- run 1: unarmed, a Kineto capture by rule, a checkpoint --------------------------------------
    def run1(self) -> None:
        self.res["stage"] = "run1"
        ph = self.res["phases"]["run1"] = {}
        extra = f"--save {self.ckpt} --save-interval 100000 --exit-interval {RUN1_ITERS}".split()
        launch, log = self.start("run1", rules("run1_kineto", "iteration > 12", 5, "kineto", 3), ["--kineto"],
                                 [], extra)
        end = min(self.t0 + RUN1_MAX_S, self.deadline - 2 * ARMED_RESERVE_S)
        next_print = 0.0
        while time.time() < end and launch.poll() is None:
            self.events()
            if time.time() >= next_print:
                its = log_iterations(log)
                caps = self.captures_of()
                self.say(f"run1: iteration {max(its) if its else None}; captures "
                         f"{[(c['tool'], c['status']) for c in caps]}")
                next_print = time.time() + 5
            time.sleep(1)
        ph["exit"] = launch.poll()
        ph["summary"] = self.get(f"/jobs/{JOB}/summary", 60)
        self.finish_phase("run1", launch, log)

    # ---- runs 2 and 3: armed under ncu, an ncu capture by rule ---------------------------------------
    def armed(self, name: str, extra: list[str], end_by: float) -> None:
        self.res["stage"] = name
        ph: dict[str, Any] = {}
        self.res["phases"][name] = ph
        pre = ncu_prefix(JOB, self.captures, self.env, LAUNCH_COUNT, TIME_BUDGET_S, "latest")
        ph["ncu_prefix"] = pre
        self.say(f"{name}: ncu-prefix ({pre['rc']}): {pre['stderr'][:600]}")
        if pre["rc"] != 0:
            self.res["setup_error"] = f"perfd ncu-prefix: {pre['stderr']}"
            return
        launch, log = self.start(name, rules(f"{name}_ncu", "step_time > 0", NCU_RULE_FOR_S, "ncu", 1), [],
                                 pre["stdout"].split(), extra)
        ended_at: int | None = None  # the last iteration logged when the capture ended
        capture_done = False
        next_print = 0.0
        while time.time() < end_by and launch.poll() is None:
            self.events()
            its = log_iterations(log)
            last = max(its) if its else None
            ncu = [c for c in self.captures_of() if c.get("tool") == "ncu"]
            # A capture its agent refused as not ready (the rank's hook had not reported yet: the
            # aggregator took an earlier run's hook for it) is asked again by the aggregator once the
            # target is ready (perfd.aggregator.capture_ready): the range's end is the next one's.
            mine = [c for c in ncu if str(c.get("origin")) == f"rule:{name}_ncu"
                    and c.get("cause") != CaptureFailure.NOT_READY.value]
            if mine and mine[-1]["status"] in ENDED and not capture_done:
                capture_done, ended_at, cap = True, last, mine[-1]
                ph["capture_ended_at_iteration"] = last
                self.say(f"{name}: ncu capture {cap['status']} at iteration {last}: {cap.get('reason')}")
            if ended_at is not None and last is not None and last >= ended_at + POST_STEPS:
                break
            if time.time() >= next_print:
                self.say(f"{name}: iteration {last}; ncu capture {mine[-1]['status'] if mine else None}")
                next_print = time.time() + 5
            time.sleep(1)
        ph["summary"] = self.get(f"/jobs/{JOB}/summary", 60)  # while the job still runs
        self.finish_phase(name, launch, log)

    # ---- the checks -----------------------------------------------------------------------------------
    def check(self) -> None:
        res, ch = self.res, self.res["checks"]
        phases = res["phases"]
        p1 = phases.get("run1") or {}
        s1 = ((p1.get("summary") or {}).get("summary")) or {}
        med1 = s1.get("medians") or {}
        steps1 = {int(i): ms for i, ms in (p1.get("steps") or {}).items()}
        # the Kineto capture that ran (one refused as not ready is asked again)
        kin: dict[str, Any] = next((c for c in p1.get("captures") or [] if c.get("tool") == "kineto"
                                    and c.get("cause") != CaptureFailure.NOT_READY.value), {})
        k_its = self.captured_iterations(p1, kin)
        unarmed = [ms for i, ms in steps1.items() if i > WARMUP and i not in k_its]
        res["clock"] = {"run1": stats(unarmed)}
        ended = p1.get("ended_after_s")
        ch["run1_ended_at_once"] = ended is not None and ended <= ENDED_WITHIN_S
        earlier = ((s1.get("runs") or {}).get("earlier")) or []
        d1 = next((d for p in ("run2", "run3") for d in self.earlier_runs(phases.get(p) or {})
                   if d.get("run") == 1), None)
        ref_median = (d1 or {}).get("step_median_ms")
        ch["step_vs_megatron"] = bool(ref_median and median(unarmed)
                                      and abs(ref_median / median(unarmed) - 1) <= TOLERANCE_FIGURES)
        res["run1_digest"] = d1
        res["run1_earlier_runs"] = earlier
        for name, runs in (("run2", 2), ("run3", 3)):
            ph = phases.get(name) or {}
            doc = ph.get("summary") or {}
            s, rep = doc.get("summary") or {}, doc.get("report") or {}
            med = s.get("medians") or {}
            r = s.get("runs") or {}
            got: dict[str, Any] = {"runs": {k: r.get(k) for k in ("current", "figures_from", "figures_run",
                                                                     "armed_iterations", "why")}}
            mfu, mfu1 = med.get("mfu"), med1.get("mfu")
            step, step1 = med.get("step_time_ms"), med1.get("step_time_ms")
            got["figures"] = {"mfu": mfu, "mfu_run1": mfu1, "step_ms": step, "step_ms_run1": step1,
                              "class": s.get("bottleneck"), "class_run1": s1.get("bottleneck")}
            ch[f"{name}_figures_equal_unarmed"] = bool(
                mfu and mfu1 and step and step1 and abs(mfu / mfu1 - 1) <= TOLERANCE_FIGURES
                and abs(step / step1 - 1) <= TOLERANCE_FIGURES and s.get("bottleneck") == s1.get("bottleneck")
                and r.get("figures_run") == 1)
            # the job's own clock: armed steps outside the warm-up and the ncu range (and its import)
            steps = {int(i): ms for i, ms in (ph.get("steps") or {}).items()}
            ncu = [c for c in ph.get("captures") or [] if c.get("origin") == f"rule:{name}_ncu"]
            cap = ncu[-1] if ncu else {}
            first = min(steps) if steps else 0
            range_it = max(steps, key=lambda i: steps[i]) if steps else None
            end_it = ph.get("capture_ended_at_iteration") or range_it or 0
            armed = [ms for i, ms in steps.items() if i >= first + WARMUP
                     and not (range_it is not None and range_it - 1 <= i <= max(end_it, range_it) + 1)]
            measured = (median(armed) / median(unarmed)) if armed and unarmed else None  # type: ignore[operator]
            arming = rep.get("arming") or {}
            got["arming"] = {**arming, "measured_ratio": measured, "armed_clock": stats(armed),
                             "range_iteration": range_it}
            ch[f"{name}_arming_within_15pct"] = bool(
                measured and arming.get("ratio")
                and arming.get("basis") in ("previous_run", "previous_run_capture")
                and arming.get("reference_run") == 1
                and abs(arming["ratio"] / measured - 1) <= TOLERANCE_ARMING)
            jit = [f for f in rep.get("findings") or [] if f.get("id") == "step-jitter"]
            got["jitter_findings"] = jit
            ch[f"{name}_no_arming_jitter"] = all(
                (f.get("evidence") or {}).get("step_time_cv") == s1.get("step_time_cv")
                and str(f.get("iterations", "")).startswith("run 1") for f in jit)
            part: dict[str, Any] = next(iter(((cap.get("result") or {}).get("ranks") or {}).values()), {})
            rows = part.get("ncu_kernels") or []
            got["ncu"] = {"id": cap.get("id"), "status": cap.get("status"), "reason": cap.get("reason"),
                          "rows": len(rows), "kernel_choice": part.get("ncu_kernel_choice")}
            ch[f"{name}_ncu_captured"] = bool(cap.get("status") == "finished" and cap.get("ranks") == [0]
                                              and rows)
            coverage = next((v for v in walk(cap) if isinstance(v, dict)
                             and {"launches", "matched", "phases"} <= v.keys()), None)
            by_op = [row for row in rows if row.get("op") or row.get("part") or row.get("ops")]
            got["ncu"].update(coverage=coverage, rows_by_op=len(by_op),
                              rows_sample=[{k: row.get(k) for k in ("name", "op", "part", "phase", "layer",
                                                                    "category", "bound", "duration_ms")}
                                           for row in rows[:12]])
            ch[f"{name}_ncu_rows_coverage"] = bool(rows and len(by_op) == len(rows) and coverage)
            after = ph.get("summary_after_end") or {}
            gp = after.get("goodput") or doc.get("goodput") or {}
            got["goodput"] = gp
            ch[f"{name}_goodput_runs"] = gp.get("runs") == runs and gp.get("restarts") == runs - 1
            got["open_incidents_after_end"] = [i.get("id") for i in after.get("incidents") or []
                                               if i.get("open")]
            ch[f"{name}_ended_with_incidents_closed"] = bool(
                after and ph.get("ended_after_s") is not None and not got["open_incidents_after_end"])
            got["findings"] = [{k: f.get(k) for k in ("id", "severity", "title", "iterations")}
                               for f in rep.get("findings") or []]
            got["budget_sources"] = (rep.get("step_budget") or {}).get("sources")
            res[name] = got
        res["ok"] = bool(ch) and all(ch.values())

    @staticmethod
    def earlier_runs(ph: dict[str, Any]) -> list[dict[str, Any]]:
        """The digests of the earlier runs a phase's summary lists."""
        s = (ph.get("summary") or {}).get("summary") or {}
        return list((s.get("runs") or {}).get("earlier") or [])

    @staticmethod
    def captured_iterations(ph: dict[str, Any], cap: dict[str, Any]) -> set[int]:
        """The iterations a capture's window touched, by the log's own end times (and one either side)."""
        t0, t1 = cap.get("started_at"), cap.get("finished_at")
        if not isinstance(t0, (int, float)) or not isinstance(t1, (int, float)):
            return set()
        out: set[int] = set()
        for i, (ms, at) in (ph.get("log_times") or {}).items():
            if at is not None and at >= t0 - 1.0 and at - ms / 1e3 <= t1 + 1.0:  # overlaps the window
                out.update((int(i) - 1, int(i), int(i) + 1))
        return out

    def cleanup(self) -> None:
        self.procs.stop(grace_s=20)
        kill_job_leftovers(JOB, self.say)
        subprocess.run(["rm", "-rf", str(self.ckpt)], check=False)  # gigabytes: not evidence
        if os.environ.get("KEEP_FIXTURES"):  # the same run's trace and ncu rows, for tests/data/ncu
            self._keep_fixtures()
        for p in [*self.out.rglob("*.ncu-rep"), *self.out.rglob("*.json.gz"), *self.captures.rglob("*.json")]:
            if p.name != "manifest.json" and p.stat().st_size > 2 << 20:
                p.unlink()
        kept = [*self.out.glob("*.out"), *self.out.glob("*.yaml"), *self.out.glob("run_*/output.log*"),
                *self.out.glob("captures/**/manifest.json")]
        names = [p.relative_to(self.out) for p in kept if p.is_file()]
        subprocess.run(["tar", "czf", str(self.out / "logs.tar.gz"), "-C", str(self.out), *map(str, names)],
                       check=False)
        self.progress.close()

    def _keep_fixtures(self) -> None:
        """Each capture's traces (gzipped) and ncu CSV exports, and the ncu-prefix output, in one
        ``fixtures.tar`` (one file to take back; the traces are gigabyte-free but tens of MB raw)."""
        keep = self.out / "fixtures"
        keep.mkdir(exist_ok=True)
        for p in self.captures.rglob("*"):
            if not p.is_file():
                continue
            name = f"{p.parent.name}_{p.name}"
            if p.suffix == ".csv" or p.name == "manifest.json":
                (keep / name).write_bytes(p.read_bytes())
            elif p.name.endswith(".json") or p.name.endswith(".json.gz"):
                dest = keep / (name if name.endswith(".gz") else name + ".gz")
                if p.name.endswith(".gz"):
                    dest.write_bytes(p.read_bytes())
                else:
                    subprocess.run(["sh", "-c", f"gzip -c '{p}' > '{dest}'"], check=False)
        for p in self.out.glob("*.out"):
            if "prefix" in p.name or "ncu" in p.name:
                (keep / p.name).write_bytes(p.read_bytes())
        subprocess.run(["tar", "cf", str(self.out / "fixtures.tar"), "-C", str(self.out), "fixtures"],
                       check=False)


def markdown(res: dict[str, Any]) -> str:
    lines = ["# The ncu workflow on real Megatron-LM, both ways, each figure from its run", "",
             f"OK: {res.get('ok')}; stage: {res.get('stage')}", "", "Checks:",
             *[f"- {k}: {v}" for k, v in (res.get("checks") or {}).items()], "",
             f"Job's clock, run 1 (unarmed): {json.dumps((res.get('clock') or {}).get('run1'))}",
             f"Run 1 digest: {json.dumps(res.get('run1_digest'))}"]
    for name in ("run2", "run3"):
        got = res.get(name) or {}
        lines += ["", f"## {name}", f"runs: {json.dumps(got.get('runs'))}",
                  f"figures: {json.dumps(got.get('figures'))}", f"arming: {json.dumps(got.get('arming'))}",
                  f"ncu: {json.dumps(got.get('ncu'))}", f"goodput: {json.dumps(got.get('goodput'))}",
                  f"open incidents after the end: {got.get('open_incidents_after_end')}",
                  f"budget sources: {got.get('budget_sources')}", "findings:",
                  *[f"- {json.dumps(f)}" for f in got.get("findings") or []]]
    if res.get("setup_error") or res.get("error"):
        lines += ["", f"Error: {res.get('setup_error') or res.get('error')}", str(res.get("traceback") or "")]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--megatron", type=Path, default=Path(os.environ.get("MEGATRON_DIR", "")))
    args = ap.parse_args()
    megatron = args.megatron.resolve()
    if not (megatron / "pretrain_gpt.py").exists():
        print("--megatron (or MEGATRON_DIR): a Megatron-LM checkout", file=sys.stderr)
        return 2
    from perfd.capture.ncu_exec import NcuNotFoundError, find_ncu

    try:
        find_ncu()
    except NcuNotFoundError as exc:
        print(f"{exc}", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    w = Workflow(out, megatron)
    w.say(f"Megatron-LM at {megatron}; deadline {TOTAL_S:.0f} s; run 1 saves at {RUN1_ITERS}")
    try:
        w.run1()
        w.armed("run2", [], w.deadline - ARMED_RESERVE_S)
        if not w.res.get("setup_error"):
            w.armed("run3", ["--load", str(w.ckpt)], w.deadline - 40)
        w.res["stage"] = "done"
    except Exception as exc:
        w.res["error"] = f"{type(exc).__name__}: {exc}"
        w.res["traceback"] = traceback.format_exc()[-3000:]
        w.say(f"error: {w.res['error']}")
    finally:
        w.cleanup()
    try:
        w.check()
    except Exception as exc:
        w.res["error_check"] = f"{type(exc).__name__}: {exc}"
        w.res["traceback_check"] = traceback.format_exc()[-3000:]
    res = w.res
    res.setdefault("ok", False)
    (out / "ncu_workflow_live.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "ncu_workflow_live.md").write_text(md)
    print(md)
    if res.get("setup_error"):
        return 2
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
