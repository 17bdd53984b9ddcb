"""`perfd bench soak`: an aggregator over a long life — thousands of short jobs from many agents, with
restarts — and whether what it holds stays flat (issue 36).

    perfd bench soak [--jobs 5000] [--agents 100] [--restarts 3] [--json] [--out DIR]

A real ``perfd aggregator`` process with a ``--state-dir`` (and short ``--job-stale-after`` /
``--job-retention`` / ``--agent-retention``, so that jobs end, are pruned and agents are forgotten
within the run, as they would over months at the defaults); ``--agents`` real ``AgentClient`` streams
in this process, each running its share of ``--jobs`` one after another: a Hello naming the job, its
job info, ``--steps`` step records and an event, acknowledged, then the stream closes and the next
job begins (a node whose jobs come and go). ``--restarts`` times, evenly over the run, the aggregator
is killed (alternately kill -9 and SIGTERM) and started again on the same state while the agents
keep sending (they resend from their spools).

Sampled every ``--sample-s`` and reported per quarter of the jobs done: the state directory's size on
disk and what the store holds (``state_store_held_bytes``), the aggregator's RSS, the jobs it holds
(``jobs_held``), and admission: every job admitted (refusals at the jobs cap or a quota would show a
cap that does not free), and the time from a job's first batch to its acknowledgement (p50/p99; the
jobs whose wait overlapped a restart are counted apart — they waited for the aggregator to come
back). Each restart: the seconds until it listens again and what its replay read. Flat means the
last quarter's medians are within ``--flat-ratio`` of the first quarter's (printed, not asserted:
a benchmark).
Everything runs on this machine: on 2 cores the load competes with the aggregator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class Aggregator:
    """The aggregator process, started and restarted on the same state dir."""

    out: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    grpc_port: int = 0
    http_port: int = 0
    starts: int = 0
    restarts: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> float:
        ready = self.out / "agg.ready"
        ready.unlink(missing_ok=True)
        self.starts += 1
        log = (self.out / f"aggregator.{self.starts}.out").open("wb")
        ports = ["--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port)]
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "perfd.app.cli", "aggregator", "--grpc-host", "127.0.0.1",
                "--http-host",
                "127.0.0.1", *ports, *self.args, "--ready-file", str(ready)]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                     stderr=subprocess.STDOUT)
        while not (ready.exists() and len(ready.read_text().split()) >= 2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"aggregator exited ({self.proc.returncode}); see {log.name}")
            time.sleep(0.05)
        self.grpc_port, self.http_port = (int(w) for w in ready.read_text().split()[:2])
        return time.monotonic() - t0

    def restart(self, kill9: bool) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGKILL if kill9 else signal.SIGTERM)
        self.proc.wait(30)
        down = time.monotonic() - t0
        up = self.start()
        st = stats(self.http_port)["transport"]
        self.restarts.append({"how": "kill -9" if kill9 else "SIGTERM", "stop_s": round(down, 3),
                              "listening_again_s": round(up, 3),
                              "replayed": {k[len("state_restored_"):]: v for k, v in st.items()
                                           if k.startswith("state_restored_")}})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def stats(http_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/stats", timeout=30) as r:
        got: dict[str, Any] = json.loads(r.read())
    return got


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


@dataclass
class Load:
    jobs_done: int = 0
    failed: int = 0  # jobs whose batch was not acknowledged within the deadline
    admit_s: list[tuple[int, float]] = field(default_factory=list)  # (jobs done then, seconds)
    # Of those, the jobs whose wait overlapped a restart (the aggregator was down): apart.
    during_restart: set[int] = field(default_factory=set)
    restarting: list[tuple[float, float]] = field(default_factory=list)  # (from, to), monotonic


@dataclass(frozen=True)
class Shape:
    """What each job is: its step records, and in a churn (--churn) its own agent id (a job's sidecar),
    the host series it sends, and when it starts (paced: ``every_s`` between two jobs of all agents)."""

    steps: int
    sidecar: bool = False
    series: int = 0
    every_s: float = 0.0


async def agent(k: int, n_jobs: int, shape: Shape, agg: Aggregator, load: Load, gate: asyncio.Event,
                agents: int = 1) -> None:
    """One node: its jobs one after another, each a new stream (a Hello naming it)."""
    from perfd.core.model import Sample, StepRecord
    from perfd.transport import AgentClient

    steps = shape.steps
    t_start = time.monotonic()
    for n in range(n_jobs):
        await gate.wait()  # closed while the aggregator restarts: a node's next job waits for it
        if shape.every_s:  # paced: job n of agent k starts at its slot among all agents' jobs
            await asyncio.sleep(max(0.0, t_start + (n * agents + k) * shape.every_s - time.monotonic()))
        job = f"job-{k:03d}-{n:04d}"
        now = time.time()
        agent_id = f"node-{k:03d}/{job}" if shape.sidecar else f"node-{k:03d}"
        c = AgentClient(f"127.0.0.1:{agg.grpc_port}", agent_id, jobs=[job], backoff_initial_s=0.2,
                        backoff_max_s=2.0)
        recs = [StepRecord(job=job, iteration=i, rank="last", end_time=now - (steps - i) * 0.05,
                           step_time_ms=50.0, lm_loss=5.0) for i in range(1, steps + 1)]
        samples = [Sample(f"perfd_host_soak_{s}", float(s), now, {"node": f"node-{k:03d}"})
                   for s in range(shape.series)]
        c.submit(samples, steps=recs, job_info_json={job: json.dumps({"framework": "megatron",
                                                                      "arguments": {"num_layers": "2"}})},
                 events=[{"kind": "validation", "severity": "info", "job": job, "time": now,
                          "text": f"{job} soak event", "payload": {"n": n}}])
        task = asyncio.create_task(c.run())
        t0 = time.monotonic()
        ok = await c.flush(120)
        took = time.monotonic() - t0  # to acknowledged (the stream's teardown is not the aggregator's)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        c.close()
        load.jobs_done += 1
        if ok:
            load.admit_s.append((load.jobs_done, took))
            if any(a <= t0 + took and t0 <= b for a, b in load.restarting) or gate_was_closed(load, t0):
                load.during_restart.add(load.jobs_done)
        else:
            load.failed += 1


def gate_was_closed(load: Load, t0: float) -> bool:
    """A restart still under way when the job began (its window is not closed yet)."""
    return bool(load.restarting) and load.restarting[-1][1] == float("inf") and load.restarting[-1][0] <= t0


def sample(agg: Aggregator, state: Path, load: Load) -> dict[str, Any]:
    assert agg.proc is not None
    st = stats(agg.http_port)
    t = st["transport"]
    proc = st.get("process") or {}
    return {"t": time.time(), "jobs_done": load.jobs_done, "rss_bytes": rss_bytes(agg.proc.pid),
            "malloc_in_use_bytes": proc.get("malloc_in_use_bytes"),
            "malloc_free_bytes": proc.get("malloc_free_bytes"), "python_blocks": proc.get("python_blocks"),
            "agents_seen": len(st.get("agents_seen") or {}), "memory_trims": t.get("memory_trims"),
            "agents_forgotten": t.get("agents_forgotten"),
            "state_dir_bytes": dir_bytes(state), "state_held_bytes": t.get("state_store_held_bytes"),
            "journal_batches": t.get("state_store_journal_batches"), "hellos": t.get("state_store_hellos"),
            "jobs_held": t.get("jobs_held"), "jobs_pruned": t.get("jobs_pruned"),
            "series_held": t.get("series_held"), "event_log_bytes": (st.get("event_log") or {}).get("bytes"),
            "refused": {k[len("refused_"):]: v for k, v in t.items() if k.startswith("refused_") and v}}


def quarters(samples: list[dict[str, Any]], load: Load, total: int) -> list[dict[str, Any]]:
    out = []
    for q in range(4):
        lo, hi = q * total / 4, (q + 1) * total / 4
        ss = ([s for s in samples if lo < s["jobs_done"] <= hi]
              or [s for s in samples if s["jobs_done"] <= hi][-1:])
        adm = sorted(d for n, d in load.admit_s if lo < n <= hi and n not in load.during_restart)

        def med(key: str, ss: list[dict[str, Any]] = ss) -> float | None:
            xs = [s[key] for s in ss if isinstance(s.get(key), int | float)]
            return statistics.median(xs) if xs else None

        p50 = round(1e3 * adm[len(adm) // 2], 1) if adm else None
        p99 = round(1e3 * adm[min(len(adm) - 1, int(0.99 * len(adm)))], 1) if adm else None
        out.append({"jobs": f"{int(lo)}-{int(hi)}", "samples": len(ss), "rss_mb": _mb(med("rss_bytes")),
                    "jobs_waiting_on_a_restart": sum(1 for n in load.during_restart if lo < n <= hi),
                    "state_dir_mb": _mb(med("state_dir_bytes")),
                    "state_held_mb": _mb(med("state_held_bytes")), "jobs_held": med("jobs_held"),
                    "hellos_kept": med("hellos"), "admit_p50_ms": p50, "admit_p99_ms": p99,
                    "malloc_in_use_mb": _mb(med("malloc_in_use_bytes")),
                    "malloc_free_mb": _mb(med("malloc_free_bytes")), "python_blocks": med("python_blocks"),
                    "agents_seen": med("agents_seen")})
    return out


def held_trend(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """RSS once the jobs held have reached their plateau (95% of the most held): its least-squares slope
    (MB per minute), its range around its median (%), and the malloc figures' slopes alike."""
    most = max((s["jobs_held"] or 0 for s in samples), default=0)
    ss = [s for s in samples if most and (s["jobs_held"] or 0) >= 0.95 * most]
    ss = ss[next((i for i, s in enumerate(ss) if s["jobs_held"] >= 0.95 * most), 0):]
    if len(ss) < 3 or ss[-1]["t"] - ss[0]["t"] < 60:
        return None

    def slope(key: str) -> float | None:
        pts = [(s["t"], s[key]) for s in ss if isinstance(s.get(key), int | float)]
        if len(pts) < 3:
            return None
        mt, mv = statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts)
        den = sum((t - mt) ** 2 for t, _ in pts)
        return round(sum((t - mt) * (v - mv) for t, v in pts) / den * 60 / 1e6, 2) if den else None

    rss = [s["rss_bytes"] for s in ss]
    med = statistics.median(rss)
    return {"from_jobs_done": ss[0]["jobs_done"], "minutes": round((ss[-1]["t"] - ss[0]["t"]) / 60, 1),
            "rss_mb_median": _mb(med), "rss_range_pct": [round(100 * (min(rss) / med - 1), 1),
                                                          round(100 * (max(rss) / med - 1), 1)],
            "rss_mb_per_min": slope("rss_bytes"), "malloc_in_use_mb_per_min": slope("malloc_in_use_bytes"),
            "malloc_free_mb_per_min": slope("malloc_free_bytes")}


