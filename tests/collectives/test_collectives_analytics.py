"""perfd.analytics.collectives.collective_analysis: shares per iteration and group, bandwidth, wait
asymmetry, findings.

Synthetic records with hand-computed answers first, then the recorded H200 dumps (timing on)."""

from __future__ import annotations

import itertools
import statistics

import pytest

from perfd.analytics.collectives.collective_analysis import analyze_collectives
from perfd.analytics.collectives.collective_config import CollectiveConfig
from perfd.analytics.collectives.collective_facts import CollectiveFinding, DpShareFacts, ShareAbsent
from perfd.analytics.collectives.collective_windows import step_windows
from perfd.analytics.collectives.groups import Capability, classify_group, link_for_group
from perfd.core.model import CollectiveRecord, ParallelLayout
from perfd.report.collective_text import ABSENT_TEXT, collectives_json, link_how_text, method_text
from tests.collectives.collective_helpers import MS, T0, fr, load_fixture_records, step

TP = "TENSOR_MODEL_PARALLEL_GROUP"


def _two_ranks():
    """Rank 0 has its own (hook) step records, rank 1 uses the job's ("last") records.

    rank 0: iteration 2 (0..100 ms): ops at 10 (20 ms) and 15 (10 ms, queued behind the first:
    runs 30..40) on the default group + a TP op at 50 (10 ms): 40 ms -> 0.4 (world 0.3, tp 0.1);
    iteration 3 (100..200): 50 ms -> 0.5; iteration 4 (200..300): 10 ms -> 0.1.
    rank 1: 20 + 10 = 30 ms -> 0.3 (world 0.2, tp 0.1); 30 ms -> 0.3; 30 ms -> 0.3.
    Ops at -5 ms and 310 ms only make the records cover the windows."""
    recs = [fr(0, 0, -5, 1), fr(0, 1, 10, 20), fr(0, 2, 15, 10), fr(0, 3, 110, 50), fr(0, 4, 210, 10),
            fr(0, 5, 310, 1), fr(0, 1, 50, 10, pg=1, desc=TP),
            fr(1, 0, -5, 1), fr(1, 1, 12, 10), fr(1, 2, 14, 10), fr(1, 3, 110, 30), fr(1, 4, 210, 30),
            fr(1, 5, 310, 1), fr(1, 1, 50, 10, pg=1, desc=TP)]
    steps = [step(0, i, t) for i, t in ((1, 0), (2, 100), (3, 200), (4, 300))]
    steps += [step("last", i, t) for i, t in ((1, 0), (2, 100), (3, 200), (4, 300))]
    return recs, steps


def test_shares_per_iteration_rank_and_group_by_hand():
    recs, steps = _two_ranks()
    a = analyze_collectives("j", recs, steps)
    assert a.method == "step_windows" and "time_created_ns" in method_text(a)
    its = {it.iteration: it for it in a.iterations}
    assert sorted(its) == [2, 3, 4]
    assert its[2].share_by_rank == pytest.approx({0: 0.4, 1: 0.3})
    assert its[2].share == pytest.approx(0.35)
    assert its[2].by_group == pytest.approx({"world": 0.25, "tp": 0.1})
    assert its[3].share_by_rank == pytest.approx({0: 0.5, 1: 0.3})
    assert its[2].window_ms == pytest.approx(100.0)
    assert a.comm_share_by_rank == pytest.approx({0: 0.4, 1: 0.3})
    assert a.comm_total_share == pytest.approx(0.35)
    # ratio of sums: rank 0 (40+50+10)/300, rank 1 90/300
    assert a.weighted_share == pytest.approx(statistics.median([100 / 300, 90 / 300]))
    assert a.comm_share_by_group["tp"] == pytest.approx(0.0)  # median over windows: TP only in one
    j = a.to_json()
    assert j["summary"]["comm_total_share"] == pytest.approx(0.35)
    assert j["iterations"][0]["share_by_rank"] == pytest.approx({"0": 0.4, "1": 0.3})
    assert any(f.id == "comm-total-share" for f in a.findings)


