"""On 1 GPU: an Nsight Compute (ncu) kernel deep dive by rule on a real Megatron-LM job, through
``perfd.hook.megatron`` under ``perfd ncu-prefix`` — and what it costs the job outside the range.

    PYTHONPATH=. python3 tests/gpu/ncu_megatron_rule.py OUT --megatron DIR [--no-baseline]

Megatron-LM is not part of this repository: ``--megatron`` (or MEGATRON_DIR) points at a checkout
(core 0.20). A small model (4 layers, hidden 1024, seq 1024, mbs 4, gbs 16, local transformer
implementation, mock data) so that everything ends well inside 8 minutes with two start-ups:

1. baseline (unless ``--no-baseline``): ``perfd launch --kineto`` around ``torchrun --no-python
   python -m perfd.hook.megatron pretrain_gpt.py ...`` with no ncu anywhere; a rule captures rank 0
   with Kineto for 3 steps once the job has stepped for a while (the job's timeline: its top
   kernels), then the job is stopped. Its step times before the capture are the baseline.
2. ncu: the same job under ``$(perfd ncu-prefix --job J --ranks 0 --kernels-from latest ...)``
   (rank 0 under ncu with profiling off, the kernel filter from the baseline's capture), a rule
   ``tool: ncu`` that opens one step's range through the step hook (kernel budget 40, time budget
   90 s); the agent imports the report, parses it and joins it to the baseline capture. While the
   range runs and after it closes, the report ncu is writing is imported directly (``ncu --import``
   on ncu's own file, the job still running): can it be read before the process exits? Once
   POST_STEPS steps have followed the range, the job is stopped.

Writes to OUT as it goes: ``progress.log`` (a line per event and every few seconds), each process's
output (``*.out``), the jobs' logs (``run_base/``, ``run_ncu/``), the agent's captures
(``captures/``). At the end: ``ncu_kernels.json`` (the per-kernel rows of the range, joined, and the
per-category summaries), ``step_times.json`` (the logged step times: baseline, before / during /
after the range), ``import_while_running.json``, the range's CSV exports (``rank0_details.csv``,
``rank0_raw.csv``: fixtures for tests/data/ncu), and ``ncu_megatron_rule.json`` / ``.md``, the summary.
The .ncu-rep files are deleted at the end (sizes kept) unless KEEP_REPORTS=1.

Exit 0 when: the ncu capture finished on rank 0 with per-kernel rows, no range overran, the report
could be imported while the job ran, and the median step time after the range is within
STEP_TOLERANCE of the median before it (and of the baseline's, when there is one). 1 otherwise (the
summary says which), 2 for a setup problem (no ncu, no Megatron-LM). Bounds: everything ends within
TOTAL_S (default 450 s); the jobs run under ``timeout``; every wait has a deadline; every process
started here is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's perfd

from tests.gpu.megatron_ncu import kill_job_leftovers, log_iterations, stats
from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "ncu-rule"
TOTAL_S = float(os.environ.get("TOTAL_S", "450"))
BASELINE_MAX_S = float(os.environ.get("BASELINE_MAX_S", "170"))  # phase 1 ends by then, capture or not
ITERS = int(os.environ.get("MEGATRON_ITERS", "5000"))  # the script stops the job well before
POST_STEPS = int(os.environ.get("POST_STEPS", "60"))  # steps logged after the range before the stop
WARMUP_STEPS = 10  # first iterations left out of every median
STEP_TOLERANCE = float(os.environ.get("STEP_TOLERANCE", "0.05"))
LAUNCH_COUNT = os.environ.get("NCU_LAUNCH_COUNT", "40")
TIME_BUDGET_S = os.environ.get("NCU_TIME_BUDGET_S", "90")
STEADY_FOR_S = int(os.environ.get("STEADY_FOR_S", "10"))
ENDED = ("finished", "failed", "undeliverable", "refused")
WATCHED = ("rule_firing", "hook_profile", "capture_started", "capture_finished", "capture_failed")

RULES = """
rules:
  - name: {name}
    expr: step_time > 0
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


