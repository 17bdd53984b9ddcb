"""`perfd bench baseline` runs small in CI (its keys; every rank placed, every call a real sighting),
and what it led to: a sighting reads only the GPU series it uses (same hints, same snapshot), and a
big job is sighted less often (a small one exactly as before)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from benchmarks.baseline_bench import JOB, build
from perfd.aggregator.gpu_views import SIGHTING_SERIES as _SIGHTING_SERIES
from perfd.aggregator.incidents import BASELINE_EVERY_S, BASELINE_RANKS_PER_EVERY_S, GpuBaseline
from perfd.aggregator.nodes import GpuView
from perfd.analytics.incidents.attribution import gpu_hints, place_ranks
from perfd.analytics.incidents.detect import Incident
from perfd.app.cli import main
from perfd.report.incident_text import hint_json


@pytest.mark.slow
def test_bench_baseline_places_every_rank_and_times_real_sightings(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "baseline", "--nodes", "2", "--gpus", "8", "--calls", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["runs"]
    assert r["nodes"] == 2 and r["ranks"] == 16 and r["ranks_placed"] == 16  # not the early return
    assert r["sightings_taken"] == r["calls"] == 2
    for key in ("wall_s_median", "wall_s_p90", "cpu_s_median", "cpu_s_p90"):
        assert r["sighting"][key] >= 0
    assert r["sighting"]["wall_s_median"] > 0
    assert r["cpu_share_at_1hz"] == r["sighting"]["cpu_s_median"] / BASELINE_EVERY_S
    assert r["interval_s"] == BASELINE_EVERY_S  # 16 ranks: sighted every BASELINE_EVERY_S, as before
    assert set(r["parts"]) == {"gpu_view", "gpu_view_all_series", "place_ranks", "gpu_hints"}
    assert set(r["gpu_snapshot"]) == {"one_rank", "no_rank", "view_read", "one_rank_view_held",
                                      "no_rank_view_held"}
    assert r["snapshot_view_kept_s"] == 0.0 and "placed_ranks" in r  # 16 ranks: a view per pass
    assert r["gpu_snapshot"]["one_rank"]["ranks_in_snapshot"] == 1
    assert "job_overview" in r and out["cpus"] and out["python"]


def test_bench_baseline_refuses_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "baseline", "--nodes", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_the_narrow_views_give_the_same_hints_and_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    agg, _agents = build(13, 8)  # 104 ranks: a hot, slow GPU and a co-tenant among them
    st = agg.state
    full = st.gpu_view(JOB)
    narrow = st.gpu_view(JOB, _SIGHTING_SERIES)
    placed = place_ranks(full[0], job=JOB)
    assert len(placed) == 104 and narrow[0] == full[0] and narrow[2] == full[2]

    def hints(view: GpuView) -> list[dict[str, Any]]:
        procs, values, throttles = view
        return [hint_json(h) for h in gpu_hints(sorted(placed), placed, values, throttles, procs, 5.0)]

    got = hints(narrow)
    assert got == hints(full) and any(h["items"] for h in got)
    monkeypatch.setattr(time, "time", lambda: 1e9)  # the snapshots' "now", the same in both
    common: dict[str, Any] = {"first_iteration": 1, "last_iteration": 2, "n_iterations": 2, "cost_s": 1.0,
                              "steady_step_ms": 1.0, "median_step_ms": 1.0, "max_step_ms": 1.0, "open": True}
    incs = [Incident(id="one", kinds=["straggler"], ranks=[96], **common),
            Incident(id="none", kinds=["slow-steps"], ranks=[], **common)]
    snaps = [st.sightings.gpu_snapshot(JOB, inc) for inc in incs]
    every = st.nodes.gpu_view  # every GPU series, not the snapshot's
    monkeypatch.setattr(st.nodes, "gpu_view", lambda agents, names=None, job=None: every(agents, None, job))
    assert [st.sightings.gpu_snapshot(JOB, inc) for inc in incs] == snaps
    assert snaps[0][96].gpu_values and snaps[1]  # the hot GPU's values; GPUs that stand out


def test_a_big_job_is_sighted_less_often_a_small_one_as_before() -> None:
    b = GpuBaseline()
    now = time.time()
    b.add("small", {r: [] for r in range(BASELINE_RANKS_PER_EVERY_S)}, now)
    assert b.interval_s("small") == BASELINE_EVERY_S
    assert not b.due("small", now + BASELINE_EVERY_S * 0.99) and b.due("small", now + BASELINE_EVERY_S)
    b.add("big", {r: [] for r in range(8 * BASELINE_RANKS_PER_EVERY_S)}, now)
    assert b.interval_s("big") == 8 * BASELINE_EVERY_S
    assert not b.due("big", now + 7.9 * BASELINE_EVERY_S) and b.due("big", now + 8 * BASELINE_EVERY_S)
    assert b.due("new", now) and b.interval_s("new") == BASELINE_EVERY_S  # never sighted: due now
    zero = GpuBaseline(every_s=0.0)  # a test's "every analysis" stays every analysis, whatever the size
    zero.add("big", {r: [] for r in range(8 * BASELINE_RANKS_PER_EVERY_S)}, now)
    assert zero.due("big", now) and zero.sightings("big") == 1
