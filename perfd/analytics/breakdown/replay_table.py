"""What a launch-by-launch replay of a captured step says (perfd.capture.step_replay computes it; the
remedies read it through perfd.analytics.advice.replay_gains): the changes it applies and the step
time it gives for each combination of them, over a grid of host scales. Plain data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perfd.analytics.common import TextEnum
from perfd.core.typed import numbers, obj

# --- the replay's model (perfd.capture.step_replay): why each constant is what it is ---------------------
# a launch's host call to its kernel's earliest start (H100/H200 traces: 3-6 µs)
LAUNCH_LATENCY_NS = 4000.0
# Host scales replayed: the profiled host is PROFILED_HOST; the job's own is faster (0.4-0.9 on the H200
# runs).
PROFILED_HOST = 1.0
SCALES: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, PROFILED_HOST, 1.1)
# Twice the micro-batch: a kernel of the forward-backward phase takes this many times longer (work
# scales with the rows; GEMMs on more rows gain a little efficiency). The two H200 jobs of the third plan
# A/B (4k to 8k rows a micro-batch) stepped as the replay at 1.9-2.0 says:
# docs/evidence/entries/33-issue-53-third-h200-a-b-the-launch-by-launch-replay-plan-h20.md.
MICROBATCH_DEVICE = (2.0, 1.9)  # (lo: saves less, hi: saves more)
# CUDA graphs: the host time of a graphed launch that remains (one graph launch a layer replaces a
# layer's launches; the replay's input copies and the graph breaks keep some of it).
GRAPHED_HOST = (0.35, 0.1)
# No attention dropout: its kernels go; of the host time before each, this much stays (the op's
# dispatch runs and returns its input).
DROPOUT_HOST = (1.0, 0.3)
# No activation checkpointing: the forward's ops the backward ran again (perfd.analytics.breakdown
# .recompute_seen) do not run, their kernels nor their dispatch. Of the host time before each, the low end
# keeps all (the GPU's side alone: what else the backward's host does in their place no trace shows), the
# high end none.
RECOMPUTE_HOST = (1.0, 0.0)
# A DataLoader without workers makes each batch on the training thread (its fetch: the host inside
# ``enumerate(DataLoader)``); with workers the thread only takes a made batch from their queue. Of the
# fetch's host time this much stays on the thread (lo: saves less, hi: saves more): at the low end a
# quarter (the batch unpickled from the workers' queue, its copy to pinned memory; a fetch that is only a
# slice of a tensor in memory stays about what it was), at the high end none. On the H200 recordings the
# workers' change took back 0.75 (run_clm.py: 30.3 ms of fetch a step, 23 ms measured) and 1.2-1.3
# (torchtitan: 40 ms a step over its two complete steps, 47-53 measured) of the fetch.
DATA_HOST = (0.25, 0.0)
# torch.compile fuses an eager model's elementwise kernels (perfd.capture.step_replay.fusable): of their
# launches this many remain, and of their device time this much. nanoGPT's compiled H200 recording
# (tests/data/loops) launches 913 elementwise kernels a step in its forward-backward phase (Inductor's,
# and the fills its regions launch), 19 a layer and micro-batch; the eager Llama of run_clm.py 5,859 (its
# RMSNorm ~21 kernels a norm, the rotary, autocast's casts), 122 a layer and micro-batch. A Llama layer
# has more to fuse than GPT-2's (the rotary, the norm's fp32 upcast), up to ~1.5x the kernels: 0.15-0.25
# of the eager ones; the low end 0.3 for graph breaks left eager.
FUSED_LAUNCHES = (0.3, 0.15)  # (lo: saves less, hi: saves more)
# nanoGPT's elementwise kernels take 31.4 ms a step, 21.6 but its loss's, for 64k rows; the eager Llama's
# 111 ms for 32k rows of the same width (768): 0.1 of them a row. Up to 0.35 for what a Llama layer adds
# (the rotary) and graph breaks.
FUSED_DEVICE = (0.35, 0.1)
# The host's time a launch of the forward-backward phase once compiled: the compiled graph launches its
# kernels without the eager ops' Python. nanoGPT's compiled recording: 80.2 ms of the profiled host's
# dispatch a step for 2,264 launches, 35 µs each, where the eager Llama's takes 46 µs (366 ms for 8,022)
# and the eager Lightning demo's 59 µs, on the same H200 under the same profiler. The fused replay's low
# end keeps the eager cost a launch; its high end takes this one where it is cheaper.
COMPILED_LAUNCH_NS = 35_000.0


class Change(TextEnum):
    """A change the replay applies (each remedy that acts on the host's pace names the one it is)."""

    TIMERS = "timers"  # the bare device synchronisations of the forward-backward phase go
    MICROBATCH = "microbatch"  # half the micro-batches a step, each twice the size
    GRAPHS = "graphs"  # the layers' launches replayed from CUDA graphs
    DROPOUT = "dropout"  # attention dropout off: its kernels go
    FUSED = "fused"  # torch.compile: the elementwise kernels fused, fewer launches and less device time
    RECOMPUTE = "recompute"  # no activation checkpointing: the recomputed forward's launches go
    DATA = "data"  # the batch made by DataLoader workers: the training thread's fetches go


@dataclass(frozen=True)
class ReplayTable:
    """Step ms per host scale: ``as_is`` (the trace replayed unchanged) and, per combination of
    changes (key: their values sorted, joined by "+"), the (lo, hi) variants."""

    scales: tuple[float, ...]
    as_is: tuple[float, ...]
    changed: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    traced_ms: float = 0.0  # the trace's own step (host span over the complete steps)
    microbatches: int | None = None
    # what the profiled host works a step (its time between one launch or sync and the next, its waits
    # left out) and what the device runs a step (the replayed activities' durations): the host's margin
    # is how far the first is under the second (0: not known)
    host_ms: float = 0.0
    device_ms: float = 0.0
    # a step's launches in the forward-backward phase, the elementwise ones torch.compile would fuse among
    # them and their device ms (Change.FUSED; 0: none, or a table kept before they were counted)
    launches: float = 0.0
    fusable: float = 0.0
    fusable_ms: float = 0.0
    # the training thread's time a step inside an in-process DataLoader's fetches (Change.DATA; 0: none)
    fetch_ms: float = 0.0

    @property
    def unmodelled_ms(self) -> float:
        """The trace's own step less the replay's at the profiled host's speed: time a step spends that
        the replay does not model (0 without the trace's step). It is not the host's, so it is no
        measure of the host's speed."""
        if self.traced_ms <= 0 or not self.scales[0] <= PROFILED_HOST <= self.scales[-1]:
            return 0.0
        j = next(i for i, x in enumerate(self.scales) if x >= PROFILED_HOST)
        if self.scales[j] == PROFILED_HOST or j == 0:
            at = self.as_is[j]
        else:
            x0, x1, y0, y1 = self.scales[j - 1], self.scales[j], self.as_is[j - 1], self.as_is[j]
            at = y0 + (y1 - y0) * (PROFILED_HOST - x0) / (x1 - x0)
        return self.traced_ms - at

    @staticmethod
    def key(changes: Iterable[Change]) -> str:
        return "+".join(sorted(c.value for c in changes))

    @property
    def host_of_device(self) -> float | None:
        """The profiled host's work a step over the device's: near 1 or above, the host sets the pace or
        nearly (a stall of the host's shows as the GPU's idle); None where either is not known."""
        return self.host_ms / self.device_ms if self.host_ms > 0 and self.device_ms > 0 else None

    @staticmethod
    def of(scales: tuple[float, ...], as_is: Iterable[float],
           changed: Mapping[str, tuple[Iterable[float], Iterable[float]]], traced_ms: float,
           microbatches: int | None, host_ms: float = 0.0, device_ms: float = 0.0,
           fused: tuple[float, float, float] = (0.0, 0.0, 0.0), fetch_ms: float = 0.0) -> ReplayTable:
        """The table as a replay measured it, its times in ms to the µs (far below any gain the table is
        read for): as it is kept and sent, so that the offline reading of a trace and the live one of
        its event read the same figures. ``fused``: (launches, fusable, fusable_ms)."""
        launches, fusable, fusable_ms = fused
        return ReplayTable(scales, _us(as_is), {k: (_us(lo), _us(hi)) for k, (lo, hi) in changed.items()},
                           round(traced_ms, 3), microbatches, round(host_ms, 3), round(device_ms, 3),
                           round(launches, 1), round(fusable, 1), round(fusable_ms, 3), round(fetch_ms, 3))

    def to_json(self) -> dict[str, object]:
        return {"scales": list(self.scales), "as_is": list(_us(self.as_is)),
                "traced_ms": round(self.traced_ms, 3),
                "microbatches": self.microbatches,
                "host_ms": self.host_ms, "device_ms": self.device_ms, "launches": self.launches,
                "fusable": self.fusable, "fusable_ms": self.fusable_ms, "fetch_ms": self.fetch_ms,
                "changed": {k: [list(_us(lo)), list(_us(hi))] for k, (lo, hi) in self.changed.items()}}

    @staticmethod
    def from_json(d: object) -> ReplayTable | None:
        if not isinstance(d, Mapping):
            return None
        try:
            scales = numbers(d["scales"])
            as_is = numbers(d["as_is"])
            changed = {str(k): (numbers(v[0]), numbers(v[1])) for k, v in obj(d.get("changed")).items()
                       if isinstance(v, list)}
            mb = d.get("microbatches")
            if len(as_is) != len(scales) or any(len(v[0]) != len(scales) or len(v[1]) != len(scales)
                                                for v in changed.values()):
                return None
            return ReplayTable(scales, as_is, changed, float(d.get("traced_ms") or 0.0),
                               int(mb) if isinstance(mb, int) else None, float(d.get("host_ms") or 0.0),
                               float(d.get("device_ms") or 0.0), float(d.get("launches") or 0.0),
                               float(d.get("fusable") or 0.0), float(d.get("fusable_ms") or 0.0),
                               float(d.get("fetch_ms") or 0.0))
        except (KeyError, TypeError, ValueError, IndexError):
            return None


def _us(xs: Iterable[float]) -> tuple[float, ...]:
    return tuple(round(x, 3) for x in xs)
