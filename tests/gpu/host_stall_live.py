"""Live, on 1 GPU (docs/evidence/entries/24-the-host-and-the-hang-on-real-megatron-lm-2026-11-24-1-h100.md):
the host and the hang in ONE Megatron-LM run (about 5 minutes).

    MEGATRON_DIR=... python3 tests/gpu/host_stall_live.py OUT_DIR            # the H100 run (16 CPUs)
    python3 tests/gpu/host_stall_live.py OUT_DIR --cpu-smoke                 # the same plumbing on CPU

Megatron-LM is not part of this repository: MEGATRON_DIR points at a checkout (core 0.20). Starts
`perfd aggregator` (the shipped rules), `perfd launch -- torchrun pretrain_gpt.py` (DP=1, one GPU,
h=1024, 12 layers, ``--save-interval`` saves) with the whole job pinned to two CPUs (``--cpus``,
default 2,3: its affinity is set before torchrun starts, so every process of the job inherits it),
and `perfd agent --launch-manifest --nvml real` (the ranks collector is on by default). Then, timed
from the first iteration:

- at ``--burn-at`` s, six CPU burners pinned to the job's two CPUs for ``--burn-s`` s: the incident's
  cause must name a burner's pid and the contention (``cpu_contention``), not data loading;
- at ``--stop-at`` s, the rank process (the torchrun worker declaring RANK=0) is SIGSTOPped for
  ``--stop-s`` s: /api/jobs must say ``stalled`` within 10 s, with the rank's process state and its
  Python stack (py-spy); after SIGCONT the incident's cause must be ``process_stopped``, its cost the
  stop's length;
- every ``--save-interval`` iterations Megatron saves a checkpoint (announced in its log): no stall
  may open during a save.

While it runs, the aggregator is polled every second and every poll is appended to
OUT_DIR/raw/polls.jsonl as it happens (job state, open incidents with cause and verdict, the rank's
host row); ``perfd top --once`` is written to OUT_DIR/raw/top_*.txt during the burn and the stop.
At the end OUT_DIR/host_stall.json (all findings, the checks) and host_stall.md (the summary),
with the raw material (Megatron's log, the aggregator's and the agent's output) in OUT_DIR/raw/.
Exit 0 when every check holds, 1 otherwise.

``--cpu-smoke``: the same timeline, plumbing and checks with tests/host/hook_loop.py (a CPU loop timed
by the step hook, announcing a checkpoint save) instead of Megatron-LM, shorter: what
tests/host/test_host_stall_script.py runs on CPU so that a GPU run does not find the script's bugs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import PERFD, ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "host-stall"
BURNERS = 6
# Sets its own CPU affinity, then becomes the command: every process the command starts inherits it.
PIN = ("import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
       "os.execvp(sys.argv[2], sys.argv[2:])\n")
BURN = ("import os, sys, time\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
        "end = time.time() + float(sys.argv[2])\nwhile time.time() < end:\n    pass\n")
SAVE_BEGIN = re.compile(r"saving checkpoint at iteration\s+(\d+)")
SAVE_END = re.compile(r"successfully saved checkpoint from iteration\s+(\d+)")
ITERATION = re.compile(r" iteration\s+(\d+)/")


def megatron_argv(megatron: Path, save_dir: Path, iters: int, save_interval: int) -> list[str]:
    """Megatron-LM core 0.20 on one GPU: the issue's job (h=1024, 12 layers) with saves."""
    from tests.gpu.verdict_live import megatron_argv as base

    c = {"layers": 12, "hidden": 1024, "heads": 16, "seq": 1024, "mbs": 4, "gbs": 32, "iters": iters}
    return [*base(megatron, c), "--save", str(save_dir), "--save-interval", str(save_interval)]


