"""Absurd numbers in step records.

The issue's probe: two step times of 1e308 (finite floats) in a Megatron-LM log made ``perfd analyze
megatron`` die with ``OverflowError: intermediate overflow in fsum``; live, "analysis of job failed"
twice a second and ``/api/jobs/<job>/iterations`` served ``[]``: a stranger naming the job in its Hello
needed two records to freeze what the aggregator served for it. Every number of a step record is now
checked against perfd.core.bounds where it enters (the parsers, the hook's collector, the aggregator's
batches), before any sum: out of bounds, it is absent (never 0) and counted. And a job whose analysis
fails anyway says so in what it serves, counted, its last analysis kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.aggregator import jobs as jobs_mod
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.app.cli import main as cli_main
from perfd.collectors.hook import HookCollector
from perfd.collectors.megatron import parse_file
from perfd.core import bounds
from perfd.core import limits as L
from perfd.core.model import StepRecord, TimerValue
from perfd.hook import wire
from perfd.transport.client import AgentClient

ROOT = Path(__file__).resolve().parents[2]
REAL_LOG = ROOT / "tests" / "data" / "megatron" / "tp2_mha_gelu.log"
STEP_TIME = re.compile(r"(elapsed time per iteration \(ms\): )[0-9.]+")


def _log_with_absurd_step_times(tmp_path: Path, iterations: tuple[int, ...] = (5, 6)) -> Path:
    """The recorded log, the step times of ``iterations`` (their order among the iteration lines) 1e308."""
    out, n = [], 0
    for line in REAL_LOG.read_text().splitlines():
        if "elapsed time per iteration (ms):" in line:
            n += 1
            if n in iterations:
                line = STEP_TIME.sub(r"\g<1>1e308", line)
        out.append(line)
    path = tmp_path / "absurd.log"
    path.write_text("\n".join(out) + "\n")
    return path


def test_analyze_megatron_refuses_absurd_step_times_and_answers(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Before: exit 1, OverflowError in fsum. Now: exit 0, both values counted and absent."""
    log = _log_with_absurd_step_times(tmp_path)
    assert cli_main(["analyze", "megatron", str(log), "--gpu", "NVIDIA H200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parse"]["counts"][f"malformed:{bounds.STEP_REASON}"] == 2
    texts = [i["text"] for i in out["parse"]["issues"] if i["reason"] == bounds.STEP_REASON]
    assert [t.split(":")[0] for t in texts] == ["iteration 5", "iteration 6"]
    parsed = parse_file(log)
    assert [r.step_time_ms for r in parsed.records if r.iteration in (5, 6)] == [None, None]  # absent, not 0
    assert all(r.step_time_ms is not None for r in parsed.records if r.iteration not in (5, 6))
    assert out["summary"]  # analysed, the other iterations' figures intact


def test_every_kind_of_step_value_is_bounded() -> None:
    rec = StepRecord(job="j", iteration=3, end_time=-5.0, step_time_ms=1e308, logged_tflops_per_gpu=-1.0,
                     learning_rate=1e300, lm_loss=float("nan"), grad_norm=float("inf"), loss_scale=1e300,
                     consumed_samples=-1, global_batch_size=10**30, skipped_iterations=-2, interval=0,
                     tokens_per_step=1e308, flops_per_step=float("inf"), fields={"in_step_ms": "1e308"})
    reasons = bounds.check_step_record(rec)
    assert len(reasons) == 12, reasons
    for name in ("end_time", "step_time_ms", "logged_tflops_per_gpu", "learning_rate", "loss_scale",
                 "consumed_samples", "global_batch_size", "skipped_iterations", "interval", "tokens_per_step",
                 "flops_per_step"):
        assert getattr(rec, name) is None, name
    assert "in_step_ms" not in rec.fields
    # A diverged run's nan loss and inf grad norm are its framework's word: kept, read through finite().
    assert rec.lm_loss != rec.lm_loss and rec.grad_norm == float("inf")
    real = parse_file(REAL_LOG).records
    assert real and all(bounds.check_step_record(r) == [] for r in real)


class _Float(float):
    """A float subclass: not a number in_range takes (its type is not float)."""


_ANY_VALUE = st.one_of(
    st.floats(), st.integers(min_value=-(10**400), max_value=10**400), st.booleans(), st.none(),
    st.text(max_size=2), st.floats(allow_nan=False).map(_Float),
    st.sampled_from([0.0, -0.0, 1e10, 1e10 + 1, 5e9, 10**10, 10**10 + 1, float("nan"), float("inf")]),
    st.floats(min_value=0.0, max_value=1e4), st.integers(min_value=0, max_value=10**4))
_LIMITS = st.sampled_from([(0.0, bounds.MAX_STEP_MS), (0.0, bounds.MAX_EPOCH_S)])


@settings(max_examples=600)
@given(st.lists(_ANY_VALUE, max_size=12), _LIMITS)
def test_checking_a_collection_at_once_is_checking_each_value(values: list[object],
                                                              limits: tuple[float, float]) -> None:
    """A root checks every rank's timers and ends of a fold in one call (``all_in_range``, loops in C):
    the same answer as each value's ``in_range``, whatever nan, inf, bool, huge int or float subclass
    sits where."""
    low, high = limits
    assert bounds.all_in_range(values, low, high) == all(bounds.in_range(v, low, high) for v in values)


def test_one_ranks_bad_timer_or_end_in_a_fold_is_caught() -> None:
    per = {r: 100.0 + r for r in range(4096)}
    ends = {r: 1_795_000_000.0 + r for r in range(4096)}
    for bad in (float("nan"), float("inf"), -1.0, True, 1e308):
        rec = StepRecord(job="j", iteration=1, rank="all", timers={
            "forward-compute": TimerValue(100.0, 4195.0, {**per, 2048: bad}),
            "backward-compute": TimerValue(100.0, 4195.0, dict(per))},
            rank_end_times={**ends, 7: bad})
        reasons = bounds.check_step_record(rec)
        assert list(rec.timers) == ["backward-compute"] and 7 not in rec.rank_end_times, bad
        assert len(rec.rank_end_times) == 4095 and len(reasons) == 2, (bad, reasons)


@pytest.fixture
def hook_collector(tmp_path: Path) -> Iterator[HookCollector]:
    c = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
    assert c.probe().available
    c.start()
    yield c
    c.stop()


def test_a_hook_datagram_with_absurd_numbers_is_counted_and_kept_without_them(
        hook_collector: HookCollector) -> None:
    """A step a day and more long (1e18 ns) with 1e308 tokens, from a process of the job's user."""
    msg = wire.StepMsg(rank=0, pid=os.getpid(), step=7, end_time_ns=time.time_ns(), step_ns=10**18,
                       tokens_per_step=1e308, flops_per_step=-1.0, compute_ns=10**18)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(wire.pack_step(msg), hook_collector.config.socket_path)
    steps: list[StepRecord] = []
    deadline = time.monotonic() + 30  # bounds a failure only: returns as soon as the record is there
    while not steps and time.monotonic() < deadline:
        steps += hook_collector.collect(time.time()).steps
        time.sleep(0.005)
    assert len(steps) == 1
    rec = steps[0]
    assert rec.step_time_ms is None and rec.tokens_per_step is None and rec.flops_per_step is None
    assert "compute" not in rec.timers and rec.end_time is not None
    assert hook_collector.errors[f"malformed:{bounds.STEP_REASON}"] == 5  # step, tokens, flops, two timers
    assert not any(k.startswith("sender:") for k in hook_collector.errors)


def _serve(records: list[StepRecord], job: str, paths: list[str],
           before: Callable[[Aggregator], None] | None = None) -> tuple[list[Any], str]:
    """Send ``records`` of ``job`` to an in-process aggregator over real gRPC; its answers to ``paths``
    (after a rules tick analysed them) and its /metrics."""
    async def main() -> tuple[list[Any], str]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[]))
        await agg.start()
        try:
            if before is not None:
                before(agg)
            c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "stranger", jobs=[job])
            c.submit(steps=records)
            task = asyncio.create_task(c.run())
            assert await c.flush(60)
            task.cancel()
            assert agg.http is not None
            port = agg.http.port

            def get(path: str) -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
                    return str(r.read().decode())
            got = [json.loads(await asyncio.to_thread(get, p)) for p in paths]
            return got, await asyncio.to_thread(get, "/metrics")
        finally:
            await agg.stop()

    return asyncio.run(main())


