"""On 1 GPU: nsys by rule on a real Megatron-LM job, through ``perfd.hook.megatron`` under
``perfd nsys-prefix`` — the rule fires, rank 0's step hook opens and closes the range, nsys writes the
report, the agent exports and analyses it, and the aggregator lists the findings in /api/captures.

    source .gpu-libs/nsys-env.sh    # nsys 2025.3.1 with libdw (PERFD_NSYS)
    MEGATRON_DIR=... python3 tests/gpu/megatron_nsys_rule.py OUT_DIR

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20 was used).
What runs, as a user would run it (README "Captures"):
- ``perfd aggregator`` with one rule: ``perfd_job_mfu_ratio < 60%`` for 6 s → an nsys capture of
  rank 0, 3 steps;
- ``perfd launch --job J --agent-socket S -- timeout ... torchrun --standalone --no-python
  --nproc_per_node 1 $(perfd nsys-prefix --job J) python3 -m perfd.hook.megatron pretrain_gpt.py
  ...`` (12 layers, h=2048, local transformer implementation, mock data, NullTokenizer);
- ``perfd agent --launch-manifest ... --nvml real``.
Each process's output goes to OUT_DIR as it is written (``aggregator.out``, ``agent.out``,
``launch.out``, the job's log in ``run/output.log``); a progress line (Megatron's last iteration,
new events, capture status) is printed and appended to ``progress.log`` every few seconds. Once the
capture has ended the job is stopped (it is only there to be captured). Writes
``megatron_nsys_rule.json`` and ``.md``; exit 0 only when the capture finished on rank 0 with
findings, 1 otherwise (the summary says where it stopped), 2 for a setup problem. The nsys report
and its SQLite export are deleted at the end (their sizes are kept) unless ``KEEP_REPORTS=1``.

Bounds: everything ends within ``TOTAL_S`` (default 540 s, under a 10-minute command limit): the
job runs under ``timeout``, each wait has a deadline, and every process started here is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# run as a script on the GPU machine, where perfd is not installed: the repository's perfd and tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "nsys-rule"
TOTAL_S = float(os.environ.get("TOTAL_S", "540"))
ITERS = int(os.environ.get("MEGATRON_ITERS", "600"))
# The condition of the run; RULE_EXPR and NVML=off only serve a dry run of the plumbing
# on a machine without a GPU (no NVML: no GPU name, no peak, no MFU).
RULE_EXPR = os.environ.get("RULE_EXPR", "perfd_job_mfu_ratio < 60%")
NVML = os.environ.get("NVML", "real")
RULES = f"""
rules:
  - name: low_mfu_nsys
    expr: {RULE_EXPR}
    for: 6s
    severity: warning
    annotations: {{summary: "{RULE_EXPR} for 6 s"}}
    action:
      type: capture
      tool: nsys
      targets: {{ranks: [0]}}
      steps: 3
      cooldown: 1h
      max_per_hour: 1
"""
ENDED = ("finished", "failed", "undeliverable", "refused", "timeout")
WATCHED = ("rule_firing", "hook_profile", "capture_started", "capture_finished", "capture_failed",
           "capture_progress")


def megatron_args(megatron: Path) -> list[str]:
    return [str(megatron / "pretrain_gpt.py"), "--num-layers", "12", "--hidden-size", "2048",
            "--num-attention-heads", "16", "--seq-length", "1024", "--max-position-embeddings", "1024",
            "--micro-batch-size", "4", "--global-batch-size", "16", "--train-iters", str(ITERS),
            "--exit-interval", str(ITERS), "--lr", "1e-4", "--lr-decay-style", "constant", "--bf16",
            "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000",
            "--transformer-impl", "local", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
            "--no-masked-softmax-fusion", "--log-interval", "1", "--log-throughput", "--timing-log-level",
            "2", "--eval-iters", "0", "--eval-interval", "100000", "--disable-bias-linear"]


def log_iterations(log: Path) -> dict[int, float]:
    """Megatron's logged iterations: number -> elapsed ms."""
    out: dict[int, float] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for m in re.finditer(r" iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([0-9.]+)", text):
        out[int(m.group(1))] = float(m.group(2))
    return out


