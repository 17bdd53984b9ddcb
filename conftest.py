"""Tests marked `gpu` need a real NVIDIA GPU: they run only with PERFD_GPU_TESTS=1 (never in CI).
A process a test leaves running fails the run (tests/leftover_procs.py names it and kills it).

`make test` runs pytest-xdist with --dist loadgroup: the tests of one ``xdist_group`` run on one worker.
A module whose tests share what it computes once (a module fixture, a cached recording) carries a
group, or every worker that takes one of its tests computes it again; so do the tests that must not
run beside each other (``torch_processes``). tests/test_xdist_groups.py checks the grouping holds."""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis's two checks of time (an example's deadline, the "input generation is slow" health check)
# read the wall clock: on a loaded machine they fail a correct test (one draw of 30 s, a pytest worker
# starved beside two busy loops). Time is the benchmarks' (`perfd bench ...`); the suite checks what the
# code does. Declared here once, for every test; a test's own @settings says only its examples.
settings.register_profile("perfd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("perfd")

# pytester: tests/test_leftover_procs.py runs an inner pytest to see the guard fail a run
# tests.cpu_times: each test's CPU and wall time, only where PERFD_TEST_CPU names a folder
# tests.trace_cache: the session's folder of traces read once (tests/trace_cache.py)
pytest_plugins = ["pytester", "tests.leftover_procs", "tests.cpu_times", "tests.trace_cache"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PERFD_GPU_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="needs a GPU: set PERFD_GPU_TESTS=1 on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every module, test item and fixture definition: ~158,000 objects for the
    whole suite, all living as long as the process) is moved out of the cyclic collector's reach once it is
    done: every full collection during the tests walked them all again and freed none. The tests' own
    objects are collected as before. Three CPU-bound test modules in one process: 42.3 s of CPU, 38.3
    and 32.9 s frozen (two runs each, a quiet 2-core VM); the suite is bound by its CPU there."""
    gc.collect()  # collection's own garbage first, not kept for good
    gc.freeze()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None]:
    """What the run skipped, grouped by reason with counts, after pytest's own short summary (whose
    SKIPPED lines group by file and line): the last lines before the result line. Under xdist the
    controller holds every worker's reports, so the counts are the whole run's."""
    yield
    reasons: Counter[str] = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("-", f"skipped {reasons.total()}, by reason")
        for reason, n in reasons.most_common():
            terminalreporter.write_line(f"{n:>5}: {reason}")