def test_two_absurd_step_times_over_the_network_do_not_freeze_the_jobs_iterations() -> None:
    """Before: the job's iterations [] (its analysis failed on OverflowError at every tick). Now: every
    iteration served, the two values absent and counted as step_value."""
    records = parse_file(REAL_LOG, job="victim").records
    for r in records[4:6]:
        r.step_time_ms = 1e308
    (its, summary), metrics = _serve(records, "victim", ["/api/jobs/victim/iterations?sources=0",
                                                         "/api/jobs/victim/summary"])
    assert [int(i["iteration"]) for i in its["iterations"]] == [r.iteration for r in records]
    assert its["analysis_error"] is None and summary["overview"]["analysis_error"] is None
    assert f'perfd_aggregator_refused_total{{reason="{L.REFUSED_STEP_VALUE}"}} 2.0' in metrics


def test_a_job_whose_analysis_fails_says_so_and_is_counted(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Defence in depth: whatever makes a job's analysis fail, the job serves why (never a silent []),
    the failure is counted, and logged once (not at every tick)."""
    def broken(*_a: object, **_k: object) -> None:
        raise OverflowError("intermediate overflow in fsum")

    monkeypatch.setattr(jobs_mod, "analyze_run", broken)
    records = parse_file(REAL_LOG, job="victim").records
    (its, jobs_list, stats), _ = _serve(records, "victim", ["/api/jobs/victim/iterations?sources=0",
                                                            "/api/jobs", "/api/stats"])
    assert its["iterations"] == []
    err = its["analysis_error"]
    assert err["error"] == "OverflowError: intermediate overflow in fsum" and err["failures"] >= 1
    assert err["serving"] == "no analysis" and err["since"] is not None
    assert next(j for j in jobs_list["jobs"] if j["job"] == "victim")["analysis_error"] == err
    assert stats["analysis_errors"] >= err["failures"]
    logged = [r for r in caplog.records if r.getMessage().startswith("analysis of job victim failed")]
    assert len(logged) == 1
