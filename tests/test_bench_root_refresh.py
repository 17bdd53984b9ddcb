"""``perfd bench root-refresh`` (benchmarks/root_refresh_bench.py) measures a root that holds what a
real job's root holds: every node's agent sends its GPUs' process lists and its job's first share of
collective operations as the job starts, so the job's snapshot has every node, agent and placed rank
(reading them was most of a 100,000-GPU root's CPU, and a bench without them did not show it)."""

from __future__ import annotations

from benchmarks.engine_bench import JOB, RANKS_PER_NODE, node_name
from benchmarks.root_refresh_bench import _root, run


def test_the_benchs_root_holds_every_node_agent_and_rank_of_the_job() -> None:
    nodes = 4
    state, root = _root(nodes, folds=False)
    snap = state.snapshot(JOB)
    assert snap is not None
    names = {node_name(n) for n in range(nodes)}
    assert snap.nodes == names
    assert names <= snap.agents
    assert sorted(snap.placed_ranks) == list(range(nodes * RANKS_PER_NODE))
    assert root.stats.collective_partials == nodes and root.stats.undecodable == 0


def test_the_bench_times_the_snapshot_and_answers_each_iteration() -> None:
    res = run(4, 5, collectives=False)
    assert isinstance(res["snapshot_cpu_s_median"], float)  # (rounded to 0.1 ms: 0 at 4 nodes)
    assert res["answer"] is not None and res["answer"]["iteration"] == 5
    assert len(res["refreshes"]) == 5
