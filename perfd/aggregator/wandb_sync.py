"""The aggregator's W&B task: every few seconds, each job's newly analysed iterations go to its W&B
run (perfd.exporters.wandb), and each finished capture's report is attached once.

All W&B calls run in a worker thread (``asyncio.to_thread``): ``wandb.init`` starts a service
process and may take a second, and ingest must never wait for it. A failing export is logged and
retried on the next round; it never stops the aggregator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from perfd.aggregator.state import AggregatorState
from perfd.analytics.attribution import place_ranks
from perfd.exporters.wandb import WandbExporter, node_metrics

log = logging.getLogger(__name__)

CapturesSource = Callable[[], Iterable[Mapping[str, Any]]]
DONE = ("finished", "failed")


class WandbSync:
    def __init__(self, state: AggregatorState, exporter: WandbExporter,
                 captures: CapturesSource | None = None, interval_s: float = 10.0) -> None:
        self.state = state
        self.exporter = exporter
        self.captures = captures
        self.interval_s = interval_s
        self.rounds = 0
        self.errors = 0
        self._captures_done: set[str] = set()

    def sync_once(self, force: bool = False) -> int:
        """One round; returns the number of W&B history rows written. ``force`` re-analyses jobs
        with new records even within the state's recompute interval (the last round does)."""
        rows = 0
        for job in self.state.job_names():
            analysis = self.state.analysis(job, force=force)
            if analysis is None or not analysis.iterations:
                continue
            last = self.exporter.last_step(job)
            new = [it.to_json() for it in analysis.iterations if last is None or it.iteration > last]
            if new:
                rows += self.exporter.log_analysis(job, {"job": analysis.job, "iterations": new,
                                                         "summary": analysis.summary},
                                                   node_metrics(self._gpu_values(job)))
        for cap in (self.captures() if self.captures else ()):
            cid = str(cap.get("id") or "")
            if cid and cap.get("status") in DONE and cid not in self._captures_done:
                self.exporter.log_capture(str(cap.get("job") or "unknown"), cap)
                self._captures_done.add(cid)
        self.rounds += 1
        return rows

    def _gpu_values(self, job: str) -> dict[str, dict[str, float]]:
        """W&B label -> the latest values of one GPU of the job's agents: ``rank=N`` for the GPU a
        rank runs on (placement from the NVML process lists), ``node=X,gpu=I`` for every other GPU
        (no rank placed on it: the process environment was not visible, the job is not started
        yet, or the GPU is idle), so a job whose ranks cannot be placed still gets its GPU charts."""
        procs, values, _thr = self.state.gpu_view(job)
        placed = place_ranks(procs, job=job)
        out = {f"rank={r}": dict(values.get((p.node, p.gpu), {})) for r, p in placed.items()}
        taken = {(p.node, p.gpu) for p in placed.values()}
        for (node, gpu), vals in sorted(values.items()):
            if (node, gpu) not in taken and vals:
                out[f"node={node},gpu={gpu}"] = dict(vals)
        return out

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.sync_once)
            except Exception:  # W&B down, disk full, a bug: logged, retried next round
                self.errors += 1
                log.exception("W&B export failed (retried in %.0fs)", self.interval_s)

    async def close(self) -> None:
        """A last round (what arrived since the previous one), then every run is finished."""
        try:
            await asyncio.to_thread(self.sync_once, True)
        except Exception:
            log.exception("last W&B export failed")
        await asyncio.to_thread(self.exporter.finish)
