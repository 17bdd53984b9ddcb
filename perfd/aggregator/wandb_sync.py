"""The aggregator's W&B task: every few seconds, each job's newly analysed iterations go to its W&B
run (perfd.exporters.wandb), and each finished capture's report is attached once.

All W&B calls run in a worker thread (``asyncio.to_thread``): ``wandb.init`` starts a service
process and may take a second, and ingest must never wait for it. A failing export is logged (the
traceback once per kind of failure, then a line with the count) and retried on the next round; it
never stops the aggregator.

GPU values per row: the aggregator holds only each GPU series' latest value, and an export round
(--wandb-interval, 10 s) covers many iterations. Between rounds the task samples each job's GPU
values whenever the job has stepped (every GPU_SAMPLE_S, as often as the agents forward them), and
each exported iteration carries the sample taken once it had arrived: every row of a job with GPU
data has its GPU keys (once only the newest row of each round had them, 3 of 40 steps).

The task reads each job's snapshot (perfd.aggregator.snapshot) and publishes it to its sink
(:class:`WandbSink`, a SnapshotSink): the snapshot's placement names each rank's GPU, and the sink
hands the exporter the analysis' typed job block, rows and summary (perfd.exporters.wandb), which
turns them into W&B's payload, W&B being an edge.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from perfd.aggregator.nodes import GpuKey
from perfd.aggregator.snapshot import Analysed, JobSnapshot, SnapshotSink
from perfd.aggregator.state_readers import JobReader
from perfd.analytics.incidents.attribution import RankPlacement
from perfd.analytics.steps.iteration import IterationResult
from perfd.core.model import CaptureStatus
from perfd.exporters.wandb import WandbExporter, node_metrics

log = logging.getLogger(__name__)

CapturesSource = Callable[[], Iterable[Mapping[str, Any]]]
DONE = frozenset(s.value for s in CaptureStatus if s.ended)  # a capture record's JSON status
# How often the jobs' GPU values are sampled between export rounds: the agents forward each node
# series every aggregator_sample_interval_s (2 s), so sampling faster would repeat values.
GPU_SAMPLE_S = 2.0
# Samples held per job between rounds (a bound: a round every 10 s needs ~5).
MAX_GPU_SAMPLES = 512

# One GPU sample: (the job's newest iteration when it was taken, W&B key -> value).
GpuSample = tuple[int, dict[str, float]]


def gpu_labels(placed: Mapping[int, RankPlacement], values: Mapping[GpuKey, Mapping[str, float]]
               ) -> dict[str, dict[str, float]]:
    """W&B label -> the latest values of one GPU of the job's agents: ``rank=N`` for the GPU a
    rank runs on (the snapshot's placement, from the NVML process lists), ``node=X,gpu=I`` for every
    other GPU (no rank placed on it: the process environment was not visible, the job is not started
    yet, or the GPU is idle), so a job whose ranks cannot be placed still gets its GPU charts."""
    out = {f"rank={r}": dict(values.get((p.node, p.gpu), {})) for r, p in placed.items()}
    taken = {(p.node, p.gpu) for p in placed.values()}
    for (node, gpu), vals in sorted(values.items()):
        if (node, gpu) not in taken and vals:
            out[f"node={node},gpu={gpu}"] = dict(vals)
    return out


def _gpu_values(snap: JobSnapshot) -> dict[str, dict[str, float]]:
    _procs, values, _thr = snap.gpus(procs=False)
    return gpu_labels(snap.placed_ranks, values)


class WandbSink:
    """A job's snapshots to its W&B run: each publish logs the iterations of its analysis not logged
    yet, each with the GPU values sampled once it had arrived (:meth:`sample`)."""

    def __init__(self, exporter: WandbExporter) -> None:
        self.exporter = exporter
        self._gpu_samples: dict[str, list[GpuSample]] = {}

    def sample(self, snap: JobSnapshot) -> None:
        """Take the job's GPU values now if it has stepped since its last sample (an idle job adds
        nothing); what :meth:`publish` hands each iteration."""
        last = snap.overview.last_iteration
        if not isinstance(last, int):
            return
        held = self._gpu_samples.setdefault(snap.job, [])
        if held and held[-1][0] >= last:
            return
        held.append((last, node_metrics(_gpu_values(snap))))
        del held[:-MAX_GPU_SAMPLES]

    def publish(self, snapshot: JobSnapshot) -> int:
        """Log the snapshot's newly analysed iterations; returns the W&B history rows written."""
        job, analysis = snapshot.job, snapshot.analysis
        if analysis is None or not analysis.iterations:
            return 0
        last = self.exporter.last_step(job)
        new = [it for it in analysis.iterations if last is None or it.iteration > last]
        if not new:
            return 0
        newest = max(it.iteration for it in new)
        now = node_metrics(_gpu_values(snapshot))
        return self.exporter.log_analysis(job, analysis.job, new, analysis.summary,
                                          extra_by_step=self._by_step(job, new, newest, now))

    def _by_step(self, job: str, new: list[IterationResult], newest: int,
                 now: dict[str, float]) -> dict[int, dict[str, float]]:
        """Each new iteration's GPU values: the first sample taken once it had arrived, else (it
        arrived after the last sample) the values now. Samples past ``newest`` stay for the next
        round (the analysis may lag the records a little)."""
        held = self._gpu_samples.get(job, [])
        out: dict[int, dict[str, float]] = {}
        for it in new:
            step = it.iteration
            vals = next((v for seen, v in held if seen >= step), now)
            if vals:
                out[step] = vals
        self._gpu_samples[job] = [s for s in held if s[0] > newest]
        return out