def rank_pid(manifest: Path) -> int | None:
    """The job's rank 0 process: the launched command's descendant that declares RANK=0 (a torchrun
    worker), else the command itself (one process, as the step hook numbers it)."""
    import psutil

    from perfd.core.procinfo import psutil_rank_env

    try:
        pid = json.loads(manifest.read_text()).get("pid")
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except (OSError, ValueError, psutil.Error, TypeError):
        return None
    for p in tree:
        if psutil_rank_env(p.pid).get("rank") == 0:
            return int(p.pid)
    return int(pid) if len(tree) == 1 else None


class LogWatch:
    """Follows the job's log as the polls go: the first iteration, and each save's begin and end, on
    the poll's clock (time.time())."""

    def __init__(self, log: Path) -> None:
        self.log, self.offset = log, 0
        self.first_iteration_at: float | None = None
        self.last_iteration: int | None = None
        self.saves: list[dict[str, Any]] = []

    def read(self) -> None:
        if not self.log.exists():
            return
        with self.log.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        now = time.time()
        for line in data[:cut].decode("utf-8", "replace").splitlines():
            if (m := ITERATION.search(line)) and "elapsed time per iteration" in line:
                self.last_iteration = int(m.group(1))
                self.first_iteration_at = self.first_iteration_at or now
            elif m := SAVE_BEGIN.search(line):
                self.saves.append({"iteration": int(m.group(1)), "began": now, "ended": None})
            elif (m := SAVE_END.search(line)) and self.saves:
                self.saves[-1]["ended"] = now
            elif line.startswith("pause begins"):  # the CPU smoke's announced save
                self.saves.append({"iteration": None, "began": now, "ended": None})
            elif line.startswith("pause ends") and self.saves:
                self.saves[-1]["ended"] = now
            elif line.startswith("step ") and self.first_iteration_at is None:
                self.first_iteration_at = now


INCIDENT_KEYS = ("id", "kinds", "open", "first_iteration", "last_iteration", "cost_s", "cause", "ranks",
                 "start_time", "end_time")
HOST_KEYS = ("rank", "pid", "state", "cpu_cores", "wait_ratio", "allowed_cpus", "allowed_busy_ratio",
             "others_ratio", "throttled_ratio")