def test_a_sequence_gap_removes_the_windows_it_spans():
    recs, steps = _two_ranks()
    recs = [r for r in recs if not (r.rank == 0 and r.collective_seq_id == 3 and r.pg_id == 0)]
    a = analyze_collectives("j", recs, steps)
    assert a.comm_share_by_rank.keys() == {1}  # rank 0: seq 2 -> 4 gap spans every window
    assert all(0 not in it.share_by_rank for it in a.iterations)


def test_windows_not_covered_by_records_are_left_out():
    recs, steps = _two_ranks()
    recs = [r for r in recs if r.collective_seq_id not in (0, 5)]  # nothing before/after the windows
    steps += [step(0, 5, 400), step("last", 5, 400)]
    a = analyze_collectives("j", recs, steps)
    assert {it.iteration for it in a.iterations} == {3}  # only the middle window is covered


def test_warmup_windows_are_reported_but_left_out_of_the_summary():
    recs, steps = _two_ranks()
    steps = [s if not (s.rank == 0 and s.iteration == 3) else step(0, 3, 200, warmup=True) for s in steps]
    a = analyze_collectives("j", recs, steps)
    assert {it.iteration: it.excluded for it in a.iterations}[3] == "warmup"
    assert a.comm_share_by_rank[0] == pytest.approx(0.25)  # median of 0.4 and 0.1


def test_observation_window_without_step_records():
    recs, _ = _two_ranks()
    a = analyze_collectives("j", recs)
    assert a.method == "observation_window" and not a.iterations
    # rank 0: union 1 + 20 + 10 + 10 + 50 + 10 + 1 = 102 ms over -5..311 ms
    assert a.comm_share_by_rank[0] == pytest.approx(102 / 316)


def test_without_durations_the_share_is_absent_with_the_reason():
    recs = [fr(r, s, 10 * s, None) for r in (0, 1) for s in range(5)]
    a = analyze_collectives("j", recs, [step(0, i, 10 * i) for i in range(5)])
    assert a.comm_total_share is None and not a.timing
    assert a.absent is ShareAbsent.NO_TIMING and "TORCH_NCCL_ENABLE_TIMING=1" in ABSENT_TEXT[a.absent]
    assert any(f.id == "comm-total-absent" for f in a.findings)


def test_step_windows_per_rank_and_job():
    per_rank, job = step_windows([step(0, 1, 0), step(0, 3, 20), step("last", 1, 0), step("last", 2, 5)])
    assert [(w.iteration, w.n_iterations) for w in per_rank[0]] == [(3, 2)]
    assert per_rank[0][0].ms == pytest.approx(20.0, abs=1e-3)  # epoch seconds as floats: ~0.2 µs
    assert [w.iteration for w in job] == [2] and job[0].ms == pytest.approx(5.0, abs=1e-3)


def test_dp_share_over_20_percent_is_a_warning_with_the_playbook_action():
    recs = [fr(r, s, 100 * s + 1, 30, desc="DATA_PARALLEL_GROUP") for r in (0, 1) for s in range(6)]
    steps = [step(r, i, 100 * i) for r in (0, 1) for i in range(6)]
    a = analyze_collectives("j", recs, steps)
    assert a.comm_share_by_group == pytest.approx({"dp": 0.3})
    f = next(f for f in a.findings if f.id == "comm-dp-high")
    assert f.severity == "warning"
    assert isinstance(f, CollectiveFinding) and isinstance(f.facts, DpShareFacts)  # a kind, its numbers
    assert f.facts.share == pytest.approx(0.3) and f.title == ""
    served = collectives_json(a)  # worded where served: the playbook's action
    assert any("gradient accumulation" in r["action"] for r in served["recommendations"])
    assert next(x["title"] for x in served["findings"] if x["id"] == "comm-dp-high") == \
        "Data-parallel communication 30.0% of the step"


# ---------------------------------------------------------------------------------- bandwidth


