"""A DataLoader without workers makes each batch on the training thread: the replay (perfd.capture
.step_replay) keeps those fetches' host time at every host scale (the profiler records a few ops a ms
in them), and Change.DATA moves them to worker processes. Hand-built timelines whose answer is worked
out by hand, then the recorded H200 loops (tests/data/loops): the fetches read from the raw trace apart
from perfd, and what the remedy says on each, against the A/Bs applied on an H200
(docs/evidence/loops_ab5_h200, loops_ab3_h200)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from perfd.analytics.advice.capture_findings import diagnose_capture
from perfd.analytics.advice.plan import combined
from perfd.analytics.advice.remedies import FitContext, Framework, JobConfig, RemedyId, run_spread_ms
from perfd.analytics.advice.remedy_catalog import fit
from perfd.analytics.breakdown.budget import TimerShares
from perfd.analytics.breakdown.capture_budget import from_capture
from perfd.analytics.breakdown.job_facts import Loader, loader_kind
from perfd.analytics.breakdown.replay_table import DATA_HOST, Change, ReplayTable
from perfd.capture.analysis import training_fetches
from perfd.capture.ops import HostRange, RangeKind
from perfd.capture.step_replay import _LAYERS, _MB_START, Event, Timeline, _Inside, simulate
from tests.analytics.loop_recordings import HF, raw_gaps
from tests.trace_cache import analyze_chrome_trace

LOOPS = Path(__file__).resolve().parents[1] / "data" / "loops"
MS = 1e6


def _launch(gap_ms: float, dur_ms: float, fetch_ms: float = 0.0, flags: int = _LAYERS) -> Event:
    return Event(gap_ms * MS, 7, dur_ms * MS, flags, 0, fetch_ms * MS)


def test_a_fetch_is_the_jobs_time_at_every_host_speed() -> None:
    """Ten launches 1 ms apart (kernels 0.1 ms: host-bound) after a 5 ms fetch: at the profiled host's
    speed 15 ms and the last kernel; at half the speed the launches' Python halves, the fetch does not."""
    t = Timeline((_launch(1.0 + 5.0, 0.1, 5.0), *(_launch(1.0, 0.1) for _ in range(9))), 1, None)
    assert t.has(Change.DATA)
    assert simulate(t, 1.0) == pytest.approx(15.0 + 0.004 + 0.1)
    assert simulate(t, 0.5) == pytest.approx(5.0 + 5.0 + 0.004 + 0.1)


def test_workers_take_the_fetch_off_the_thread_in_a_host_bound_step_not_under_a_busy_gpu() -> None:
    """Host-bound, the whole fetch is the step's (× 1 − DATA_HOST back); where the GPU still runs 20 ms of
    queued work while the host fetches, the fetch was hidden under it and taking it away gives nothing:
    the GPU's idle under a fetch is not what a worker gives back, the host's place on the critical path
    is."""
    lo, hi = DATA_HOST
    bound = Timeline((_launch(6.0, 0.1, 5.0), *(_launch(1.0, 0.1) for _ in range(9))), 1, None)
    base = simulate(bound, 1.0)
    assert base - simulate(bound, 1.0, frozenset({Change.DATA})) == pytest.approx(5.0 * (1 - lo))
    assert base - simulate(bound, 1.0, frozenset({Change.DATA}), hi=True) == pytest.approx(5.0 * (1 - hi))
    hidden = Timeline((_launch(0.0, 20.0), _launch(6.0, 0.1, 5.0), *(_launch(1.0, 0.1) for _ in range(9))),
                      1, None)
    assert simulate(hidden, 1.0) == pytest.approx(simulate(hidden, 1.0, frozenset({Change.DATA}), hi=True))


def test_half_the_fetches_of_twice_the_rows_cost_between_the_same_and_half() -> None:
    """Four micro-batches, each fetched (2 ms) then 3 launches 1 ms apart (host-bound): twice the
    micro-batch keeps two micro-batches' launches; the fetches cost, at the low end, the four's time (the
    work is the rows'), at the high end two fetches' (the work is per fetch). Host-bound, the step is
    the host's work: the absorbed micro-batches' fetches stay in their place, the host's last work."""
    mb = [_launch(3.0, 0.1, 2.0, _LAYERS | _MB_START), _launch(1.0, 0.1), _launch(1.0, 0.1)]
    t = Timeline(tuple(mb * 4), 1, 4)
    assert simulate(t, 1.0) == pytest.approx(4 * (2.0 + 3.0) + 0.004 + 0.1)
    assert simulate(t, 1.0, frozenset({Change.MICROBATCH})) == pytest.approx(4 * 2.0 + 2 * 3.0)
    assert simulate(t, 1.0, frozenset({Change.MICROBATCH}), hi=True) == pytest.approx(2 * 2.0 + 2 * 3.0)