def poll(base: str, raw_incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's state, incidents and rank hosts in brief; `raw_incidents` gets the incidents whole."""
    job = next((j for j in get_json(f"{base}/api/jobs")["jobs"] if j and j.get("job") == JOB), None)
    if job is None:
        return {"state": None}
    incs = get_json(f"{base}/api/jobs/{JOB}/incidents")["incidents"]
    raw_incidents.extend(incs)
    hosts = get_json(f"{base}/api/jobs/{JOB}/gpus").get("rank_hosts") or []
    return {
        "state": job.get("state"), "state_reason": job.get("state_reason"), "stall": job.get("stall"),
        "last_iteration": job.get("last_iteration"),
        "incidents": [{k: i.get(k) for k in INCIDENT_KEYS}
                      | {"verdict_cause": (i.get("verdict") or {}).get("cause"),
                         "lead": (i.get("verdict") or {}).get("lead")} | _stall_part(i) for i in incs],
        "rank_hosts": [{k: r.get(k) for k in HOST_KEYS}
                       | {"others": [{k: o.get(k) for k in ("pid", "cpu_ratio", "own")}
                                     for o in (r.get("others") or [])[:6]]} for r in hosts],
    }


def _stall_part(inc: dict[str, Any]) -> dict[str, Any]:
    """A stall incident's opening time (the aggregator's clock: when /api/jobs began to say stalled)
    and the stacks its ranks' agents took, as far as they have come."""
    st = (inc.get("evidence") or {}).get("stall")
    if not isinstance(st, dict):
        return {}
    return {"stall_opened_at": st.get("opened_at"),
            "stacks": {r: (s.get("stack") or "")[:600] or {"error": s.get("error")}
                       for r, s in (st.get("stacks") or {}).items()}}


def run(out: Path, a: argparse.Namespace, megatron: Path | None) -> dict[str, Any]:
    raw = out / "raw"
    shutil.rmtree(raw, ignore_errors=True)  # an earlier run's ready file, manifest and checkpoints
    raw.mkdir(parents=True)
    res: dict[str, Any] = {"job": JOB, "args": vars(a) | {"out": str(a.out)},
                           "mode": "cpu-smoke" if a.cpu_smoke else "megatron"}
    env = run_env(NCCL_NVLS_ENABLE="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    procs = Procs(raw, env)
    polls_file = (raw / "polls.jsonl").open("w")
    t0 = time.time()
    try:
        grpc_port, http_port, base = start_aggregator(procs, "--rules", ROOT / "rules" / "default.yaml",
                                                      "--rules-interval", "1")
        run_dir = raw / "run"
        if a.cpu_smoke:
            # The job steps until this script stops it (its --duration is past --max-s): the polls end when
            # the incident after the stop has settled, which on a loaded machine came later than a job
            # sized to end a minute past the stop (CI, load 3.5 per CPU: no incident after the stop read).
            cmd = [sys.executable, str(ROOT / "tests" / "host" / "hook_loop.py"), "--step-ms", "15",
                   "--duration", str(a.max_s + 60), "--pause-at", str(a.save_at_step),
                   "--announce", "yes", "--pause-s", "12"]
        else:
            assert megatron is not None
            cmd = [*megatron_argv(megatron, raw / "ckpt", a.iters, a.save_interval)]
        launch = procs.start("launch", [sys.executable, "-c", PIN, a.cpus, *PERFD, "launch", "--job", JOB,
                                        "--run-dir", str(run_dir), "--agent-socket", str(raw / "hook.sock"),
                                        "--", *cmd])
        manifest = wait_manifest(run_dir / "launch.json", launch)
        res["pinned_to"] = a.cpus
        start_agent(procs, grpc_port, manifest=manifest, nvml="off" if a.cpu_smoke else "real")
        watch = LogWatch(run_dir / "output.log")
        burners: list[subprocess.Popen[bytes]] = []
        stop: dict[str, Any] = {}
        polls: list[dict[str, Any]] = []
        deadline = t0 + a.max_s
        last_incidents: list[dict[str, Any]] = []  # the last poll's incidents, whole
        while time.time() < deadline and launch.poll() is None:
            watch.read()
            now = time.time()
            raw_incidents: list[dict[str, Any]] = []
            try:
                p = {"t": round(now - t0, 2), **poll(base, raw_incidents)}
                last_incidents = raw_incidents
            except Exception as exc:  # the aggregator not answering is itself worth a line
                p = {"t": round(now - t0, 2), "error": repr(exc)}
            p["burning"] = any(b.poll() is None for b in burners)
            p["stopped"] = bool(stop) and "continued_at" not in stop
            p["saving"] = bool(watch.saves) and watch.saves[-1]["ended"] is None
            # The machine's load as the poll was made: what else contends with the job while it runs
            # (a shared CI machine's other tests), which the checks' reader weighs.
            p["load_per_cpu"] = round(os.getloadavg()[0] / len(os.sched_getaffinity(0)), 2)
            polls.append(p)
            polls_file.write(json.dumps(p, default=str) + "\n")
            polls_file.flush()
            first = watch.first_iteration_at
            if first is not None:
                since = now - first
                # Neither the burn nor the stop starts during an announced save: a save on the job's
                # two CPUs takes ~40 s, and a burn inside it (seen) slows no step and opens nothing.
                if not burners and since >= a.burn_at and not p["saving"]:
                    burners = [procs.start(f"burner{i}", [sys.executable, "-c", BURN, a.cpus, str(a.burn_s)])
                               for i in range(BURNERS)]
                    res["burners"] = {"pids": [b.pid for b in burners], "started_s": round(now - t0, 2)}
                if burners and "top_burn" not in res and since >= a.burn_at + a.burn_s / 2:
                    res["top_burn"] = _top(raw / "top_burn.txt", http_port)
                if not stop and since >= a.stop_at and not p["saving"]:
                    pid = rank_pid(manifest)
                    if pid is not None:
                        os.kill(pid, signal.SIGSTOP)
                        stop = {"pid": pid, "at": now, "started_s": round(now - t0, 2)}
                if stop and "continued_at" not in stop:
                    if "stalled_seen_s" not in stop and p.get("state") == "stalled":
                        stop["stalled_seen_s"] = round(now - stop["at"], 2)
                        stop["stall_at_sight"] = p.get("stall")
                    if "top" not in stop and now - stop["at"] >= a.stop_s / 2:
                        stop["top"] = _top(raw / "top_stop.txt", http_port)
                    if now - stop["at"] >= a.stop_s:
                        os.kill(stop["pid"], signal.SIGCONT)
                        stop["continued_at"] = now
                        stop["stopped_s"] = round(now - stop["at"], 2)
                # At least --after-s past SIGCONT, and then until the incident that carries the stop has
                # closed (or become a level shift), up to --max-s: on a loaded machine the steps after the
                # stop stay slow for a while, and a verdict read before its incident ends is not there yet
                # (a CI run at load 4.2 per CPU read none after 12 s).
                if stop.get("continued_at") and now - stop["continued_at"] >= a.after_s \
                        and incidents_after_stop(p.get("incidents") or [], stop):
                    res["loop_ended"] = "settled"
                    # The stop's incident as it read when it settled, whole: the incidents are detected
                    # afresh from the steps at every read, and on a loaded machine the slow steps after
                    # the stop can merge into it again and reopen it by the final read 3 s later (CI,
                    # load 4 per CPU: closed with the stop's cause at the settle, no settled one after).
                    res["incidents_settled"] = incidents_after_stop(raw_incidents, stop)
                    break
            time.sleep(1.0)
        # Why the polls stopped, for the reader of a failed check: the incident after the stop settled,
        # the job exited, or --max-s ran out with that incident still open.
        res.setdefault("loop_ended", "job_exited" if launch.poll() is not None else "max_s")
        res["stop"] = stop
        res["saves"] = watch.saves
        res["last_iteration"] = watch.last_iteration
        time.sleep(3)
        # The final reads, each tried again on a slow answer and none fatal: a CI run's aggregator, on a
        # machine its other tests held, did not answer one within 10 s and the run ended with no checks.
        # Their incidents where the final read had none: the last poll's, whole.
        got = _read_after(res, f"{base}/api/jobs/{JOB}/incidents")
        res["incidents_after"] = got["incidents"] if got is not None else last_incidents
        got = _read_after(res, f"{base}/api/jobs/{JOB}/summary")
        res["summary_after"] = {k: v for k, v in (got or {}).items()
                                if k in ("overview", "goodput", "report")}
        got = _read_after(res, f"{base}/api/events")
        res["events"] = [{"kind": e.get("kind"), "time": e.get("time"), "text": str(e.get("text"))[:500]}
                         for e in (got or {}).get("events") or []]
        res["polls"] = len(polls)
        res["checks"] = checks(res, polls)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        polls_file.close()
        procs.stop()
        for name in ("output.log", "output.log.times"):
            src = raw / "run" / name
            if src.exists():
                (raw / name.replace("output", "job")).write_bytes(src.read_bytes())
    return res


READ_AFTER_TRIES = 3
READ_AFTER_TIMEOUT_S = 30.0


def _read_after(res: dict[str, Any], url: str) -> Any:
    """``url``'s JSON, tried up to READ_AFTER_TRIES times; None where no try answered (each error is
    kept in ``res["read_errors"]``)."""
    for _ in range(READ_AFTER_TRIES):
        try:
            return get_json(url, timeout=READ_AFTER_TIMEOUT_S)
        except Exception as exc:  # a slow or refused answer: said, and tried again
            res.setdefault("read_errors", []).append(f"{url}: {exc!r}")
    return None


def _top(path: Path, http_port: int) -> str:
    """`perfd top --once` as it reads now (the host panel: the job's ranks)."""
    got = subprocess.run([*PERFD, "top", "--once", "--job", JOB, "--aggregator", f"http://127.0.0.1:{http_port}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=run_env())
    path.write_text(got.stdout + got.stderr)
    return str(path.name)


BURN_SLOWED = 1.5  # steps this much slower while the burners ran: the burn contended with the job


def spans_stop(inc: dict[str, Any], stop: dict[str, Any]) -> bool:
    """Whether an incident's steps span the SIGSTOP (its start at or before the stop's end, its end at
    or after the stop); True where either side has no times (an older aggregator's incidents)."""
    at, until = stop.get("at"), stop.get("continued_at")
    start, end = inc.get("start_time"), inc.get("end_time")
    if not (isinstance(at, (int, float)) and isinstance(until, (int, float))
            and isinstance(start, (int, float)) and isinstance(end, (int, float))):
        return True
    return bool(start <= until and (end >= at or inc.get("open")))


def incidents_after_stop(incs: list[dict[str, Any]], stop: dict[str, Any]) -> list[dict[str, Any]]:
    """The stall incidents that span the stop and are settled (closed, or open as a level shift that the
    slower steps after the stop keep going), the closed ones first."""
    return sorted((i for i in incs if "stall" in (i.get("kinds") or [])
                   and (not i.get("open") or "level-shift" in (i.get("kinds") or []))
                   and spans_stop(i, stop)),
                  key=lambda i: bool(i.get("open")))


def burn_slowdown(polls: list[dict[str, Any]]) -> float | None:
    """Iterations per second in the 20 s before the burn over those while it ran (outside saves)."""
    start = next((p["t"] for p in polls if p.get("burning")), None)
    if start is None:
        return None

    def rate(rows: list[dict[str, Any]]) -> float | None:
        its = [(p["t"], p["last_iteration"]) for p in rows if isinstance(p.get("last_iteration"), int)]
        if len(its) < 3 or its[-1][0] <= its[0][0]:
            return None
        return float(its[-1][1] - its[0][1]) / float(its[-1][0] - its[0][0])

    before = rate([p for p in polls if start - 20 <= p["t"] < start and not p.get("saving")])
    during = rate([p for p in polls if p.get("burning") and p["t"] >= start + 2 and not p.get("saving")])
    if not before or during is None:
        return None
    return round(before / during, 2) if during > 0 else float("inf")


def checks(res: dict[str, Any], polls: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    incs = res.get("incidents_after") or []
    burners = set((res.get("burners") or {}).get("pids") or [])

    def names_a_burner(i: dict[str, Any]) -> bool:
        """The incident's verdict holds contention evidence naming a burner: as its lead, or beside
        another lead (on a loaded machine the slow stretch can run on into the stop's incident)."""
        v = i.get("verdict") or {}
        return any(e.get("kind") == "cpu_contention"
                   and burners & {o.get("pid") for o in (e.get("detail") or {}).get("others") or []}
                   for e in [v.get("lead") or {}, *(v.get("also") or [])])

    stop = res.get("stop") or {}
    cont = [i for i in incs if (i.get("verdict") or {}).get("cause") == "cpu_contention"]
    named = [i for i in incs if names_a_burner(i)]
    out["contention_names_a_burner"] = bool(named)
    out["contention_cause"] = named[0]["cause"] if named else (cont[0]["cause"] if cont else None)
    during_burn = {i.get("verdict_cause") for p in polls if p.get("burning") for i in p.get("incidents") or []
                   if i.get("open")}
    out["verdicts_while_burning"] = sorted(str(v) for v in during_burn)
    out["not_data_loading"] = bool(named) and (named[0].get("verdict") or {}).get("cause") != "data_wait"
    # Did the burn slow the job at all? Iterations per second in the 20 s before it against while it
    # ran (not saving): on one H100 machine the same burners left the rank most of a core (1.08×), and
    # then no incident is the right answer, not a miss.
    out["burn_slowdown"] = burn_slowdown(polls)
    out["burn_slowed_steps"] = out["burn_slowdown"] is not None and out["burn_slowdown"] >= BURN_SLOWED
    # None: the burn did not slow the steps, so there was no contention to name (not a failure)
    out["contention_named_where_it_slowed"] = (out["contention_names_a_burner"] and out["not_data_loading"]
                                               if out["burn_slowed_steps"] else None)
    # When the aggregator opened the stall (its clock, the same machine's): this script's polls can
    # lag it by seconds on a loaded machine (a poll waits for `perfd top` to answer, say).
    stopped_polls = [p for p in polls if p.get("stopped")]
    opened = [i["stall_opened_at"] for p in stopped_polls for i in p.get("incidents") or []
              if "stall" in (i.get("kinds") or []) and isinstance(i.get("stall_opened_at"), (int, float))]
    at = stop.get("at")
    seen = round(min(opened) - at, 2) if opened and at else stop.get("stalled_seen_s")
    out["stalled_seen_s_after_sigstop"] = seen
    out["stalled_seen_by_poll_s"] = stop.get("stalled_seen_s")
    out["stalled_within_10_s"] = seen is not None and seen <= 10.0
    sight = stop.get("stall_at_sight") or {}
    out["rank_state_at_sight"] = {r: v.get("state") for r, v in (sight.get("ranks") or {}).items()}
    # The rank's state as its agent read it, while it was stopped (the stall can be seen from the
    # silence a collect before the agent has read the state: the first poll may not have it yet).
    read = [p["t"] for p in stopped_polls if p.get("state") == "stalled"
            and "stopped" in {v.get("state") for v in ((p.get("stall") or {}).get("ranks") or {}).values()}]
    out["state_stopped_read_at_t"] = read[0] if read else None
    out["state_stopped_while_stopped"] = bool(read)
    stacks: dict[str, Any] = {}
    for p in stopped_polls:  # the stacks as they came in while the rank was stopped
        for i in p.get("incidents") or []:
            stacks.update({r: v for r, v in (i.get("stacks") or {}).items()
                           if isinstance(v, str) or r not in stacks})
    out["stacks_while_stopped"] = stacks
    out["stack_taken"] = any(isinstance(v, str) and v for v in stacks.values())
    # The incident that carries the stall once steps resumed: closed, or still open where it is a level
    # shift that the slower steps after the stop keep going (seen with two suites on a 2-CPU machine).
    # The one that spans the stop: on a loaded machine the burn's slow steps can go silent past the stall
    # limit too, and that earlier incident (its cause the burners) is not the stop's.
    # As it read when the polls saw it settle, where they did; else (the job exited, or --max-s ran out)
    # as the final read has it.
    settled = res.get("incidents_settled")
    after = settled if settled else incidents_after_stop(incs, stop)
    out["stall_incident_read"] = "at_settle" if settled else "final"
    out["stall_incident_after"] = after and {k: after[0].get(k) for k in ("id", "kinds", "cost_s", "cause")}
    out["cause_after_is_stopped"] = bool(after) and (after[0].get("verdict") or {}).get("cause") == \
        "process_stopped"
    stopped_s = stop.get("stopped_s")
    out["cost_vs_stop"] = {"cost_s": after[0].get("cost_s") if after else None, "stopped_s": stopped_s}
    out["cost_within_15pct"] = bool(after and stopped_s and abs((after[0].get("cost_s") or 0) - stopped_s)
                                    <= 0.15 * stopped_s)
    saves = [s for s in res.get("saves") or [] if s.get("ended")]
    out["saves"] = len(saves)
    out["loop_ended"] = res.get("loop_ended")
    # The stall incidents the last poll saw, in brief: what a missing incident after the stop was instead.
    last: dict[str, Any] = next((p for p in reversed(polls) if "incidents" in p), {})
    out["stall_incidents_last_poll"] = [{k: i.get(k) for k in ("kinds", "open", "verdict_cause")}
                                        for i in last.get("incidents") or []
                                        if "stall" in (i.get("kinds") or [])]
    # and as the final read has them, 3 s later: where the two differ, the stop's incident moved on
    brief = ("kinds", "open", "first_iteration", "last_iteration")
    out["stall_incidents_final"] = [{k: i.get(k) for k in brief}
                                    | {"verdict_cause": (i.get("verdict") or {}).get("cause")}
                                    for i in incs if "stall" in (i.get("kinds") or [])]
    stalled_in_save = [p["t"] for p in polls if p.get("saving") and p.get("state") == "stalled"
                       and not p.get("stopped")]
    out["stalled_polls_during_saves"] = stalled_in_save
    out["no_stall_during_saves"] = bool(saves) and not stalled_in_save
    out["all"] = out["contention_named_where_it_slowed"] is not False and all(out[k] for k in (
        "stalled_within_10_s", "state_stopped_while_stopped", "stack_taken", "cause_after_is_stopped",
        "cost_within_15pct", "no_stall_during_saves"))
    return out


def markdown(res: dict[str, Any]) -> str:
    c = res.get("checks") or {}
    burn, stop = res.get("burners") or {}, res.get("stop") or {}
    lines = [f"# The host and the hang, live ({res.get('mode')})", "",
             f"Job pinned to CPUs {res.get('pinned_to')}; {len(burn.get('pids') or [])} burners at "
             f"{burn.get('started_s')} s; SIGSTOP at {stop.get('started_s')} s for {stop.get('stopped_s')} "
             f"s; {c.get('saves')} checkpoint saves.", "", "| check | result |", "|---|---|"]
    for k, v in c.items():
        lines.append(f"| {k} | {json.dumps(v, default=str)[:400]} |")
    if res.get("error"):
        lines += ["", f"Error: {res['error']}", "", "```", str(res.get("traceback")), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tests/host/hook_loop.py instead of Megatron-LM")
    ap.add_argument("--cpus", default=None, help="the job's CPUs (default 2,3; the smoke: the last CPU)")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--save-interval", type=int, default=100,
                    help="Megatron's --save-interval (saves at 100, 200, ...: none inside the burn)")
    ap.add_argument("--save-at-step", type=int, default=300, help="the smoke loop's announced save")
    ap.add_argument("--burn-at", type=float, default=None)
    ap.add_argument("--burn-s", type=float, default=None)
    ap.add_argument("--stop-at", type=float, default=None)
    ap.add_argument("--stop-s", type=float, default=None)
    ap.add_argument("--after-s", type=float, default=None,
                    help="how long at least to go on after SIGCONT (then until the incident that carries "
                         "the stop has settled, up to --max-s)")
    ap.add_argument("--max-s", type=float, default=330.0)
    a = ap.parse_args()
    smoke = {"cpus": str(max(os.sched_getaffinity(0))), "burn_at": 20.0, "burn_s": 15.0, "stop_at": 55.0,
             "stop_s": 20.0, "after_s": 15.0}
    live = {"cpus": "2,3", "burn_at": 40.0, "burn_s": 30.0, "stop_at": 110.0, "stop_s": 40.0, "after_s": 30.0}
    for k, v in (smoke if a.cpu_smoke else live).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    megatron = None
    if not a.cpu_smoke:
        megatron = Path(os.environ.get("MEGATRON_DIR", "")).resolve()
        if not (megatron / "pretrain_gpt.py").exists():
            print("set MEGATRON_DIR to a Megatron-LM checkout (or --cpu-smoke)", file=sys.stderr)
            return 2
    out: Path = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    res = run(out, a, megatron)
    (out / "host_stall.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "host_stall.md").write_text(markdown(res))
    print(json.dumps(res.get("checks") or {"error": res.get("error")}, indent=1, default=str))
    return 0 if (res.get("checks") or {}).get("all") else 1


if __name__ == "__main__":
    sys.exit(main())
