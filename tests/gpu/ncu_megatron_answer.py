"""On 1 GPU (docs/evidence/entries/28-nsight-compute-by-rule-in-the-answer-2026-11-24-1-h100.md): an Nsight
Compute capture by rule on real Megatron-LM, with one rank armed, in the answer — no stall or incident over
the range, the top kernels by time profiled, the job's budget, class and remedies with the rows, the arming
cost in the job's report.

    PYTHONPATH=. python3 tests/gpu/ncu_megatron_answer.py OUT --megatron DIR

Not run by the session that wrote it (it had no GPU): written from tests/gpu/ncu_megatron_rule.py, whose
helpers it uses. The issue's config (12 layers, hidden 1024, seq 2048, mbs 1, gbs 8, local transformer
implementation, mock data), one aggregator for the whole run:

1. baseline: ``perfd launch --kineto`` around ``torchrun --no-python python -m perfd.hook.megatron
   pretrain_gpt.py ... --save CKPT --exit-interval BASE_ITERS``, no ncu anywhere; a rule (``iteration >
   15``, once) takes a Kineto capture of rank 0 for 3 steps: the job's timeline, the reference for the
   kernels by time. Megatron saves a checkpoint at BASE_ITERS and exits.
2. armed: the same job (same name, same aggregator) resumed from the checkpoint (``--load CKPT``) under
   ``$(perfd ncu-prefix --job J --ranks 0)`` — no ``--kernels-from``: the default now takes the job's
   latest timeline — and a rule ``tool: ncu`` (``iteration > BASE_ITERS + 15`` for 10 s, so it never
   fires in phase 1) that opens one step's range. POST_STEPS steps after the capture ends, the job is
   stopped; the aggregator's answer is read before it goes.

Checks (``ncu_megatron_answer.json`` / ``.md`` in OUT, with the job's summary and the captures):
- ``no_stall``: no incident of kind ``stall`` in the job; every incident over the range's step counts the
  range as the capture's (``capture_cost_s`` holds most of the step), and the step is listed among the
  capture disturbances;
- ``held_said``: the capture's ``range_held_s`` is within 20% of the range's logged step;
- ``by_time``: the capture's ``kernel_choice`` is ``timeline`` from the baseline's Kineto capture, and
  at least 70% of the profiled rows join one of that timeline's top kernels (ncu_join ``match``);
- ``in_the_answer``: the report's step budget has ncu sources, and at least one ``ncu-*`` finding;
- ``arming_cost``: ``report.arming`` measured against the earlier steps, ratio > 1.05, and the finding
  ``ncu-arming-cost``.
Exit 0 when all hold, 1 otherwise, 2 for a setup problem. Bounds: TOTAL_S (default 560 s) overall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.megatron_ncu import issue_args, log_iterations, stats
from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "ncu-answer"
TOTAL_S = float(os.environ.get("TOTAL_S", "560"))
BASE_ITERS = int(os.environ.get("BASE_ITERS", "90"))
POST_STEPS = int(os.environ.get("POST_STEPS", "25"))
LAUNCH_COUNT = os.environ.get("NCU_LAUNCH_COUNT", "30")
TIME_BUDGET_S = os.environ.get("NCU_TIME_BUDGET_S", "90")
ENDED = ("finished", "failed", "undeliverable", "refused")

RULES = f"""
rules:
  - name: baseline_kineto
    expr: iteration > 15
    scope: job
    for: 5s
    severity: info
    action:
      type: capture
      tool: kineto
      targets: {{ranks: [0]}}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
  - name: deep_dive_ncu
    expr: iteration > {BASE_ITERS + 15}
    scope: job
    for: 10s
    severity: info
    action:
      type: capture
      tool: ncu
      targets: {{ranks: [0]}}
      steps: 1
      cooldown: 1h
      max_per_hour: 1
"""


def megatron_args(megatron: Path, ckpt: Path, resume: bool) -> list[str]:
    """The issue's config (tests/gpu/megatron_ncu.issue_args), saving at BASE_ITERS, or resumed."""
    extra = f"--load {ckpt}" if resume else f"--exit-interval {BASE_ITERS}"
    return issue_args(megatron, BASE_ITERS + 2000, [*f"--save {ckpt} --save-interval 100000 {extra}".split()])


