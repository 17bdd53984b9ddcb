"""`perfd aggregator --event-loop`: a real aggregator process ingests a real agent's batch and
acknowledges it under either loop, and says which one it runs (the loop, the gRPC experiments and the
switch interval are the process's, chosen as it starts: a process of its own); a loop it cannot have is
refused with exit 2 (through the CLI's main(), in the test's process)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfd.aggregator import runtime
from perfd.aggregator.loops import EVENT_LOOPS, event_loop_runner
from perfd.aggregator.runtime import GC_THRESHOLDS, GRPC_EXPERIMENTS, SWITCH_INTERVAL_S
from perfd.app.cli import main
from perfd.core.model import StepRecord
from perfd.transport import AgentClient
from tests.procs import free_port, http_get, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]


def test_runner_choice() -> None:
    assert event_loop_runner("asyncio") == ("asyncio", asyncio.run)
    pytest.importorskip("uvloop")
    assert event_loop_runner("auto")[0] == event_loop_runner("uvloop")[0] == "uvloop"
    with pytest.raises(ValueError, match="unknown event loop"):
        event_loop_runner("tokio")


def test_uvloop_asked_for_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert event_loop_runner("auto")[0] == "asyncio"
    with pytest.raises(ValueError, match="not installed"):
        event_loop_runner("uvloop")


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("loop", [k for k in EVENT_LOOPS if k != "auto"])
def test_aggregator_ingests_and_acks_under_each_loop(loop: str, tmp_path: Path) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    g, h = free_port(), free_port()
    out = tmp_path / "agg.out"
    agg = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "aggregator", "--grpc-port", str(g),
                            "--http-port", str(h), "--no-rules", "--event-loop", loop], cwd=ROOT,
                           stdout=out.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{h}/healthz"), 60, "the aggregator")
        # The start-up line is printed just after the servers start: /healthz can answer first.
        wait_for(lambda: "; event loop " in out.read_text(), 30, "the aggregator's start-up line")
        assert f"event loop {loop}" in out.read_text()
        # `perfd aggregator` chose its gRPC core experiments before loading grpc (perfd.aggregator.runtime).
        assert f"GRPC_EXPERIMENTS={GRPC_EXPERIMENTS}" in out.read_text()
        # and its switch interval (the loop served before the analyses' threads)
        assert f"switch interval {SWITCH_INTERVAL_S * 1e3:g} ms" in out.read_text()

        async def send() -> bool:
            c = AgentClient(f"127.0.0.1:{g}", "n1", node="n1", jobs=["j"])
            t = asyncio.create_task(c.run())
            c.submit(steps=[StepRecord(job="j", iteration=1, rank="last", end_time=1.0, step_time_ms=900.0)])
            ok = await c.flush(30)
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
            return ok

        assert asyncio.run(send())
        stats = json.loads(http_get(f"http://127.0.0.1:{h}/api/stats"))
        assert stats["step_records_ingested"] == 1
        assert stats["transport"]["batches"] == 1
        # The aggregator process runs with its own collector thresholds, and times the collector.
        assert stats["transport"]["gc_ms"] >= stats["transport"]["gc_full_ms"] >= 0
        assert stats["transport"]["gc_full_collections"] >= 0
        assert b"perfd_aggregator_gc_seconds_total " in http_get(f"http://127.0.0.1:{h}/metrics")
    finally:
        stop(agg)


def test_tune_gc_sets_the_thresholds_and_times_collections() -> None:
    """In the test's process, its collector's settings put back after (thresholds, frozen objects,
    callbacks): the test process keeps its collector as it was."""
    thresholds, callbacks, frozen_before = gc.get_threshold(), list(gc.callbacks), gc.get_freeze_count()
    try:
        before = runtime.gc_seconds()
        runtime.tune_gc()
        x: list[list[int]] = [[] for _ in range(100000)]
        gc.collect()
        after, tuned, frozen = runtime.gc_seconds(), list(gc.get_threshold()), gc.get_freeze_count() > 0
        del x
    finally:
        gc.callbacks[:] = callbacks
        gc.set_threshold(*thresholds)
        if not frozen_before:
            gc.unfreeze()
    assert before is None and after is not None and after > 0 and tuned == list(GC_THRESHOLDS) and frozen


@pytest.mark.parametrize("preset", [None, "-some_experiment"])
def test_grpc_experiments_chosen_before_grpc_loads_and_an_operators_setting_kept(preset: str | None) -> None:
    code = ("import json, os; from perfd.aggregator import runtime as r; a = r.grpc_experiments(); "
            "b = os.environ.get('GRPC_EXPERIMENTS'); import grpc; "
            "print(json.dumps([a, b, r.grpc_experiments()]))")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if preset is not None:
        env["GRPC_EXPERIMENTS"] = preset
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=env)
    chosen = preset or GRPC_EXPERIMENTS
    assert json.loads(r.stdout) == [chosen, chosen, None]  # None: grpc loaded, too late to choose


@pytest.mark.timeout(60)  # an aggregator that took the loop would run on, in process
def test_an_unavailable_loop_is_refused_with_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    rc = main(["aggregator", "--grpc-port", "0", "--http-port", "0", "--event-loop", "uvloop"])
    assert rc == 2
    assert "uvloop is not installed" in capsys.readouterr().err


def test_tune_switch_interval_sets_the_interpreters_in_its_own_process() -> None:
    """In the test's process, its interval put back after (nothing in a test's process tunes it: only
    run_aggregator, the daemon's own start)."""
    before = sys.getswitchinterval()
    try:
        runtime.tune_switch_interval()
        tuned = sys.getswitchinterval()
        runtime.tune_switch_interval(0.002)
        set_to = sys.getswitchinterval()
    finally:
        sys.setswitchinterval(before)
    assert before == pytest.approx(0.005) and tuned == pytest.approx(SWITCH_INTERVAL_S)
    assert set_to == pytest.approx(0.002)


@pytest.mark.timeout(60)  # an aggregator that took the interval would run on, in process
@pytest.mark.parametrize("ms", ["0", "-1", "5000"])
def test_a_switch_interval_out_of_range_is_refused_with_exit_2(ms: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["aggregator", "--grpc-port", "0", "--http-port", "0", "--gil-switch-ms", ms])
    assert rc == 2
    assert "--gil-switch-ms must be > 0 and at most 1000" in capsys.readouterr().err