def _big(rank: int, seq: int, dur: float, busbw: float, ranks: list[int] | None = None) -> CollectiveRecord:
    return fr(rank, seq, seq * 10.0, dur, nbytes=256 << 20, busbw=busbw, ranks=ranks)


def test_bandwidth_uses_the_member_that_waited_least_and_flags_a_slow_nvlink_group():
    recs = [_big(0, s, 2.0, 100.0) for s in range(4)] + [_big(1, s, 1.0, 200.0) for s in range(4)]
    a = analyze_collectives("j", recs, rank_nodes={0: "n1", 1: "n1"}, gpu_name="NVIDIA H200")
    (b,) = a.bandwidth
    assert (b.group, b.scope, b.link, b.capability_gbs) == ("world", "intra-node", "nvlink4", 450.0)
    assert b.n_ops == 4 and b.median_busbw_gbs == 200.0 and b.ratio == pytest.approx(200 / 450)
    assert any(f.id == "collective-bandwidth-world-intra-node" for f in a.findings)


def test_bandwidth_at_the_measured_h200_level_is_fine():
    recs = [_big(r, s, 0.93, 290.0) for r in (0, 1) for s in range(4)]
    a = analyze_collectives("j", recs, rank_nodes={0: "n1", 1: "n1"}, gpu_name="NVIDIA H200")
    assert a.bandwidth[0].ratio == pytest.approx(290 / 450)
    assert not any(f.id.startswith("collective-bandwidth") for f in a.findings)


def test_small_messages_do_not_count_for_bandwidth():
    recs = [fr(r, s, s, 0.01, nbytes=1 << 20, busbw=5.0) for r in (0, 1) for s in range(10)]
    assert analyze_collectives("j", recs, rank_nodes={0: "n", 1: "n"}, gpu_name="NVIDIA H200").bandwidth == []


def test_a_one_rank_group_has_no_bus_bandwidth():
    """Seen live on one H100 (DDP, world 1): a 241x-the-link "bus bandwidth" for group world, from
    ops that move no data. A one-rank group is left out and counted, never exported."""
    recs = [_big(0, s, 0.004, 108_000.0, ranks=[0]) for s in range(4)]
    a = analyze_collectives("j", recs, rank_nodes={0: "n1"}, gpu_name="NVIDIA H100 80GB HBM3")
    assert a.bandwidth == [] and a.bandwidth_rejected == {"single_rank_group": 4}
    assert a.to_json()["bandwidth_rejected"] == {"single_rank_group": 4}
    assert not any(f.id.startswith("collective-bandwidth") for f in a.findings)


def test_a_bandwidth_beyond_the_link_is_not_credible():
    """Above 1.5x the link's figure nothing real moved: counted as not credible, the rest kept."""
    recs = [_big(r, s, 0.93, 290.0) for r in (0, 1) for s in range(4)]
    recs += [_big(r, s, 0.01, 30_000.0) for r in (0, 1) for s in range(4, 6)]
    a = analyze_collectives("j", recs, rank_nodes={0: "n1", 1: "n1"}, gpu_name="NVIDIA H200")
    (b,) = a.bandwidth
    assert b.n_ops == 4 and b.max_busbw_gbs == 290.0 and b.ratio == pytest.approx(290 / 450)
    assert a.bandwidth_rejected == {"not_credible": 2}


def test_inter_node_capability_is_configurable():
    recs = [_big(r, s, 10.0, 20.0) for r in (0, 1) for s in range(4)]
    nodes = {0: "n1", 1: "n2"}
    a = analyze_collectives("j", recs, rank_nodes=nodes)
    assert (a.bandwidth[0].scope, a.bandwidth[0].capability_gbs) == ("inter-node", 25.0)
    assert not any(f.id.startswith("collective-bandwidth") for f in a.findings)
    a = analyze_collectives("j", recs, rank_nodes=nodes, config=CollectiveConfig(inter_node_busbw_gbs=50.0))
    assert a.bandwidth[0].ratio == pytest.approx(0.4)
    assert any(f.id == "collective-bandwidth-world-inter-node" for f in a.findings)