def test_the_table_keeps_the_fetches_a_step() -> None:
    t = ReplayTable.of((0.5, 1.0), (10.0, 20.0), {}, 21.0, None, fetch_ms=30.28341)
    back = ReplayTable.from_json(t.to_json())
    assert back == t and back.fetch_ms == 30.283
    old = {k: v for k, v in t.to_json().items() if k != "fetch_ms"}  # a table kept before fetches were
    kept = ReplayTable.from_json(old)
    assert kept is not None and kept.fetch_ms == 0.0 and not kept.changed


def test_torchdatas_stateful_iterators_are_loaders_too() -> None:
    """torchtitan's loader is torchdata's StatefulDataLoader: its iterators are named
    ``_StatefulSingleProcessDataLoaderIter`` / ``_StatefulMultiProcessingDataLoaderIter``."""
    assert loader_kind("enumerate(DataLoader)#_StatefulSingleProcessDataLoaderIter.__next__") \
        is Loader.SINGLE_PROCESS
    assert loader_kind("enumerate(DataLoader)#_StatefulMultiProcessingDataLoaderIter.__next__") \
        is Loader.MULTIPROCESSING
    assert loader_kind("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") is Loader.SINGLE_PROCESS
    assert loader_kind("aten::mm") is None


def _outer_fetches(name: str) -> float:
    """The raw trace's fetches per complete step, between torchtitan's own step marks (its
    OptimizersContainer's: the AdamW it steps marks its steps too), json alone."""
    with lzma.open(LOOPS / name / "trace.json.xz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    outer = sorted(e["ts"] for e in events if e.get("name") == "Optimizer.step#OptimizersContainer.step")
    fetch = sum(e["dur"] for e in events if str(e.get("name", "")).startswith("enumerate(DataLoader)")
                and outer[0] <= e["ts"] < outer[-1])
    return float(fetch) / 1e3 / (len(outer) - 1)


def _analysed(name: str, framework: Framework, step_ms: float, sd_ms: float
              ) -> tuple[ReplayTable, dict[str, tuple[float, float]]]:
    """The recording's replay table and the remedies' gains as `perfd analyze trace --framework F
    --job-step-ms STEP --job-step-sd-ms SD` makes them (the A/Bs' predictions), its trace parsed once for
    the session (tests.trace_cache)."""
    devices = analyze_chrome_trace(LOOPS / name / "trace.json.xz").devices
    d = diagnose_capture(devices, framework=framework, timers=TimerShares(step_ms=step_ms, step_sd_ms=sd_ms))
    table = devices[0].replay
    assert table is not None
    return table, {str(r.remedy): (r.gain_ms[0], r.gain_ms[1]) for r in d.recommendations if r.gain_ms}


@pytest.mark.slow
def test_the_trainers_fetches_are_the_raw_traces_and_its_workers_gain_is_measured() -> None:
    """run_clm.py (the Trainer, num_workers=0) makes a step's four batches on the training thread:
    30.3 ms a step by the raw trace. The replay keeps exactly those, and the data loader's gain is read
    from moving them off the thread: predicted at the first base of the H200 A/B (226.4 ms, SD 14.5)
    16.9-36.0 ms, measured 17.8 and 21.0 (docs/evidence/loops_ab5_h200; 22.7 and 23.0 on the third A/B,
    loops_ab3_h200), where the GPU's idle under the fetches alone gave −1 to 13.5."""
    table, gains = _analysed("hf_clm_h200", Framework.HF_TRAINER, 226.358, 14.548)
    fetch = raw_gaps(HF)["fetch"]
    assert table.fetch_ms == pytest.approx(fetch, rel=1e-3) and 30 < fetch < 31
    lo, hi = gains[RemedyId.DATA_LOADER.value]
    for measured in (17.8, 21.0, 22.7, 23.0):
        assert lo <= measured <= hi
    assert hi < fetch * (1 - DATA_HOST[1]) + 6.0  # never more than the fetches and the run-to-run spread


@pytest.mark.slow
def test_torchtitans_fetches_are_its_outer_steps_and_lightnings_too_small_to_name() -> None:
    """torchtitan (torchdata's stateful single-process iterator): 40.1 ms of fetches a step over its two
    complete steps (29.6 and 50.6 ms). Lightning's demo slices a tensor in memory (0.35 ms a step): no
    data-loader remedy (its workers slowed the step 1.6-3.7 ms when applied: loops_ab3_h200)."""
    table, gains = _analysed("torchtitan_h200", Framework.TORCHTITAN, 490.687, 27.535)
    assert table.fetch_ms == pytest.approx(_outer_fetches("torchtitan_h200"), rel=1e-3)
    assert 40 < table.fetch_ms < 40.2
    assert RemedyId.DATA_LOADER.value in gains
    table, gains = _analysed("lightning_h200", Framework.LIGHTNING, 15.37, 2.2)
    assert 0.3 < table.fetch_ms < 0.4
    assert RemedyId.DATA_LOADER.value not in gains


def test_nested_fetch_ranges_are_counted_once() -> None:
    """A fetch range inside another (a wrapped iterator's) and one overlapping it: their union, once."""
    inside = _Inside([(0.0, 10.0), (2.0, 4.0), (8.0, 12.0)])
    assert inside.ns(5.0, 8.0) == 3.0
    assert inside.ns(0.0, 10.0) == 10.0
    assert inside.ns(-5.0, 20.0) == 12.0
    assert inside.ns(12.0, 15.0) == 0.0


def test_only_the_training_threads_own_fetches_are_the_steps() -> None:
    """The thread that marks the steps makes its batches with a single-process loader: those are its
    fetches. Another thread's loader ranges, and a worker loader's (the main thread waiting on the
    workers' queue), are not the training thread's work to move."""
    single = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ranges = [
        HostRange(1, 0.0, 5.0, "Optimizer.step#AdamW.step", RangeKind.ANNOTATION),
        HostRange(1, 10.0, 20.0, single, RangeKind.ANNOTATION),
        HostRange(2, 10.0, 30.0, single, RangeKind.ANNOTATION),  # a validation loader on another thread
        HostRange(1, 40.0, 45.0, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                  RangeKind.ANNOTATION),
        HostRange(1, 50.0, 55.0, "Optimizer.step#AdamW.step", RangeKind.ANNOTATION),
    ]
    assert training_fetches(ranges) == ((10.0, 20.0),)


@pytest.mark.slow
def test_a_plan_with_the_data_loader_is_replayed_together_not_less() -> None:
    """The Trainer's flag-effort remedies (compile, the micro-batch, the data loader) are replayed
    together, so their set gains at least what compile and the micro-batch give together, and the fetches
    the micro-batch halves and the workers take are not counted twice; torchtitan's (compile,
    checkpointing off, which the replay reads alone, and the data loader) take the largest set the replay
    ran together, the rest by their slices."""
    for name, framework, step, sd in (("hf_clm_h200", Framework.HF_TRAINER, 226.358, 14.548),
                                      ("torchtitan_h200", Framework.TORCHTITAN, 490.687, 27.535)):
        dev = analyze_chrome_trace(LOOPS / name / "trace.json.xz").devices[0]
        b = from_capture(dev, dev.trace_steps, timers=TimerShares(step_ms=step, step_sd_ms=sd))
        assert b is not None
        ctx = FitContext(b, JobConfig(framework=framework))
        fitted = {a.remedy: a for a in fit(ctx)}
        data = fitted[RemedyId.DATA_LOADER]
        assert data.replay is Change.DATA
        others = [a for r, a in fitted.items() if r in (RemedyId.FUSED_LAYERS, RemedyId.MICRO_BATCH)]
        spread = run_spread_ms(b.step_ms, b.step_sd_ms)
        without = combined(others, spread, ctx.replay)
        with_data = combined([*others, data], spread, ctx.replay)
        assert with_data[0] >= without[0] and with_data[1] >= without[1], name
        if name == "hf_clm_h200":  # all three replayed together: the replay's own figure for the set
            assert ctx.replay is not None
            together = ctx.replay.of((Change.FUSED, Change.MICROBATCH, Change.DATA))
            assert together is not None and with_data == pytest.approx((together[0] - spread,
                                                                       together[1] + spread))


@pytest.mark.slow
def test_a_data_wait_the_steady_step_leaves_no_room_for_is_scaled_with_the_rest() -> None:
    """torchtitan's capture: 389.0 ms of the GPU's own time and a 32.2 ms data wait a step. A steady step
    of 425 ms keeps the data wait as captured and scales the other host gaps; at 421 ms those two leave the
    other gaps no room, and the data wait is scaled with them (as before it was kept) rather than the
    budget left at the captured 573 ms step, its launch gaps the profiler's."""
    dev = analyze_chrome_trace(LOOPS / "torchtitan_h200" / "trace.json.xz").devices[0]
    for step, kept in ((425.0, True), (421.0, False)):
        b = from_capture(dev, dev.trace_steps, timers=TimerShares(step_ms=step))
        assert b is not None and b.unprofiled is not None and b.step_ms == pytest.approx(step)
        assert (b.unprofiled.data_ms is not None) is kept, step
        assert 0.0 < b.unprofiled.factor < 1.0
