"""The suite's xdist groups hold: under ``--dist loadgroup`` every test of one ``xdist_group`` runs on
one worker (conftest.py says why the suite needs it). On pytest 9.2 with pytest-xdist 3.8 the grouping
silently stopped (https://github.com/pytest-dev/pytest-xdist/issues/1386): each module fixture was built again
in every worker that took a test of it — the hook's real training loops 14 times for 5 — and the real torch
processes that must run one at a time ran side by side. Nothing failed; this test does."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow  # an inner pytest with two xdist workers


def test_a_groups_tests_run_on_one_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_grouped="""
        import pytest
        pytestmark = pytest.mark.xdist_group("one")
        @pytest.mark.parametrize("k", range(6))
        def test_grouped(k):
            pass
    """, test_free="""
        import pytest
        @pytest.mark.parametrize("k", range(6))
        def test_free(k):
            pass
    """)
    res = pytester.runpytest_subprocess("-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=12)
    ran = re.findall(r"\[(gw\d)\] .*PASSED (\S+)", res.stdout.str())
    workers: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        workers.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert len(ran) == 12, res.stdout.str()
    grouped = sorted(workers["test_grouped.py"])
    assert len(grouped) == 1, f"one group's tests ran on {grouped}"


def test_what_collection_made_is_out_of_the_collectors_reach() -> None:
    """conftest.py freezes what collection made (every test module, item and fixture), so that the
    collector's full passes during the tests do not walk it again and again."""
    import gc

    assert gc.get_freeze_count() > 10_000