def megatron_args(megatron: Path) -> list[str]:
    """The small model: 4 layers, hidden 1024, seq 1024, mbs 4, gbs 16 (DP=1: 4 micro-batches a step)."""
    return [
        str(megatron / "pretrain_gpt.py"),
        *f"""
        --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
        --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 16 --train-iters {ITERS}
        --exit-interval {ITERS} --lr 1e-4 --lr-decay-style constant --bf16 --mock-data
        --tokenizer-type NullTokenizer --vocab-size 32000 --transformer-impl local --no-persist-layer-norm
        --no-gradient-accumulation-fusion --no-masked-softmax-fusion --log-interval 1 --log-throughput
        --timing-log-level 2 --eval-iters 0 --eval-interval 100000 --disable-bias-linear""".split(),
    ]


class Run:
    def __init__(self, out: Path, megatron: Path, baseline: bool) -> None:
        self.out, self.megatron, self.baseline = out, megatron, baseline
        self.t0 = time.time()
        self.deadline = self.t0 + TOTAL_S
        self.env = run_env(megatron, CUDA_DEVICE_MAX_CONNECTIONS="1", NCCL_NVLS_ENABLE="0")
        self.res: dict[str, Any] = {"job": JOB, "stage": "setup", "checks": {}}
        self.progress = (out / "progress.log").open("a", buffering=1)
        self.procs = Procs(out, self.env, say=self.say)
        self.seen: set[tuple[Any, ...]] = set()
        self.captures = out / "captures"
        self.agent_yaml = out / "agent.yaml"
        self.agent_yaml.write_text(f"capture_dir: {self.captures}\nbatch_interval_s: 0.5\n")

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.progress.write(line + "\n")

    def left_s(self, limit_s: float) -> float:
        return max(0.0, min(limit_s, self.deadline - time.time()))

    # ---- one phase: aggregator + launch + agent ---------------------------------------------
    def start_phase(
        self, name: str, rules: str, launch_opts: list[str], prefix: list[str]
    ) -> tuple[str, subprocess.Popen[bytes], Path]:
        (self.out / f"rules_{name}.yaml").write_text(rules)
        grpc, _, url = start_aggregator(
            self.procs,
            "--rules",
            self.out / f"rules_{name}.yaml",
            "--rules-interval",
            "1",
            ready=self.out / f"agg_{name}.ready",
            name=f"aggregator_{name}",
            timeout=self.left_s(60),
        )
        run_dir = self.out / f"run_{name}"
        job_s = max(60, int(self.deadline - time.time() - 40))
        cmd = [
            "timeout",
            "--signal=TERM",
            "--kill-after=20",
            str(job_s),
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "--no-python",
            *prefix,
            sys.executable,
            "-m",
            "perfd.hook.megatron",
            *megatron_args(self.megatron),
        ]
        launch = self.procs.perfd(
            f"launch_{name}",
            "launch",
            "--job",
            JOB,
            "--run-dir",
            str(run_dir),
            "--agent-socket",
            str(self.out / f"hook_{name}.sock"),
            *launch_opts,
            "--",
            *cmd,
        )
        manifest = wait_manifest(run_dir / "launch.json", launch, timeout=self.left_s(60))
        start_agent(self.procs, grpc, manifest=manifest, config=self.agent_yaml, name=f"agent_{name}")
        return f"{url}/api", launch, run_dir / "output.log"

    def poll(self, api: str, last_it: int | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        try:
            caps = [c for c in get_json(f"{api}/captures")["captures"] if c.get("job") == JOB]
            events = [e for e in get_json(f"{api}/events")["events"] if e.get("kind") in WATCHED]
        except OSError as exc:
            self.say(f"aggregator API: {exc}")
            return [], []
        for e in events:
            key = (e.get("kind"), e.get("time"), str(e.get("text"))[:200])
            if key not in self.seen:
                self.seen.add(key)
                self.say(f"event {e.get('kind')}: {str(e.get('text'))[:300]} (log iteration {last_it})")
        return caps, events

    def stop_phase(self, name: str) -> None:
        self.say(f"stopping phase {name}")
        for proc in (f"agent_{name}", f"launch_{name}", f"aggregator_{name}"):
            self.procs.end(proc, grace_s=20)
        self.kill_job_leftovers()

    # ---- phase 1 -----------------------------------------------------------------------------
    def run_baseline(self) -> None:
        self.res["stage"] = "baseline"
        rules = RULES.format(name="baseline_kineto", for_s=STEADY_FOR_S, tool="kineto", steps=3)
        api, launch, log = self.start_phase("base", rules, ["--kineto"], [])
        end = min(self.deadline - 200, time.time() + BASELINE_MAX_S)
        capture: dict[str, Any] | None = None
        next_print = 0.0
        while time.time() < end:
            its = log_iterations(log)
            last = max(its) if its else None
            caps, _ = self.poll(api, last)
            if caps and caps[0]["status"] in ENDED:
                capture = caps[0]
                break
            if launch.poll() is not None:
                self.say(f"baseline job ended (exit {launch.returncode}) before its capture")
                break
            if time.time() >= next_print:
                self.say(
                    f"baseline: Megatron iteration {last}; "
                    f"{'capture ' + caps[0]['status'] if caps else 'no capture yet'}"
                )
                next_print = time.time() + 5
            time.sleep(1)
        self.res["baseline_capture"] = {
            k: (capture or {}).get(k)
            for k in ("id", "status", "reason", "started_at", "finished_at", "bottleneck")
        }
        its = log_iterations(log)
        started = (capture or {}).get("started_at")
        steady = [
            ms
            for i, (ms, at) in sorted(its.items())
            if i > WARMUP_STEPS and (started is None or at is None or at < float(started) - 1.0)
        ]
        self.res["baseline_steps"] = {i: ms for i, (ms, _) in sorted(its.items())}
        self.res["baseline_stats"] = stats(steady)
        self.say(f"baseline: {stats(steady)}; capture {self.res['baseline_capture']}")
        self.stop_phase("base")

    # ---- phase 2 -----------------------------------------------------------------------------
    def run_ncu(self) -> None:
        self.res["stage"] = "ncu"
        pre = subprocess.run(
            [
                sys.executable,
                "-m",
                "perfd.app.cli",
                "ncu-prefix",
                "--job",
                JOB,
                "--ranks",
                "0",
                "--capture-dir",
                str(self.captures),
                "--kernels-from",
                "latest",
                "--launch-count",
                LAUNCH_COUNT,
                "--time-budget",
                TIME_BUDGET_S,
            ],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.res["ncu_prefix"] = {
            "rc": pre.returncode,
            "stdout": pre.stdout.strip(),
            "stderr": pre.stderr.strip(),
        }
        self.say(f"ncu-prefix ({pre.returncode}): {pre.stderr.strip()} -> {pre.stdout.strip()}")
        if pre.returncode != 0:
            self.res["setup_error"] = f"perfd ncu-prefix: {pre.stderr.strip()}"
            return
        rules = RULES.format(name="deep_dive_ncu", for_s=STEADY_FOR_S, tool="ncu", steps=1)
        api, launch, log = self.start_phase("ncu", rules, [], pre.stdout.split())
        from perfd.capture.ncu_exec import find_ncu, rank_paths, report_file

        live = report_file(rank_paths(self.captures, JOB, 0)[0])
        ncu = find_ncu()
        imports: list[dict[str, Any]] = []
        sizes: list[tuple[float, int]] = []
        capture: dict[str, Any] | None = None
        range_step: int | None = None
        ended_at: int | None = None  # the last iteration logged when the capture ended
        range_open = False
        next_print = 0.0
        while time.time() < self.deadline - 45:
            its = log_iterations(log)
            last = max(its) if its else None
            caps, events = self.poll(api, last)
            for e in events:
                m = re.search(r"profile request \d+: (\w+) at step (\d+)", str(e.get("text")))
                if m and m.group(1) == "started":
                    range_step, range_open = int(m.group(2)), True
                elif m and m.group(1) in ("stopped", "cancelled", "failed"):
                    range_open = False
            size = live.stat().st_size if live.exists() else -1
            if not sizes or sizes[-1][1] != size:
                sizes.append((round(time.time() - self.t0, 1), size))
            if range_open and size > 0 and not any(i["when"] == "during the range" for i in imports):
                imports.append(self.try_import(ncu, live, "during the range", launch))
            if caps and caps[0]["status"] in ENDED:
                capture = caps[0]
                if ended_at is None:
                    ended_at = last
                if not any(i["when"] == "after the range" for i in imports) and live.exists():
                    imports.append(self.try_import(ncu, live, "after the range", launch))
                # the steps after: once the agent's import and the script's are done
                if range_step is None or (
                    last is not None and ended_at is not None and last >= ended_at + POST_STEPS
                ):
                    break
            if launch.poll() is not None:
                self.say(f"the ncu job ended (perfd launch exit {launch.returncode})")
                break
            if time.time() >= next_print:
                self.say(
                    f"ncu: Megatron iteration {last}; report {size} B; "
                    f"{'capture ' + caps[0]['status'] if caps else 'no capture yet'}; range step {range_step}"
                )
                next_print = time.time() + 5
            time.sleep(1)
        self.res["report_sizes"] = sizes
        self.res["import_while_running"] = imports
        (self.out / "import_while_running.json").write_text(
            json.dumps({"imports": imports, "sizes": sizes}, indent=1)
        )
        try:
            caps, _ = self.poll(api, None)
            capture = caps[0] if caps else capture
        except Exception as exc:
            self.res["api_error_after"] = repr(exc)
        self.res["capture"] = capture
        self.res["range_step"] = range_step
        self.res["capture_ended_at_iteration"] = ended_at
        its = log_iterations(log)
        self.res["ncu_steps"] = {i: ms for i, (ms, _) in sorted(its.items())}
        self.stop_phase("ncu")

    def try_import(
        self, ncu: str, report: Path, when: str, launch: subprocess.Popen[bytes]
    ) -> dict[str, Any]:
        """``ncu --import`` on the report ncu is writing, the job running (it must not be disturbed)."""
        from perfd.capture.ncu_report import NcuParseError, parse_csv

        t = time.time()
        rec: dict[str, Any] = {
            "when": when,
            "report_bytes": report.stat().st_size,
            "job_running": launch.poll() is None,
        }
        try:
            r = subprocess.run(
                [ncu, "--import", str(report), "--csv", "--page", "details"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            rec.update(rc=r.returncode, seconds=round(time.time() - t, 2), stderr=r.stderr.strip()[-500:])
            try:
                rec["kernels"] = len(parse_csv(r.stdout).kernels) if r.returncode == 0 else None
            except NcuParseError as exc:
                rec["parse_error"] = str(exc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            rec.update(error=repr(exc), seconds=round(time.time() - t, 2))
        rec["job_running_after"] = launch.poll() is None
        self.say(f"import {when}: {rec}")
        return rec

    # ---- results -----------------------------------------------------------------------------
    def finish(self) -> None:
        res = self.res
        manifests = (
            [json.loads(p.read_text()) for p in self.captures.rglob("manifest.json")]
            if self.captures.exists()
            else []
        )
        ncu_m = next((m for m in manifests if m.get("tool") == "ncu"), None)
        res["ncu_manifest"] = {k: v for k, v in (ncu_m or {}).items() if k != "analysis"}
        part = ((ncu_m or {}).get("analysis") or {}).get("0") or {}
        (self.out / "ncu_kernels.json").write_text(json.dumps(part, indent=1))
        for art in (ncu_m or {}).get("artifacts", []):
            if art.get("kind") in ("ncu_details_csv", "ncu_raw_csv") and Path(art["path"]).exists():
                shutil.copyfile(art["path"], self.out / Path(art["path"]).name)
        kernels = part.get("kernels") or []
        res["kernels"] = len(kernels)
        res["fields_present"] = {
            f: sum(1 for k in kernels if k.get(f) not in (None, []))
            for f in (
                "duration_ms",
                "sm_clock_hz",
                "compute_throughput",
                "memory_throughput",
                "dram_throughput",
                "tensor_pipe",
                "achieved_occupancy",
                "registers_per_thread",
                "warp_cycles_per_issue",
                "stalls",
                "bound",
                "captured_share",
            )
        }
        res["top_kernels"] = [
            {
                k: row.get(k)
                for k in (
                    "name",
                    "category",
                    "match",
                    "captured_share",
                    "invocations",
                    "duration_ms",
                    "compute_throughput",
                    "memory_throughput",
                    "dram_throughput",
                    "tensor_pipe",
                    "achieved_occupancy",
                    "bound",
                    "stalls",
                    "sm_clock_hz",
                )
            }
            for row in kernels[:10]
        ]
        res["categories"] = part.get("categories")
        steps = {int(i): ms for i, ms in (res.get("ncu_steps") or {}).items()}
        s = res.get("range_step")
        timing: dict[str, Any] = {"range_step": s, "ncu_run": steps, "baseline": res.get("baseline_steps")}
        if s is not None:
            e = max(res.get("capture_ended_at_iteration") or s + 1, s + 1)
            before = [ms for i, ms in steps.items() if WARMUP_STEPS < i < s]
            # between the range and the capture's end the agent copies and imports the report (CPU)
            importing = [ms for i, ms in steps.items() if s + 1 < i <= e]
            after = [ms for i, ms in steps.items() if e < i <= e + POST_STEPS]
            res["step_summary"] = {
                "before": stats(before),
                "during_ms": steps.get(s),
                "first_after_ms": steps.get(s + 1),
                "while_the_agent_imports": stats(importing),
                "after": stats(after),
                "baseline": res.get("baseline_stats"),
            }
            timing.update(res["step_summary"])
        (self.out / "step_times.json").write_text(json.dumps(timing, indent=1, default=str))
        big = [p for p in self.out.rglob("*.ncu-rep")]
        res["reports"] = {str(p.relative_to(self.out)): p.stat().st_size for p in big}
        if os.environ.get("KEEP_REPORTS") != "1":
            for p in big:
                p.unlink()
        cap = res.get("capture") or {}
        sm = res.get("step_summary") or {}
        b, a, base = (
            (sm.get("before") or {}).get("median_ms"),
            (sm.get("after") or {}).get("median_ms"),
            (sm.get("baseline") or {}).get("median_ms"),
        )
        ch = res["checks"]
        ch["capture_finished_on_rank0"] = bool(
            cap.get("status") == "finished" and cap.get("tool") == "ncu" and cap.get("ranks") == [0]
        )
        ch["per_kernel_rows"] = len(kernels) > 0
        ch["no_overrun"] = (ncu_m or {}).get("range_overran") is False
        ch["imported_while_running"] = any(
            i.get("rc") == 0 and i.get("job_running") and i.get("job_running_after")
            for i in res.get("import_while_running") or []
        )
        ch["after_vs_before"] = None if not (a and b) else round(a / b - 1, 4)
        ch["before_vs_baseline"] = None if not (b and base) else round(b / base - 1, 4)
        ch["steps_unchanged"] = bool(
            a
            and b
            and abs(a / b - 1) <= STEP_TOLERANCE
            and (base is None or abs(b / base - 1) <= STEP_TOLERANCE)
        )
        res["ok"] = all(
            ch[k]
            for k in (
                "capture_finished_on_rank0",
                "per_kernel_rows",
                "no_overrun",
                "imported_while_running",
                "steps_unchanged",
            )
        )

    def kill_job_leftovers(self) -> None:
        kill_job_leftovers(JOB, self.say)

    def cleanup(self) -> None:
        self.procs.stop(grace_s=20)
        self.kill_job_leftovers()
        self.res["logs_tail"] = self.procs.tails(
            names=("aggregator_ncu", "agent_ncu", "launch_ncu", "agent_base", "launch_base"), n=2000
        )
        self.progress.close()


def markdown(res: dict[str, Any]) -> str:
    cap = res.get("capture") or {}
    sm = res.get("step_summary") or {}
    lines = [
        "# ncu by rule on real Megatron-LM (perfd.hook.megatron under perfd ncu-prefix)",
        "",
        f"OK: {res.get('ok')}; stage: {res.get('stage')}; checks: {json.dumps(res.get('checks'))}",
        f"ncu-prefix: {(res.get('ncu_prefix') or {}).get('stdout')}",
        f"Capture {cap.get('id')}: {cap.get('status')} on ranks {cap.get('ranks')} — {cap.get('reason')}",
        f"Range at step {res.get('range_step')}; kernels profiled {res.get('kernels')}; fields present "
        f"(rows): {json.dumps(res.get('fields_present'))}",
        "",
        "Step times (ms, as Megatron logged them):",
        f"- baseline (no ncu): {json.dumps(sm.get('baseline'))}",
        f"- under ncu, before the range: {json.dumps(sm.get('before'))}",
        f"- the range's step: {sm.get('during_ms')}; the next: {sm.get('first_after_ms')}",
        f"- while the agent imports the report: {json.dumps(sm.get('while_the_agent_imports'))}",
        f"- after the range: {json.dumps(sm.get('after'))}",
        "",
        "Import while the job runs:",
        *[f"- {json.dumps(i)}" for i in res.get("import_while_running") or []],
        "",
        "Top kernels:",
    ]
    for k in res.get("top_kernels") or []:
        pct = {
            f: (None if k.get(f) is None else round(100 * k[f]))
            for f in (
                "compute_throughput",
                "memory_throughput",
                "dram_throughput",
                "tensor_pipe",
                "achieved_occupancy",
            )
        }
        lines.append(
            f"- [{k.get('category')}] {str(k.get('name'))[:80]}: {pct}, {k.get('bound')}, share "
            f"{k.get('captured_share')} ({k.get('match')}), stalls {k.get('stalls')}"
        )
    lines += ["", "Categories:", *[f"- {json.dumps(c)}" for c in res.get("categories") or []]]
    if res.get("setup_error") or res.get("error"):
        lines += ["", f"Error: {res.get('setup_error') or res.get('error')}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--megatron", type=Path, default=Path(os.environ.get("MEGATRON_DIR", "")))
    ap.add_argument("--no-baseline", action="store_true", help="skip phase 1 (no filter, before/after only)")
    args = ap.parse_args()
    megatron = args.megatron.resolve()
    if not (megatron / "pretrain_gpt.py").exists():
        print("--megatron (or MEGATRON_DIR): a Megatron-LM checkout", file=sys.stderr)
        return 2
    from perfd.capture.ncu_exec import NcuNotFoundError, find_ncu

    try:
        ncu = find_ncu()
    except NcuNotFoundError as exc:
        print(f"{exc}", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    r = Run(out, megatron, not args.no_baseline)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    r.res["ncu"] = {"binary": ncu, "version": version.splitlines()[-1] if version else None}
    r.say(f"ncu {r.res['ncu']}; Megatron-LM at {megatron}; deadline {TOTAL_S:.0f} s")
    try:
        if r.baseline:
            r.run_baseline()
        r.run_ncu()
        r.res["stage"] = "done"
    except Exception as exc:
        r.res["error"] = f"{type(exc).__name__}: {exc}"
        r.res["traceback"] = traceback.format_exc()[-3000:]
        r.say(f"error: {r.res['error']}")
    finally:
        r.cleanup()
    try:
        r.finish()
    except Exception as exc:
        r.res["error_finish"] = f"{type(exc).__name__}: {exc}"
        r.res["traceback_finish"] = traceback.format_exc()[-3000:]
    res = r.res
    res.setdefault("ok", False)
    (out / "ncu_megatron_rule.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "ncu_megatron_rule.md").write_text(md)
    print(md)
    if res.get("setup_error"):
        return 2
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