def test_unknown_placement_reports_bandwidth_without_a_verdict():
    recs = [_big(r, s, 1.0, 10.0) for r in (0, 1) for s in range(4)]
    (b,) = analyze_collectives("j", recs, gpu_name="NVIDIA H200").bandwidth
    assert b.scope == "unknown" and b.ratio is None


# ---------------------------------------------------------------------------------- wait asymmetry


def test_the_rank_that_waits_least_is_named_as_the_one_the_others_wait_for():
    recs = [fr(0, s, s, 5.0) for s in range(30)] + [fr(1, s, s, 1.0) for s in range(30)]
    a = analyze_collectives("j", recs)
    w = {x.rank: x for x in a.waits}
    assert w[1].last == 30 and w[1].last_share == 1.0 and w[0].last == 0
    assert w[1].to_json()["mean_wait_imposed_ms"] == pytest.approx(4.0)
    assert [f.id for f in a.findings if f.id.startswith("collective-last-rank")] == ["collective-last-rank-1"]


def test_alternating_arrival_is_not_a_straggler_and_ties_are_not_decisive():
    recs = [fr(s % 2, s, s, 1.0) for s in range(40)] + [fr(1 - s % 2, s, s, 3.0) for s in range(40)]
    recs += [fr(r, 100 + s, 100 + s, 2.0) for r in (0, 1) for s in range(10)]  # equal: not decisive
    a = analyze_collectives("j", recs)
    w = {x.rank: x for x in a.waits}
    assert w[0].decisive == 40 and w[0].ops == 50 and w[0].last_share == pytest.approx(0.5)
    assert not any(f.id.startswith("collective-last-rank") for f in a.findings)


def test_ops_missing_a_member_are_not_used_for_wait_asymmetry():
    recs = [fr(0, s, s, 5.0, ranks=[0, 1, 2]) for s in range(30)] + [fr(1, s, s, 1.0, ranks=[0, 1, 2])
                                                                      for s in range(30)]
    assert analyze_collectives("j", recs).waits == []


# ---------------------------------------------------------------------------------- groups


@pytest.mark.parametrize(("ranks", "expected"), [
    ([0, 1], "tp"), ([0, 2], "dp"), ([0, 4], "pp"), ([1, 5], "pp"), ([0, 1, 2, 3], "other"),
    (list(range(8)), "world"), ([0, 3], "other")])
def test_groups_from_megatron_order_tp_cp_ep_dp_pp(ranks, expected):
    lay = ParallelLayout(world_size=8, tp=2, pp=2, dp=2)
    assert classify_group(ranks, lay)[0] == expected


def test_groups_with_context_and_expert_parallelism():
    cp = ParallelLayout(world_size=8, tp=2, cp=2, dp=2, pp=1)
    assert classify_group([0, 2], cp)[0] == "cp"
    assert classify_group([0, 4], cp)[0] == "dp"
    assert classify_group([0, 2, 4, 6], cp)[0] == "dp"  # Megatron's dp-cp gradient group
    ep = ParallelLayout(world_size=4, tp=1, dp=4, ep=2, pp=1)
    assert classify_group([0, 1], ep)[0] == "ep"
    assert classify_group([0, 2], ep)[0] == "dp"  # expert data parallel
    assert classify_group([0, 1, 2, 3], ep)[0] == "dp"


def test_group_descriptions_win_and_unknown_layouts_fall_back():
    assert classify_group([0, 1], None, 8, "TENSOR_MODEL_PARALLEL_GROUP") == ("tp", "description")
    assert classify_group([0, 1], None, 8, "EXPERT_MODEL_PARALLEL_GROUP")[0] == "ep"
    assert classify_group([0, 1], None, 8, "DATA_PARALLEL_GROUP_WITH_CP")[0] == "dp"
    assert classify_group([0, 7], None, 8, "EMBEDDING_GROUP")[0] == "other"
    assert classify_group([0, 1], None, 2, "default_pg") == ("world", "all ranks")
    ddp = ParallelLayout(world_size=2, tp=1, pp=1, dp=2)
    assert classify_group([0, 1], ddp, None, "default_pg")[0] == "dp"
    assert classify_group([0, 1], None, 4, "undefined") == ("other", "unknown")
    assert classify_group(None, None, None, None) == ("other", "unknown")