class Run:
    def __init__(self, out: Path, megatron: Path) -> None:
        self.out, self.megatron = out, megatron
        self.t0 = time.time()
        self.deadline = self.t0 + TOTAL_S
        self.env = run_env(megatron, CUDA_DEVICE_MAX_CONNECTIONS="1", NCCL_NVLS_ENABLE="0")
        self.res: dict[str, Any] = {"job": JOB, "stage": "setup", "checks": {}}
        self.progress = (out / "progress.log").open("a", buffering=1)
        self.procs = Procs(out, self.env, say=self.say)
        self.captures = out / "captures"
        self.ckpt = out / "ckpt"
        (out / "agent.yaml").write_text(f"capture_dir: {self.captures}\nbatch_interval_s: 0.5\n")
        (out / "rules.yaml").write_text(RULES)
        self.grpc = 0
        self.api = ""
        self.stopping = threading.Event()

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.progress.write(line + "\n")

    def left_s(self, limit_s: float) -> float:
        return max(0.0, min(limit_s, self.deadline - time.time()))

    def probe(self) -> None:
        """Every second, what the aggregator holds of the job (``probe.jsonl``): when records arrived,
        the newest iteration, open incidents. A silence the job's log does not show is read from it."""
        with (self.out / "probe.jsonl").open("a", buffering=1) as f:
            while not self.stopping.is_set():
                try:
                    jobs = get_json(f"{self.api}/jobs", timeout=5).get("jobs") or []
                    row = next((j for j in jobs if j.get("job") == JOB or j.get("name") == JOB), None)
                    doc = {"t": round(time.time() - self.t0, 2), "job": row}
                    f.write(json.dumps(doc, default=str) + "\n")
                except Exception as exc:  # the aggregator busy or gone: that is what is looked for
                    f.write(json.dumps({"t": round(time.time() - self.t0, 2), "error": repr(exc)}) + "\n")
                self.stopping.wait(1.0)

    def start(self) -> None:
        self.grpc, _, url = start_aggregator(self.procs, "--rules", self.out / "rules.yaml",
                                             "--rules-interval", "1", timeout=self.left_s(60))
        self.api = f"{url}/api"
        threading.Thread(target=self.probe, name="probe", daemon=True).start()

    def launch(self, name: str, prefix: list[str], opts: list[str], resume: bool
               ) -> tuple[subprocess.Popen[bytes], Path]:
        run_dir = self.out / f"run_{name}"
        job_s = max(60, int(self.deadline - time.time() - 40))
        cmd = ["timeout", "--signal=TERM", "--kill-after=20", str(job_s), sys.executable, "-m",
               "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "--no-python", *prefix,
               sys.executable, "-m", "perfd.hook.megatron", *megatron_args(self.megatron, self.ckpt, resume)]
        launch = self.procs.perfd(f"launch_{name}", "launch", "--job", JOB, "--run-dir", str(run_dir),
                                  "--agent-socket", str(self.out / f"hook_{name}.sock"), *opts, "--", *cmd)
        manifest = wait_manifest(run_dir / "launch.json", launch, timeout=self.left_s(90))
        start_agent(self.procs, self.grpc, manifest=manifest, config=self.out / "agent.yaml",
                    name=f"agent_{name}")
        return launch, run_dir / "output.log"

    def captures_of(self) -> list[dict[str, Any]]:
        try:
            return [c for c in get_json(f"{self.api}/captures")["captures"] if c.get("job") == JOB]
        except OSError as exc:
            self.say(f"aggregator API: {exc}")
            return []

    def baseline(self) -> None:
        self.res["stage"] = "baseline"
        launch, log = self.launch("base", [], ["--kineto"], resume=False)
        while time.time() < self.deadline - 300 and launch.poll() is None:
            its = log_iterations(log)
            caps = self.captures_of()
            self.say(f"baseline: iteration {max(its) if its else None}; "
                     f"captures {[(c['tool'], c['status']) for c in caps]}")
            time.sleep(5)
        self.say(f"baseline ended (exit {launch.poll()})")
        its = log_iterations(log)
        self.res["baseline_steps"] = {i: ms for i, (ms, _) in sorted(its.items())}
        self.res["baseline_stats"] = stats([ms for i, (ms, _) in its.items() if i > 10])
        for p in ("agent_base", "launch_base"):
            self.procs.end(p, grace_s=20)

    def armed(self) -> None:
        self.res["stage"] = "armed"
        pre = subprocess.run([sys.executable, "-m", "perfd.app.cli", "ncu-prefix", "--job", JOB, "--ranks",
                              "0",
                              "--capture-dir", str(self.captures), "--launch-count", LAUNCH_COUNT,
                              "--time-budget", TIME_BUDGET_S], cwd=ROOT, env=self.env, capture_output=True,
                             text=True, timeout=120)
        self.res["ncu_prefix"] = {"rc": pre.returncode, "stdout": pre.stdout.strip(),
                                  "stderr": pre.stderr.strip()}
        self.say(f"ncu-prefix ({pre.returncode}): {pre.stderr.strip()}")
        if pre.returncode != 0:
            self.res["setup_error"] = f"perfd ncu-prefix: {pre.stderr.strip()}"
            return
        launch, log = self.launch("ncu", pre.stdout.split(), [], resume=True)
        ended_at: int | None = None
        while time.time() < self.deadline - 45 and launch.poll() is None:
            its = log_iterations(log)
            last = max(its) if its else None
            ncu = [c for c in self.captures_of() if c.get("tool") == "ncu"]
            if ncu and ncu[-1]["status"] in ENDED and ended_at is None:
                ended_at = last
            if ended_at is not None and last is not None and last >= ended_at + POST_STEPS:
                break
            self.say(f"armed: iteration {last}; ncu capture {ncu[-1]['status'] if ncu else None}")
            time.sleep(3)
        its = log_iterations(log)
        self.res["ncu_steps"] = {i: ms for i, (ms, _) in sorted(its.items())}
        # the aggregator's answer while the job is still there
        for key, path in (("summary", f"/jobs/{JOB}/summary"), ("captures", "/captures")):
            try:
                self.res[key] = get_json(f"{self.api}{path}", timeout=60)
            except OSError as exc:
                self.res[f"{key}_error"] = repr(exc)
        for p in ("agent_ncu", "launch_ncu"):
            self.procs.end(p, grace_s=20)

    def check(self) -> None:
        res, checks = self.res, self.res["checks"]
        summary = res.get("summary") or {}
        report = summary.get("report") or {}
        caps = [c for c in (res.get("captures") or {}).get("captures", []) if c.get("job") == JOB]
        none: dict[str, Any] = {}
        ncu: dict[str, Any] = next((c for c in reversed(caps) if c.get("tool") == "ncu"), none)
        kineto: dict[str, Any] = next((c for c in caps if c.get("tool") == "kineto"), none)
        steps = {int(i): ms for i, ms in (res.get("ncu_steps") or {}).items()}
        range_it = max(steps, key=lambda i: steps[i]) if steps else None
        res["range_iteration"], res["range_step_ms"] = range_it, steps.get(range_it) if range_it else None
        incs = summary.get("incidents") or []
        over = [i for i in incs if range_it is not None
                and i.get("first_iteration", 0) <= range_it <= i.get("last_iteration", -1)
                and i.get("kinds") != ["capture-disturbed"]]
        range_ms = steps.get(range_it or -1, 0.0)
        disturbed = ((summary.get("summary") or {}).get("capture_disturbances") or {}).get("stretches") or []
        checks["no_stall"] = (not any("stall" in (i.get("kinds") or []) for i in incs)
                              and all((i.get("capture_cost_s") or 0.0) >= 0.5 * range_ms / 1e3 for i in over)
                              and any(d.get("first_iteration", 0) <= (range_it or -1)
                                      <= d.get("last_iteration", -1) for d in disturbed))
        held = ncu.get("range_held_s")
        checks["held_said"] = isinstance(held, (int, float)) and range_ms > 0 and \
            abs(held - range_ms / 1e3) <= 0.2 * range_ms / 1e3
        part: dict[str, Any] = next(iter(((ncu.get("result") or {}).get("ranks") or {}).values()), none)
        choice = part.get("ncu_kernel_choice") or {}
        rows = part.get("ncu_kernels") or []
        joined = [r for r in rows if r.get("match") not in (None, "none", "ambiguous")]
        res["kernel_choice"], res["rows"], res["rows_joined"] = choice, len(rows), len(joined)
        checks["by_time"] = (choice.get("how") == "timeline" and bool(kineto)
                             and str(choice.get("from")) in {str(kineto.get("id")), *map(str, kineto.get(
                                 "agent_capture_ids") or [])}
                             and bool(rows) and len(joined) >= 0.7 * len(rows))
        budget = report.get("step_budget") or {}
        ncu_findings = [f for f in report.get("findings") or [] if str(f.get("id", "")).startswith("ncu-")]
        res["ncu_findings"] = ncu_findings
        checks["in_the_answer"] = "ncu" in (budget.get("sources") or []) and bool(ncu_findings)
        arming = report.get("arming") or {}
        res["arming"] = arming
        said = any(f.get("id") == "ncu-arming-cost" for f in report.get("findings") or [])
        checks["arming_cost"] = (arming.get("basis") == "earlier_steps" and (arming.get("ratio") or 0) > 1.05
                                 and said)
        base = [ms for i, ms in (res.get("baseline_steps") or {}).items() if int(i) > 10]
        armed = [ms for i, ms in steps.items() if i > BASE_ITERS + 10 and i != range_it]
        res["measured_here"] = {"baseline_median_ms": statistics.median(base) if base else None,
                                "armed_median_ms": statistics.median(armed) if armed else None}
        res["ok"] = bool(checks) and all(checks.values())


