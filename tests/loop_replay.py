"""A plain PyTorch loop replayed through the aggregator in the order things happened: its own clock
as the step hook sends it (one record per step: data wait, then compute), the NVML frames of its
GPU as the agent's collector sends them, the GPU process list naming the loop's process (as the
agent's hook placement does: ``rank_from`` "hook device"), and the host observations of its process
(collectors/ranks), on a replay clock. The aggregator analyses the job every ``every_s`` of replay
time, as its refresher does.

Recordings (all real): the loop's clock ``tests/data/hook/plain_loop_h100/*.json.gz``
(tests/gpu/plain_loop_live.py on an H100); NVML frames of an H100 ``tests/data/incidents/
cotenant_h100/nvml.jsonl.gz`` (a training job's GPU, 0.5 s apart) and ``collectors/nvml/data/
h100_phases.jsonl`` (an H100 through idle, matmul, copy, launch, h2d phases); the host observation
of the loop's process on the H100 (docs/evidence/plain_loop_h100/run3_after_issue47.json).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfd.aggregator.state import AggregatorState
from perfd.core import events
from perfd.core.clock import ManualClock
from perfd.core.model import HOOK_COMPUTE, HOOK_DATA_WAIT, JobInfo, Provenance, StepRecord, TimerValue

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "tests" / "data" / "hook" / "plain_loop_h100"
TRAINING_NVML = ROOT / "tests" / "data" / "incidents" / "cotenant_h100" / "nvml.jsonl.gz"
PHASES_NVML = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
RUN3 = ROOT / "docs" / "evidence" / "plain_loop_h100" / "run3_after_issue47.json"
NODE = "h100"
AGENT = "agent-a"


def loop(name: str = "data_steps.json.gz") -> dict[str, Any]:
    with gzip.open(LOOPS / name, "rt") as f:
        return dict(json.load(f))


def nvml_frames(path: Path = TRAINING_NVML) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [d for line in f if (d := json.loads(line))["type"] == "collect"]


def run3_host() -> dict[str, Any]:
    """The loop's process as collectors/ranks saw it on the H100 (run 3, during its slow phase)."""
    d = json.loads(RUN3.read_text())["results"]["data"]["incidents"][0]["evidence"]["gpu"]["0"]["host"]
    return {k: v for k, v in d.items() if k not in ("node", "agent", "arrived_at")}


@dataclass
class Feed:
    """What the agent sends, in time order once sorted: (time, what, item)."""

    items: list[tuple[float, str, Any]] = field(default_factory=list)

    def steps(self, job: str, rows: Sequence[Sequence[Any]], t0: float, pid: int,
              cuda: bool = True) -> None:
        """The loop's clock (rows: iteration, begin, data ready, end, ...) as the hook's records."""
        for i, tb, td, te, *_ in rows:
            d, s = (td - tb) * 1e3, (te - tb) * 1e3
            timers = {HOOK_DATA_WAIT: TimerValue(d, d, {0: d}),
                      HOOK_COMPUTE: TimerValue(s - d, s - d, {0: s - d})}
            rec = StepRecord(job=job, iteration=int(i), rank=0, end_time=t0 + te, step_time_ms=s, interval=1,
                             timers=timers, source=Provenance("hook", f"rank0:pid{pid}"),
                             fields={"timing": "cuda" if cuda else "host", "pid": str(pid)})
            self.items.append((t0 + te, "step", rec))

    def nvml(self, frames: Sequence[dict[str, Any]], t_from: float, t_to: float,
             every_s: float = 0.5) -> None:
        """``frames``' samples, one every ``every_s`` from ``t_from`` to ``t_to`` (cycled)."""
        t, n = t_from, 0
        while t < t_to and frames:
            self.items.append((t, "nvml", frames[n % len(frames)]))
            t, n = t + every_s, n + 1

    def gpu_process(self, t: float, job: str, pid: int, uuid: str) -> None:
        """The GPU's process list with the loop's process placed by its hook (perfd.agent.hook_gpus)."""
        self.items.append((t, "event", {
            "kind": events.GPU_PROCESSES.name, "severity": "info", "time": t,
            "labels": {"gpu": "0", "uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "node": NODE},
            "text": "1 compute process(es) on GPU 0 (changed)", "changed": True,
            "payload": [{"pid": pid, "rank": 0, "job": job, "rank_from": "hook device"}]}))

    def host(self, t: float, job: str, obs: dict[str, Any]) -> None:
        self.items.append((t, "event", {
            "kind": events.RANK_PROCESSES.name, "severity": "info", "time": t, "job": job,
            "labels": {"node": NODE}, "text": "",
            "payload": {"job": job, "interval_s": 1.0, "ranks": [{**obs, "observed_at": t}],
                        "node": {"swap_in_bytes_per_second": 0.0}}}))

    def job_info(self, t: float, job: str, info: JobInfo) -> None:
        self.items.append((t, "job_info", (job, info)))


def replay(feed: Feed, job: str, every_s: float = 2.0, tail_s: float = 30.0
           ) -> Iterator[tuple[float, AggregatorState]]:
    """Feed everything in time order, analysing the job every ``every_s``; then ``tail_s`` after the
    last item (the job has ended), once more. Yields (replay time, state) after each analysis. The
    state's clock is the replay's (perfd.core.clock.ManualClock)."""
    clock = ManualClock(0.0)
    st = AggregatorState(min_recompute_s=0.0, clock=clock)
    st.hello(AGENT, [job])
    items = sorted(feed.items, key=lambda x: x[0])
    defs: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    next_at = items[0][0]
    for t, what, item in items:
        clock.set(t)
        if what == "step":
            st.ingest_steps(AGENT, [item])
        elif what == "event":
            st.ingest_events(AGENT, [item])
        elif what == "job_info":
            st.ingest_job_info(AGENT, item[0], item[1])
        else:
            new: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {}
            ids, vals = [], []
            for s in item["samples"]:
                key = (s["name"], tuple(sorted({**s["labels"], "node": NODE}.items())))
                if key not in defs:
                    defs[key] = len(defs)
                    new[defs[key]] = key
                ids.append(defs[key])
                vals.append(float(s["value"]))
            st.ingest_samples(AGENT, new, ids, [int(t * 1e9)] * len(ids), vals)
        if t >= next_at:
            st.analysis(job, force=True)
            next_at = t + every_s
            yield t, st
    clock.set(items[-1][0] + tail_s)
    st.analysis(job, force=True)
    yield clock.time(), st