def test_links_from_the_gpu_model_and_placement():
    assert link_for_group([0, 1], {0: "a", 1: "a"}, "NVIDIA H100 80GB HBM3").busbw_gbs == 450.0
    assert link_for_group([0, 1], {0: "a", 1: "a"}, "NVIDIA A100-SXM4-80GB").link == "nvlink3"
    assert link_for_group([0, 1], {0: "a", 1: "b"}, "NVIDIA H200").link == "ib-200g"
    assert link_for_group([0, 1], {}, "NVIDIA H200", nnodes=1).scope == "intra-node"
    assert link_for_group([0, 1], {}, "NVIDIA H200").scope == "unknown"
    c = link_for_group([0, 1], {0: "a", 1: "a"}, "NVIDIA H200", intra_busbw_gbs=300.0)
    assert c.busbw_gbs == 300.0 and c.how.capability is Capability.CONFIGURED
    assert link_how_text(c.how) == "rank placement; configured busbw"
    assert link_for_group([0, 1], {0: "a", 1: "a"}, "Some GPU").busbw_gbs is None


# ---------------------------------------------------------------------------------- recorded


def test_recorded_h200_dumps_with_step_windows_from_the_run():
    """The recorded DDP run (timing on): step boundaries in the ~200 ms sleeps between steps."""
    recs = load_fixture_records("timing")
    steps = []
    for rank in (0, 1):
        ts = sorted(r.time_created_ns for r in recs if r.rank == rank and r.time_created_ns)
        ends = [a + 50 * MS for a, b in itertools.pairwise(ts) if b - a > 100 * MS]
        steps += [step(rank, i, (t - T0) / MS) for i, t in enumerate(ends)]
    a = analyze_collectives("ddp", recs, steps)
    assert a.method == "step_windows" and a.timing
    assert a.n_windows >= 10
    for it in a.iterations:
        for rank, share in it.share_by_rank.items():
            w = next(w for w in step_windows(steps)[0][rank] if w.iteration == it.iteration)
            mine = [r for r in recs if r.rank == rank and r.duration_ms is not None and r.time_created_ns
                    and w.start_ns < r.time_created_ns <= w.end_ns]
            total_ms = sum(r.duration_ms or 0.0 for r in mine)
            # a single stream per group: the union is the sum unless two groups overlap
            assert share * w.ms <= total_ms + 1e-6
            assert share * w.ms >= 0.5 * total_ms
    assert 0 < (a.comm_total_share or 0) < 0.2  # the workload sleeps 200 ms per step
    assert {g["class"] for g in a.groups} == {"world"}


def test_inspector_ops_with_the_same_sequence_number_are_distinct_for_bandwidth():
    # NCCL numbers each op type on its own: all-reduce #0..3 and all-gather #0..3 of one
    # communicator are eight ops, not four.
    def insp(op: str, seq: int, busbw: float) -> CollectiveRecord:
        return CollectiveRecord(job="j", source="nccl_inspector", op=op, raw_op=op, comm_id="0xabc",
                                group_rank=0, group_size=2, nnodes=1, collective_seq_id=seq,
                                bytes=256 << 20, duration_ms=1.0, busbw_gbs=busbw)
    recs = [insp("all_reduce", s, 300.0) for s in range(4)] + [insp("all_gather", s, 100.0) for s in range(4)]
    (b,) = analyze_collectives("j", recs, gpu_name="NVIDIA H200").bandwidth
    assert b.n_ops == 8 and b.ops == {"all_reduce": 4, "all_gather": 4}
    assert b.scope == "intra-node" and b.median_busbw_gbs == 200.0