class WandbSync:
    def __init__(self, state: JobReader, exporter: WandbExporter,
                 captures: CapturesSource | None = None, interval_s: float = 10.0) -> None:
        self.state = state
        self.exporter = exporter
        self.sink = WandbSink(exporter)
        self.sinks: tuple[SnapshotSink, ...] = (self.sink,)
        self.captures = captures
        self.interval_s = interval_s
        self.rounds = 0
        self.errors = 0
        self._captures_done: set[str] = set()
        self._failures_seen: set[str] = set()
        # One round at a time, none after the last: a round on a worker thread runs on after its task
        # is cancelled at stop, and one still running (or not yet begun) when the runs were finished
        # logged to a run W&B had closed, or made a new one no stop would finish.
        self._round_lock = threading.Lock()
        self._closed = False

    def sample_gpus(self) -> None:
        """Each job's GPU values now, if it has stepped since its last sample (WandbSink.sample)."""
        for job in self.state.job_names():
            snap = self.state.snapshot(job)
            if snap is not None:
                self.sink.sample(snap)

    def sync_once(self, force: bool = False) -> int:
        """One round; returns the number of W&B history rows written. ``force`` re-analyses jobs
        with new records even within the state's recompute interval (the last round does)."""
        with self._round_lock:
            if self._closed:
                return 0
            rows = 0
            for job in self.state.job_names():
                snap = self.state.snapshot(job, Analysed.CURRENT, force=force)
                if snap is None:
                    continue
                for sink in self.sinks:
                    rows += sink.publish(snap)
            for cap in (self.captures() if self.captures else ()):
                cid = str(cap.get("id") or "")
                if cid and cap.get("status") in DONE and cid not in self._captures_done:
                    self.exporter.log_capture(str(cap.get("job") or "unknown"), cap)
                    self._captures_done.add(cid)
            self.rounds += 1
            return rows

    def _failed(self, what: str, exc: Exception) -> None:
        """A failed round: the traceback the first time this kind of failure happens, one line after
        (a disk that stays full must not print a traceback every round)."""
        self.errors += 1
        kind = f"{what}:{type(exc).__name__}:{exc}"
        if kind not in self._failures_seen:
            self._failures_seen.add(kind)
            log.exception("W&B %s failed (retried in %.0f s; the same failure is logged in one line "
                          "from now on)", what, self.interval_s)
        else:
            log.warning("W&B %s failed again: %s (%d failures)", what, exc, self.errors)

    def _guarded(self, what: str, work: Callable[[], object]) -> None:
        """``work`` on the worker thread, its failure counted and logged there: a round the stop's cancel
        left running still says how it ended (W&B down, disk full, a bug: retried next round)."""
        try:
            work()
        except Exception as exc:
            self._failed(what, exc)

    async def run(self) -> None:
        next_round = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, min(GPU_SAMPLE_S, next_round - time.monotonic())))
            if time.monotonic() < next_round:
                await asyncio.to_thread(self._guarded, "GPU sampling", self.sample_gpus)
                continue
            next_round = time.monotonic() + self.interval_s
            await asyncio.to_thread(self._guarded, "export", self.sync_once)

    def finish_job(self, job: str) -> None:
        """Finish ``job``'s run (the job pruned), after the round in flight: a round that read the job
        before its pruning and logged after this finish made it a second run, never finished."""
        with self._round_lock:
            self.exporter.finish(job)

    def _last_round(self) -> None:
        """After the round in flight, if any: what arrived since, then every run finished; no round
        after it."""
        try:
            self.sync_once(force=True)
        except Exception:
            log.exception("last W&B export failed")
        with self._round_lock:
            self._closed = True
            try:
                self.exporter.finish()
            except Exception:  # the aggregator's stop goes on
                log.exception("finishing the W&B runs failed")

    async def close(self) -> None:
        """A last round (what arrived since the previous one), then every run is finished."""
        await asyncio.to_thread(self._last_round)