def markdown(res: dict[str, Any]) -> str:
    rep = (res.get("summary") or {}).get("report") or {}
    lines = ["# ncu by rule on real Megatron-LM, in the answer", "",
             f"OK: {res.get('ok')}; stage: {res.get('stage')}; checks: {json.dumps(res.get('checks'))}",
             f"ncu-prefix stderr: {(res.get('ncu_prefix') or {}).get('stderr')}",
             f"range: iteration {res.get('range_iteration')}, {res.get('range_step_ms')} ms",
             f"kernel choice: {json.dumps(res.get('kernel_choice'))}; rows {res.get('rows')}, joined to the "
             f"timeline {res.get('rows_joined')}",
             f"arming: {json.dumps(res.get('arming'))}; measured here {json.dumps(res.get('measured_here'))}",
             f"class: {(rep.get('summary') or {}).get('bottleneck')} — "
             f"{(rep.get('summary') or {}).get('bottleneck_reason')}", "", "Findings:"]
    lines += [f"- [{f.get('severity')}] {f.get('title')}: {f.get('observation')}"
              for f in rep.get("findings") or []]
    try:  # the report package needs rich (the GPU machine's image lacks it: rerun markdown() here)
        from perfd.analytics.breakdown.budget import StepBudget
        from perfd.report.budget_view import text_lines

        lines += ["", "Step budget (as `perfd report` prints it, with the Nsight Compute rows beside each "
                  "part):", "```", *text_lines(StepBudget.from_json(rep.get("step_budget"))), "```"]
    except ImportError as exc:
        lines += ["", f"(step budget text not rendered: {exc})"]
    lines += ["", "Recommendations:"]
    lines += [f"- {r.get('action')} ({r.get('detail')})" for r in rep.get("recommendations") or []]
    lines += ["", "Incidents:"]
    lines += [f"- {i.get('id')} {i.get('kinds')} {i.get('first_iteration')}-{i.get('last_iteration')}: "
              f"{i.get('cause')}" for i in (res.get("summary") or {}).get("incidents") or []]
    if res.get("setup_error") or res.get("error"):
        lines += ["", f"Error: {res.get('setup_error') or res.get('error')}"]
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
    r = Run(out, megatron)
    try:
        r.start()
        r.baseline()
        r.armed()
        r.res["stage"] = "done"
        r.check()
    except Exception as exc:
        r.res["error"] = f"{type(exc).__name__}: {exc}"
        r.res["traceback"] = traceback.format_exc()[-3000:]
        r.say(f"error: {r.res['error']}")
    finally:
        r.stopping.set()
        r.procs.stop(grace_s=20)
        subprocess.run(["rm", "-rf", str(r.ckpt)], check=False)  # gigabytes: not evidence
        # the processes' logs, the probe and the launches' line times in one file (the device returns
        # few files)
        logs = [p.relative_to(out) for p in [*out.glob("*.log"), *out.glob("*.out"), *out.glob("*.jsonl"),
                                              *out.glob("run_*/output.log*")] if p.is_file()]
        subprocess.run(["tar", "czf", str(out / "logs.tar.gz"), "-C", str(out), *map(str, logs)], check=False)
    res = r.res
    res.setdefault("ok", False)
    (out / "ncu_megatron_answer.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "ncu_megatron_answer.md").write_text(md)
    print(md)
    if res.get("setup_error"):
        return 2
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