class Run:
    def __init__(self, out: Path, megatron: Path) -> None:
        self.out, self.megatron = out, megatron
        self.t0 = time.time()
        self.deadline = self.t0 + TOTAL_S
        self.env = run_env(megatron, CUDA_DEVICE_MAX_CONNECTIONS="1", NCCL_NVLS_ENABLE="0")
        self.res: dict[str, Any] = {"job": JOB, "stage": "setup"}
        self.progress = (out / "progress.log").open("a", buffering=1)
        self.seen_events: set[tuple[Any, ...]] = set()
        self.procs = Procs(out, self.env, say=self.say)

    def say(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.progress.write(line + "\n")

    def left_s(self, limit_s: float) -> float:
        """``limit_s``, or what is left before the deadline if that is less."""
        return max(0.0, min(limit_s, self.deadline - time.time()))

    # ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        out, res = self.out, self.res
        nsys_ok = subprocess.run([sys.executable, "-m", "perfd.app.cli", "nsys-prefix", "--job", JOB],
                                 cwd=ROOT,
                                 env=self.env, capture_output=True, text=True, timeout=60)
        if nsys_ok.returncode != 0:
            res["setup_error"] = f"perfd nsys-prefix: {nsys_ok.stderr.strip()} (source .gpu-libs/nsys-env.sh)"
            return res
        prefix = nsys_ok.stdout.split()
        res["nsys_prefix"] = " ".join(prefix)
        from perfd.capture.nsys_exec import nsys_version

        res["nsys_version"] = nsys_version()
        self.say(f"nsys {res['nsys_version']}; prefix: {res['nsys_prefix']}")
        (out / "rules.yaml").write_text(RULES)
        grpc_port, _, url = start_aggregator(self.procs, "--rules", out / "rules.yaml", "--rules-interval",
                                             "1", timeout=self.left_s(60))
        api = f"{url}/api"
        run_dir = out / "run"
        job_s = max(60, int(self.deadline - time.time() - 60))  # the job ends before the script must
        cmd = ["timeout", "--signal=TERM", "--kill-after=20", str(job_s), sys.executable, "-m",
               "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "--no-python", *prefix,
               sys.executable, "-m", "perfd.hook.megatron", *megatron_args(self.megatron)]
        launch = self.procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir),
                                  "--agent-socket", str(out / "hook.sock"), "--", *cmd)
        manifest = wait_manifest(run_dir / "launch.json", launch, timeout=self.left_s(60))
        (out / "agent.yaml").write_text(f"capture_dir: {out / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(self.procs, grpc_port, manifest=manifest, nvml=NVML, config=out / "agent.yaml")
        res["stage"] = "waiting for the capture"
        log = run_dir / "output.log"
        self.manifest = manifest
        capture: dict[str, Any] | None = None
        fired_at_iteration: int | None = None
        next_print = 0.0
        while time.time() < self.deadline - 30:
            its = log_iterations(log)
            last_it = max(its) if its else None
            if last_it is not None and "nsys_sessions" not in res:  # the rank's session, for the record
                res["nsys_sessions"] = self.nsys_sessions()
                self.say(f"first iteration logged; nsys sessions: {res['nsys_sessions']}")
            try:
                caps = [c for c in get_json(f"{api}/captures")["captures"] if c.get("job") == JOB]
                events = [e for e in get_json(f"{api}/events")["events"] if e.get("kind") in WATCHED]
            except OSError as exc:
                caps, events = [], []
                self.say(f"aggregator API: {exc}")
            for e in events:
                key = (e.get("kind"), e.get("time"), str(e.get("text"))[:200])
                if key not in self.seen_events:
                    self.seen_events.add(key)
                    self.say(f"event {e.get('kind')}: {str(e.get('text'))[:300]} (log iteration {last_it})")
                    if e.get("kind") == "rule_firing" and fired_at_iteration is None:
                        fired_at_iteration = last_it
            if caps and caps[0]["status"] in ENDED:
                capture = caps[0]
                break
            if launch.poll() is not None:
                self.say(f"the job ended (perfd launch exit {launch.returncode}) before the capture did")
                break
            if time.time() >= next_print:
                status = f"capture {caps[0]['id']} {caps[0]['status']}" if caps else "no capture yet"
                self.say(f"Megatron iteration {last_it}; {status}")
                next_print = time.time() + 5
            time.sleep(1)
        res["capture"] = capture
        res["fired_at_log_iteration"] = fired_at_iteration
        res["stage"] = "capture ended" if capture else "no capture ended in time"
        if capture:
            self.say(f"capture {capture['id']}: {capture['status']} — {capture.get('reason')}")
        self.say("stopping the job")
        self.procs.end("launch", grace_s=20)
        time.sleep(3)  # the agent's last events reach the aggregator
        try:
            res["events"] = [{"kind": e.get("kind"), "time": e.get("time"), "text": str(e.get("text"))[:400]}
                             for e in get_json(f"{api}/events")["events"] if e.get("kind") in WATCHED]
            caps = [c for c in get_json(f"{api}/captures")["captures"] if c.get("job") == JOB]
            res["capture"] = caps[0] if caps else capture
        except OSError as exc:
            res["api_error_after"] = repr(exc)
        its = log_iterations(log)
        res["log_iterations"] = len(its)
        hook = [e for e in res.get("events", []) if e["kind"] == "hook_profile"]
        res["hook_profile"] = [e["text"] for e in hook]
        res["agent_manifests"] = [json.loads(p.read_text()) for p in (out / "captures").rglob("manifest.json")
                                  ] if (out / "captures").exists() else []
        found = (re.search(r"started at step (\d+)", e["text"]) for e in hook)
        started = [int(m.group(1)) for m in found if m]
        started += [int(m["steps"]["start"]) for m in res["agent_manifests"]
                    if isinstance(m.get("steps"), dict) and isinstance(m["steps"].get("start"), int)]
        if started:  # the captured iterations as Megatron logged them (cudaProfilerStop stalls the last)
            s = started[0]
            res["range_start_step"] = s
            res["range_iterations_ms"] = {i: its.get(i) for i in range(s - 1, s + 5)}
        # The report and its export are large (tens of MB): their sizes stay in the summary, the
        # files only with KEEP_REPORTS=1 (the analysis is in the capture record already).
        big = [p for p in (out / "captures").rglob("*") if p.suffix in (".nsys-rep", ".sqlite")] \
            if (out / "captures").exists() else []
        res["reports"] = {str(p.relative_to(out)): p.stat().st_size for p in big}
        if os.environ.get("KEEP_REPORTS") != "1":
            for p in big:
                p.unlink()
        cap = res.get("capture") or {}
        res["ok"] = bool(cap.get("status") == "finished" and cap.get("tool") == "nsys"
                         and cap.get("ranks") == [0] and cap.get("findings"))
        return res

    def nsys_sessions(self) -> str:
        from perfd.capture.binaries import find_nsys

        try:
            res = subprocess.run([find_nsys(), "sessions", "list"], capture_output=True, text=True,
                                 timeout=30, env=self.env)
            return (res.stdout + res.stderr).strip()[-1000:]
        except Exception as exc:
            return repr(exc)

    def job_pids(self) -> list[int]:
        """Processes of this run's job (perfd launch gives each the manifest's path in its
        environment): torchrun, nsys and the rank, wherever they moved in the process tree."""
        manifest = getattr(self, "manifest", None)
        if manifest is None:
            return []
        mark = f"PERFD_LAUNCH_MANIFEST={manifest.resolve()}".encode()
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        pids.append(int(d.name))
                except OSError:
                    continue
        return pids

    def cleanup(self) -> None:
        self.procs.stop(grace_s=20)  # the agent, then the job, the aggregator last
        left = self.job_pids()  # a rank left behind would hold the GPU for the next run
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not left:
                break
            self.say(f"job processes still there: {left}; {sig.name}")
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.time() + 15
            while left and time.time() < end:
                time.sleep(0.5)
                left = self.job_pids()
        self.res["logs_tail"] = self.procs.tails(n=2000)
        self.progress.close()


def markdown(res: dict[str, Any]) -> str:
    cap = res.get("capture") or {}
    lines = ["# nsys by rule on real Megatron-LM (perfd.hook.megatron under perfd nsys-prefix)", "",
             f"OK: {res.get('ok')}; stage: {res.get('stage')}; nsys {res.get('nsys_version')}",
             f"Rule fired at log iteration {res.get('fired_at_log_iteration')}; "
             f"{res.get('log_iterations')} iterations logged.", "",
             f"Capture {cap.get('id')}: {cap.get('status')} on ranks {cap.get('ranks')} — "
             f"{cap.get('reason')}", f"Requested {cap.get('requested_at')}, started {cap.get('started_at')}, "
             f"finished {cap.get('finished_at')}", "", "Hook:",
             *[f"- {t}" for t in res.get("hook_profile", [])],
             "", f"Captured iterations (ms, as logged): {res.get('range_iterations_ms')}", "", "Findings:"]
    lines += [f"- {f.get('title')}: {str(f.get('observation'))[:300]}" for f in cap.get("findings") or []]
    lines += ["", "Events:", *[f"- {e['kind']}: {e['text']}" for e in res.get("events", [])]]
    if res.get("setup_error") or res.get("error"):
        lines += ["", f"Error: {res.get('setup_error') or res.get('error')}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    megatron = Path(os.environ.get("MEGATRON_DIR", "")).resolve()
    if not (megatron / "pretrain_gpt.py").exists():
        print("set MEGATRON_DIR to a Megatron-LM checkout", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    r = Run(out, megatron)
    try:
        r.run()
    except Exception as exc:
        r.res["error"] = f"{type(exc).__name__}: {exc}"
        r.res["traceback"] = traceback.format_exc()[-3000:]
        r.say(f"error: {r.res['error']}")
    finally:
        r.cleanup()
    res = r.res
    res.setdefault("ok", False)
    (out / "megatron_nsys_rule.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    (out / "megatron_nsys_rule.md").write_text(md)
    print(md)
    if res.get("setup_error"):
        return 2
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
