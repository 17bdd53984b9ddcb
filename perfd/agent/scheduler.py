"""Runs each collector on its own interval, in its own thread, and hands the output on.

Why a thread per collector: collectors call blocking libraries (NVML, psutil, file reads) and one
slow source (a hung NFS log, an NVML call stuck on a lost GPU) must not delay the others or the
network loop. Output goes to a bounded queue; when the queue is full the newest output is dropped
and counted (the sender is behind; the spool beyond it holds what was already accepted).
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from perfd.collectors.collector import Capabilities, Collected, Collector

log = logging.getLogger(__name__)


# Bucket upper bounds (s) of perfd_agent_collect_duration_seconds: an NVML pass of 8 GPUs takes
# ~1 ms, a log tail a few ms, a slow NVML call (energy, docs/design.md §3) ~4 ms per GPU.
COLLECT_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# The reasons the scheduler itself counts for any collector (perfd_agent_collector_errors_total)
# while the agent runs: the agent serves them from 0 for every collector, so that increase() sees
# the first one (a collector found unavailable at start counts once, ever). Each collector's own
# reasons (parse:..., fetch-failed:...) are open-ended and appear with their first count.
UNAVAILABLE, START_FAILED, COLLECT_RAISED = "unavailable", "start-failed", "collect-raised"
RUNNING_ERROR_REASONS = (UNAVAILABLE, START_FAILED, COLLECT_RAISED)


@dataclass
class CollectorState:
    collector: Collector
    interval_s: float
    capabilities: Capabilities | None = None
    runs: int = 0
    failures: int = 0  # collect() raised despite the contract: counted, the thread lives on
    last_duration_s: float = 0.0
    # Cumulative histogram of collect() durations: counts per COLLECT_BUCKETS_S bucket (+Inf last).
    duration_counts: list[int] = field(default_factory=lambda: [0] * (len(COLLECT_BUCKETS_S) + 1))
    duration_sum_s: float = 0.0
    samples: int = 0
    steps: int = 0
    events: int = 0
    thread: threading.Thread | None = None
    stopped: threading.Event = field(default_factory=threading.Event)


class Scheduler:
    """Owns the collectors' threads. Output is read with ``drain()`` by the sender."""

    def __init__(self, max_queued: int = 10_000) -> None:
        self.states: dict[str, CollectorState] = {}
        self._out: queue.Queue[tuple[str, Collected]] = queue.Queue(maxsize=max_queued)
        self.dropped_outputs = 0
        self._stop = threading.Event()

    def add(self, collector: Collector, interval_s: float | None = None) -> None:
        if collector.name in self.states:
            raise ValueError(f"collector {collector.name!r} added twice")
        self.states[collector.name] = CollectorState(
            collector, interval_s if interval_s is not None else collector.default_interval_s)

    def start(self) -> None:
        """Probe every collector once, start the available ones. Never raises for a collector."""
        for name, st in self.states.items():
            try:
                st.capabilities = st.collector.probe()
            except Exception as exc:  # a broken probe is the collector's bug: report, go on
                st.capabilities = Capabilities(False, f"probe failed: {exc!r}")
            if not st.capabilities.available:
                log.warning("collector %s unavailable: %s", name, st.capabilities.reason)
                st.collector.count_error(UNAVAILABLE, st.capabilities.reason)
                continue
            try:
                st.collector.start()
            except Exception as exc:
                st.capabilities = Capabilities(False, f"start failed: {exc!r}")
                st.collector.count_error(START_FAILED, repr(exc))
                continue
            log.info("collector %s started every %.3gs (%s)", name, st.interval_s,
                     st.capabilities.features)
            st.thread = threading.Thread(target=self._loop, args=(st,), name=f"collector-{name}",
                                         daemon=True)
            st.thread.start()

    def _loop(self, st: CollectorState) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                out = st.collector.collect(time.time())
            except Exception as exc:  # contract says never raise; if it does, count and go on
                st.failures += 1
                st.collector.count_error(COLLECT_RAISED, repr(exc))
                out = Collected()
            st.runs += 1
            st.last_duration_s = d = time.monotonic() - t0
            st.duration_counts[bisect.bisect_left(COLLECT_BUCKETS_S, d)] += 1
            st.duration_sum_s += d
            if out.samples or out.steps or out.events or out.job_info or out.collectives:
                st.samples += len(out.samples)
                st.steps += len(out.steps)
                st.events += len(out.events)
                try:
                    self._out.put_nowait((st.collector.name, out))
                except queue.Full:
                    self.dropped_outputs += 1
            # Fixed-rate schedule; if a collect overran, skip the missed ticks instead of bursting.
            next_t += st.interval_s
            now = time.monotonic()
            if next_t < now:
                next_t = now + st.interval_s
            self._stop.wait(next_t - now)
        st.stopped.set()

    def drain(self, max_items: int = 100_000) -> list[tuple[str, Collected]]:
        items: list[tuple[str, Collected]] = []
        while len(items) < max_items:
            try:
                items.append(self._out.get_nowait())
            except queue.Empty:
                break
        return items

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every collector, waiting at most ``timeout_s`` in all (not per collector)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for st in self.states.values():
            if st.thread is not None:
                st.thread.join(max(0.0, deadline - time.monotonic()))
                if st.thread.is_alive():  # stuck in a collect: do not flush under its feet
                    st.collector.count_error("stop-timeout", f"collect still running after {timeout_s}s")
                else:
                    try:
                        out = st.collector.flush(time.time())
                    except Exception as exc:
                        st.collector.count_error("flush-raised", repr(exc))
                        out = Collected()
                    if out.samples or out.steps or out.events or out.job_info or out.collectives:
                        try:
                            self._out.put_nowait((st.collector.name, out))
                        except queue.Full:
                            self.dropped_outputs += 1
            try:
                st.collector.stop()
            except Exception as exc:
                st.collector.count_error("stop-failed", repr(exc))
