"""/metrics is served from the last analysis: a scrape never waits on one (issue: never stuck)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from perfd.aggregator import jobs as jobs_mod
from perfd.aggregator.http import _StateCollector, job_iterations, job_summary
from perfd.aggregator.state import AggregatorState
from perfd.core.model import StepRecord


def _steps(n: int) -> list[StepRecord]:
    return [StepRecord(job="j", iteration=i, end_time=1_800_000_000.0 + i, step_time_ms=500.0)
            for i in range(1, n + 1)]


def test_a_scrape_does_not_wait_for_an_analysis_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    st = AggregatorState(min_recompute_s=0.0)
    st.ingest_steps("agent", _steps(20))
    st.refresh()  # one analysis done: the scrape has something to serve
    assert st.cached_analysis("j") is not None
    names_before = {m.name for m in _StateCollector(st).collect()}
    assert any(n.startswith("perfd_job_") for n in names_before)

    entered, release = threading.Event(), threading.Event()
    real = jobs_mod.analyze_run  # type: ignore[attr-defined]

    def slow(*a: Any, **k: Any) -> Any:
        entered.set()
        release.wait(60)  # an analysis stuck on a huge job
        return real(*a, **k)

    monkeypatch.setattr(jobs_mod, "analyze_run", slow)
    st.ingest_steps("agent", _steps(40)[20:])  # new data: the next refresh re-analyses
    refresher = threading.Thread(target=st.refresh, daemon=True)
    refresher.start()
    assert entered.wait(30)
    st.ingest_steps("agent", _steps(50)[40:])  # more data while it runs: the job is dirty again
    got: list[set[str]] = []
    scrape = threading.Thread(target=lambda: got.append({m.name for m in _StateCollector(st).collect()}),
                              daemon=True)
    scrape.start()
    scrape.join(30)
    try:
        assert not scrape.is_alive() and refresher.is_alive(), "the scrape waited for the analysis"
        assert got and got[0] == names_before  # the previous analysis' series, served from cache
    finally:
        release.set()
        refresher.join(30)


def test_the_json_api_answers_from_the_last_analysis_while_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary and iterations endpoints serve the refresher's last analysis: a request made while
    a (stuck) analysis runs answers at once with what was analysed before; the next refresh serves
    the new data."""
    st = AggregatorState(min_recompute_s=0.0)
    st.ingest_steps("agent", _steps(20))
    st.refresh()
    entered, release = threading.Event(), threading.Event()
    real = jobs_mod.analyze_run  # type: ignore[attr-defined]

    def slow(*a: Any, **k: Any) -> Any:
        entered.set()
        release.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(jobs_mod, "analyze_run", slow)
    st.ingest_steps("agent", _steps(40)[20:])
    refresher = threading.Thread(target=st.refresh, daemon=True)
    refresher.start()
    assert entered.wait(30)
    got: list[Any] = []
    req = threading.Thread(target=lambda: got.append((job_summary(st, "j"), job_iterations(st, "j"))),
                           daemon=True)
    req.start()
    req.join(30)
    try:
        assert not req.is_alive() and refresher.is_alive(), "the request waited for the analysis"
        summary, its = got[0]
        assert summary["latest"]["iteration"] == 20 and len(its["iterations"]) == 20
    finally:
        release.set()
        refresher.join(30)
    summary = job_summary(st, "j")
    assert summary is not None and summary["latest"]["iteration"] == 40  # the refresh's result
