"""`perfd bench ranks` runs end to end on real processes and reports what benchmarks/README.md quotes:
the collect's CPU per count, per rank and per node, the share of a core at 1 Hz, and the contention
scan (which must actually run: a rank pinned beside a burner waits for its CPU)."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import ranks_bench

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
              pytest.mark.slow]


def test_the_bench_measures_ranks_and_the_scan(capsys: pytest.CaptureFixture[str]) -> None:
    assert ranks_bench.main(["--ranks", "0,2", "--threads", "4", "--collects", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["ranks"] for r in out["runs"]] == [0, 2]
    for r in out["runs"]:
        assert r["collect_cpu_ms_mean"] > 0
        assert r["cpu_share_at_1hz"] == pytest.approx(r["collect_cpu_ms_mean"] / 1e3)
    assert out["per_rank_ms"] is not None and out["node_ms"] is not None
    assert out["scan"]["scans"] >= 1 and out["scan"]["processes_read_median"] > 0  # the scan ran
    assert ranks_bench.main(["--ranks", "x"]) == 2  # a bad argument: refused with status 2