def _mb(v: float | None) -> float | None:
    return round(v / 1e6, 1) if v is not None else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000, help="short jobs over the run (default: %(default)s)")
    ap.add_argument("--agents", type=int, default=100,
                    help="agents (nodes) running them (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=20, help="step records per job (default: %(default)s)")
    ap.add_argument("--restarts", type=int, default=3, help="aggregator restarts (default: %(default)s)")
    ap.add_argument("--sample-s", type=float, default=2.0,
                    help="seconds between samples (default: %(default)s)")
    ap.add_argument("--flat-ratio", type=float, default=1.5,
                    help="last quarter within this ratio of the first counts as flat (default: %(default)s)")
    ap.add_argument("--out",
                    help="folder for the state dir and the aggregator's output (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--aggregator-arg", action="append", default=[], metavar="ARG",
                    help="extra aggregator argument (repeatable), e.g. --aggregator-arg=--state-max-mib=64")
    ap.add_argument("--churn", action="store_true",
                    help="issue 54's churn instead: the default job and agent retention (the held jobs reach "
                    "the quota of one identity, then each new job prunes the one that ended first), each "
                    "job from an agent id of its own (a job's sidecar) sending --series host series, "
                    "--jobs-per-s of them; with --minutes, --jobs is what fits in them")
    ap.add_argument("--jobs-per-s", type=float, default=3.0,
                    help="--churn: jobs started per second, all agents together (default: %(default)s)")
    ap.add_argument("--minutes", type=float,
                    help="--churn: run this long (--jobs = minutes x 60 x --jobs-per-s)")
    ap.add_argument("--node-agents", action="store_true",
                    help="--churn: each job from its node's agent id (the same ids all along), not its own")
    ap.add_argument("--series", type=int, default=25,
                    help="--churn: host series each job's agent sends (default: %(default)s)")
    a = ap.parse_args(argv)
    if a.churn and a.minutes:
        a.jobs = max(a.agents, round(a.minutes * 60 * a.jobs_per_s))
    if a.churn and a.jobs_per_s <= 0:
        ap.error("--jobs-per-s must be > 0")
    if a.jobs < 1 or a.agents < 1 or a.steps < 1 or a.restarts < 0 or a.agents > a.jobs:
        ap.error("--jobs, --agents and --steps must be positive, --agents at most --jobs, --restarts >= 0")
    # A restart ends every stream: each agent says so once per reconnect, which is not news here.
    logging.getLogger("perfd.transport.client").setLevel(logging.ERROR)
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="perfd-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    state = out / "state"
    short = [] if a.churn else ["--job-retention", "5", "--agent-retention", "10"]
    agg = Aggregator(out, ["--no-rules", "--rules-interval", "0.5", "--state-dir", str(state),
                           "--job-stale-after", "1", *short, *a.aggregator_arg])
    shape = (Shape(a.steps, sidecar=not a.node_agents, series=a.series, every_s=1.0 / a.jobs_per_s) if a.churn
             else Shape(a.steps))
    agg.start()
    load, samples = Load(), []
    per_agent = [a.jobs // a.agents + (1 if k < a.jobs % a.agents else 0) for k in range(a.agents)]
    marks = [a.jobs * (i + 1) // (a.restarts + 1) for i in range(a.restarts)]
    t0 = time.monotonic()

    async def run() -> None:
        gate = asyncio.Event()
        gate.set()
        # One before any job: the first quarter has a sample however fast its jobs go.
        samples.append(await asyncio.to_thread(sample, agg, state, load))
        agents = [asyncio.create_task(agent(k, per_agent[k], shape, agg, load, gate, a.agents))
                  for k in range(a.agents)]
        next_sample = 0.0
        while not all(t.done() for t in agents):
            await asyncio.sleep(0.2)
            if marks and load.jobs_done >= marks[0]:
                marks.pop(0)
                gate.clear()
                samples.append(await asyncio.to_thread(sample, agg, state, load))
                load.restarting.append((time.monotonic(), float("inf")))
                await asyncio.to_thread(agg.restart, len(agg.restarts) % 2 == 0)
                load.restarting[-1] = (load.restarting[-1][0], time.monotonic())
                gate.set()
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + a.sample_s
                samples.append(await asyncio.to_thread(sample, agg, state, load))
        for t in agents:
            t.result()
        samples.append(await asyncio.to_thread(sample, agg, state, load))

    try:
        asyncio.run(run())
    finally:
        agg.stop()
    took = time.monotonic() - t0
    qs = quarters(samples, load, a.jobs)
    first, last = qs[0], qs[-1]
    flat = {k: (last[k] / first[k] <= a.flat_ratio if first[k] and last[k] is not None else None)
            for k in ("rss_mb", "state_dir_mb", "state_held_mb", "admit_p50_ms")}
    refused = samples[-1]["refused"]
    result = {"jobs": a.jobs, "agents": a.agents, "steps_per_job": a.steps, "seconds": round(took, 1),
              "jobs_per_s": round(a.jobs / took, 1), "jobs_not_acknowledged": load.failed,
              "refused_at_the_end": refused, "quarters": qs, "restarts": agg.restarts, "flat": flat,
              "final": samples[-1], "out": str(out), "held_trend": held_trend(samples)}
    (out / "samples.json").write_text(json.dumps(samples))
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"soak: {a.jobs} jobs from {a.agents} agents in {took:.0f} s ({result['jobs_per_s']} jobs/s), "
              f"{len(agg.restarts)} restarts; not acknowledged: {load.failed}; refusals: {refused or 'none'}")
        print(f"{'jobs':>12} {'RSS MB':>8} {'state dir MB':>13} {'state held MB':>14} {'jobs held':>10} "
              f"{'Hellos':>7} {'admit p50 ms':>13} {'p99 ms':>8}")
        for q in qs:
            print(f"{q['jobs']:>12} {q['rss_mb']!s:>8} {q['state_dir_mb']!s:>13} {q['state_held_mb']!s:>14} "
                  f"{q['jobs_held']!s:>10} {q['hellos_kept']!s:>7} {q['admit_p50_ms']!s:>13} "
                  f"{q['admit_p99_ms']!s:>8}")
        for r in agg.restarts:
            print(f"restart ({r['how']}): stopped in {r['stop_s']} s, listening again in "
                  f"{r['listening_again_s']} s, replayed {r['replayed']}")
        print(f"flat (last quarter within {a.flat_ratio}x of the first): {flat}")
        print(f"once the held jobs plateaued: {result['held_trend']}")
    return 0 if load.failed == 0 and not any(k.startswith(("jobs_cap", "jobs_quota")) for k in refused) else 1


if __name__ == "__main__":
    sys.exit(main())
