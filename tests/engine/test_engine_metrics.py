"""The engine on /metrics: the root's RootStats on the aggregator's /metrics (absent without --engine),
a shard's ShardStats on ``perfd shard --metrics-port`` (loopback, off unless asked), each value read
back through prometheus_client's own parser, as Prometheus reads it."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from perfd.core import catalog, catalog_engine
from perfd.engine import subjects as S
from perfd.engine.engine_state import ConsumerState, EngineState, StreamState
from perfd.engine.root_comm import CommCounts
from perfd.engine.rootfold import RootStats
from perfd.engine.shard import ShardStats
from perfd.engine.shard_comm import CommStats
from perfd.exporters.engine_metrics import RootMetrics, ShardMetrics
from tests.engine.engine_driver import Rig
from tests.procs import NOT_YET, wait_for


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _exposed(collector: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)  # type: ignore[arg-type]
    return _samples(generate_latest(reg).decode())


def test_the_root_exports_its_stats_exactly() -> None:
    st = RootStats(leader=True, partials=7, node_messages=41, redelivered=3, late=2, refused=1, undecodable=4,
                   complete=9, held_back=5, partials_skipped=11, records_skipped=12, events_skipped=13,
                   summaries_skipped=14, summaries=21, summaries_stale=6, summaries_late=8,
                   summaries_holders_dropped=15, summaries_overcounted=16, leadership_lost=17,
                   led_elsewhere=18, jobs_led_elsewhere=2)
    st.lag_s.extend([0.1 * i for i in range(1, 101)])  # 0.1 .. 10.0 s
    eng = EngineState(streams={"nodes": StreamState(12, 3400, 1 << 30), "events": StreamState(5, 900, None)},
                      consumers={"shard-p0": ConsumerState(pending=7, ack_pending=2, redelivered=1)},
                      read_at=1.0, read_errors=3)
    comm = CommCounts(received=31, replaced=20, stale=4, holders_replaced=2, partial_holder=5, refused=3)
    got = _exposed(RootMetrics(st, lambda: eng, comm))
    want = {
        ("perfd_engine_root_comm_summaries_total", ()): 31.0,
        ("perfd_engine_root_comm_holders_replaced_total", ()): 2.0,
        ("perfd_engine_root_comm_summaries_dropped_total", (("reason", "stale"),)): 4.0,
        ("perfd_engine_root_comm_summaries_dropped_total", (("reason", "refused"),)): 3.0,
        ("perfd_engine_root_comm_summaries_dropped_total", (("reason", "partial_holder"),)): 5.0,
        ("perfd_engine_root_leader", ()): 1.0,
        ("perfd_engine_root_leadership_lost_total", ()): 17.0,
        ("perfd_engine_root_partials_total", ()): 7.0,
        ("perfd_engine_root_node_messages_total", ()): 41.0,
        ("perfd_engine_root_redelivered_total", ()): 3.0,
        ("perfd_engine_root_late_total", ()): 2.0,
        ("perfd_engine_root_refused_total", ()): 1.0,
        ("perfd_engine_root_undecodable_total", ()): 4.0,
        ("perfd_engine_root_iterations_complete_total", ()): 9.0,
        ("perfd_engine_root_held_back", ()): 5.0,
        ("perfd_engine_root_summaries_total", ()): 21.0,
        ("perfd_engine_root_skipped_total", (("stream", "partials"),)): 11.0,
        ("perfd_engine_root_skipped_total", (("stream", "records"),)): 12.0,
        ("perfd_engine_root_skipped_total", (("stream", "events"),)): 13.0,
        ("perfd_engine_root_skipped_total", (("stream", "summaries"),)): 14.0,
        ("perfd_engine_root_summaries_dropped_total", (("reason", "stale"),)): 6.0,
        ("perfd_engine_root_summaries_dropped_total", (("reason", "late"),)): 8.0,
        ("perfd_engine_root_summaries_dropped_total", (("reason", "holders_dropped"),)): 15.0,
        ("perfd_engine_root_summaries_overcounted_total", ()): 16.0,
        ("perfd_engine_root_led_elsewhere_total", ()): 18.0,
        ("perfd_engine_root_jobs_led_elsewhere", ()): 2.0,
        ("perfd_engine_stream_messages", (("stream", "nodes"),)): 12.0,
        ("perfd_engine_stream_bytes", (("stream", "nodes"),)): 3400.0,
        ("perfd_engine_stream_limit_bytes", (("stream", "nodes"),)): float(1 << 30),
        ("perfd_engine_stream_messages", (("stream", "events"),)): 5.0,
        ("perfd_engine_stream_bytes", (("stream", "events"),)): 900.0,  # no limit: no limit series
        ("perfd_engine_consumer_pending", (("consumer", "shard-p0"),)): 7.0,
        ("perfd_engine_consumer_ack_pending", (("consumer", "shard-p0"),)): 2.0,
        ("perfd_engine_consumer_redelivered", (("consumer", "shard-p0"),)): 1.0,
        ("perfd_engine_state_read_errors_total", ()): 3.0,
    }
    lag = {k: v for k, v in got.items() if k[0].startswith("perfd_engine_root_completion_lag_")}
    assert {k: v for k, v in got.items() if k not in lag and not k[0].endswith("_created")} == want
    # the same quantiles /api/stats shows (rounded there)
    assert lag == {("perfd_engine_root_completion_lag_p50_seconds", ()): pytest.approx(5.1),
                   ("perfd_engine_root_completion_lag_p99_seconds", ()): pytest.approx(10.0)}
    assert st.to_json()["lag_s"] == {"p50": 5.1, "p99": 10.0, "max": 10.0, "n": 100}
    # every root metric of the catalog comes out, and nothing outside it
    assert {n.removesuffix("_total") for n, _ in got if not n.endswith("_created")} == {
        n.removesuffix("_total") for n, *_ in catalog_engine.ROOT}
    # A job's own root cannot tell what its streams let go, and leaves no job to another root: those
    # series absent, unknown in its stats
    st.reads_every_job = False
    absent = {"perfd_engine_root_skipped_total", "perfd_engine_root_led_elsewhere_total",
              "perfd_engine_root_jobs_led_elsewhere"}
    assert not [k for k in _exposed(RootMetrics(st)) if k[0] in absent]
    doc = st.to_json()
    assert doc["partials_skipped"] is None and doc["led_elsewhere"] is None and doc["node_messages"] == 41


def test_promtool_finds_nothing_to_say_of_the_exposition() -> None:
    """``promtool check metrics``: the names, types and labels as Prometheus' own lint wants them."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    st = RootStats(leader=True, complete=3)
    st.lag_s.extend([0.5, 1.5])
    text = b""
    for collector in (RootMetrics(st, comm=CommCounts(received=2)),
                      ShardMetrics(ShardStats, CommStats(summary_cpu_s=0.5))):
        reg = CollectorRegistry(auto_describe=False)
        reg.register(collector)
        text += generate_latest(reg)
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_lag_series_before_an_iteration_is_whole() -> None:
    got = _exposed(RootMetrics(RootStats()))
    assert not [k for k in got if k[0].startswith("perfd_engine_root_completion_lag_")]
    assert got[("perfd_engine_root_leader", ())] == 0.0


def test_no_stream_series_before_the_engine_was_read() -> None:
    """A root that does not lead (or has not read yet) shows no stream or consumer series: absent, not 0."""
    got = _exposed(RootMetrics(RootStats(), lambda: EngineState(read_errors=2)))
    assert not [k for k in got if k[0].startswith(("perfd_engine_stream_", "perfd_engine_consumer_"))]
    assert got[("perfd_engine_state_read_errors_total", ())] == 2.0


def test_the_shard_exports_its_stats_exactly() -> None:
    st = ShardStats(node_messages=50, delivered_again=9, undecodable=1, partials_published=20,
                    batches_published=6, publish_errors=2, messages_resent=12, leases_taken=4, leases_lost=1,
                    consumer_restarts=3,
                    takeover_waits=2, summaries_published=17, comm_summaries_published=11,
                    partitions=[0, 3, 5], job_infos_read=5, job_info_put_errors=7, job_info_gets_late=8,
                    summaries_restaged=13, stage_rows_dropped=21)
    got = {k: v for k, v in _exposed(ShardMetrics(lambda: st)).items()
           if k[0].startswith("perfd_engine_") and not k[0].endswith("_created")}
    # with --comm-summaries, the summaries' counts beside them (absent without)
    comm = CommStats(rows_in=900, rows_refused=6, rows_evicted=40, summaries=12, summary_errors=1,
                     summary_cpu_s=2.25, saved_messages=31, rows_replayed=250, replays=3, replay_errors=2,
                     purge_errors=4)
    with_comm = {k: v for k, v in _exposed(ShardMetrics(lambda: st, comm)).items()
                 if k[0].startswith("perfd_engine_shard_comm_") and not k[0].endswith("_created")}
    assert with_comm == {
        ("perfd_engine_shard_comm_summaries_published_total", ()): 11.0,
        ("perfd_engine_shard_comm_rows_refused_total", ()): 6.0,
        ("perfd_engine_shard_comm_summarising_errors_total", ()): 1.0,
        ("perfd_engine_shard_comm_summarising_cpu_seconds_total", ()): 2.25,
        ("perfd_engine_shard_comm_saved_messages_total", ()): 31.0,
        ("perfd_engine_shard_comm_rows_read_back_total", ()): 250.0,
        ("perfd_engine_shard_comm_read_back_errors_total", ()): 2.0,
        ("perfd_engine_shard_comm_purge_errors_total", ()): 4.0,
    }
    assert got == {
        ("perfd_engine_shard_node_messages_total", ()): 50.0,
        ("perfd_engine_shard_undecodable_total", ()): 1.0,
        ("perfd_engine_shard_delivered_again_total", ()): 9.0,
        ("perfd_engine_shard_partials_published_total", ()): 20.0,
        ("perfd_engine_shard_batches_published_total", ()): 6.0,
        ("perfd_engine_shard_publish_errors_total", ()): 2.0,
        ("perfd_engine_shard_messages_resent_total", ()): 12.0,
        ("perfd_engine_shard_leases_taken_total", ()): 4.0,
        ("perfd_engine_shard_leases_lost_total", ()): 1.0,
        ("perfd_engine_shard_consumer_restarts_total", ()): 3.0,
        ("perfd_engine_shard_takeover_waits_total", ()): 2.0,
        ("perfd_engine_shard_summaries_published_total", ()): 17.0,
        ("perfd_engine_shard_comm_summaries_published_total", ()): 11.0,
        ("perfd_engine_shard_partitions_held", ()): 3.0,
        ("perfd_engine_shard_job_infos_read_total", ()): 5.0,
        ("perfd_engine_shard_job_info_put_errors_total", ()): 7.0,
        ("perfd_engine_shard_job_info_gets_late_total", ()): 8.0,
        ("perfd_engine_shard_summaries_restaged_total", ()): 13.0,
        ("perfd_engine_shard_stage_rows_dropped_total", ()): 21.0,
    }
    assert {n for n, _ in got} | {n for n, _ in with_comm} == {n for n, *_ in catalog_engine.SHARD}
    assert all(catalog.get(n).source == catalog_engine.SHARD_SOURCE for n, *_ in catalog_engine.SHARD)


def test_an_aggregator_without_engine_serves_no_engine_series(tmp_path: Path) -> None:
    from tests.inproc import pipeline

    with pipeline(tmp_path) as p:
        text = p.get("/metrics").decode()
    assert "perfd_aggregator_" in text  # its own series are there
    assert "perfd_engine_" not in text


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_shard_and_a_root_serve_their_counters(rig: Rig) -> None:
    """Real nats-server, ``perfd aggregator --engine`` and ``perfd shard --metrics-port 0
    --comm-summaries``: the shard
    says where it listens (loopback), and its /metrics shows every shard counter, holding every partition
    once its leases are in; the root's /metrics shows it leads."""
    rig.start_cluster()
    base = rig.start_root()
    log = rig.tmp / "shard-m.out"
    rig.procs.perfd("shard-m", "shard", "--id", "shard-m", "--metrics-port", "0", "--comm-summaries",
                    *rig.engine_args())

    def address() -> str | None:
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+/metrics)", log.read_text())
        return m.group(1) if m else None

    url = wait_for(address, 60, "the shard's /metrics address", ignore=NOT_YET)
    held = ("perfd_engine_shard_partitions_held", ())
    got = wait_for(lambda: (s := _samples(_get(url))).get(held) == rig.partitions and s, 60,
                   "the shard holding every partition on its /metrics", ignore=NOT_YET)
    assert {n for n, *_ in catalog_engine.SHARD} <= {n for n, _ in got}
    assert got[("perfd_engine_shard_leases_taken_total", ())] >= rig.partitions
    assert got[("perfd_engine_shard_publish_errors_total", ())] == 0.0
    leader = ("perfd_engine_root_leader", ())
    root = wait_for(lambda: (s := _samples(_get(base + "/metrics"))).get(leader) == 1.0 and s, 60,
                    "the root leading on /metrics", ignore=NOT_YET)
    assert root[("perfd_engine_root_skipped_total", (("stream", "partials"),))] == 0.0
    # no job yet: the communication summaries' counters there, at 0
    assert root[("perfd_engine_root_comm_summaries_total", ())] == 0.0
    assert root[("perfd_engine_root_comm_summaries_dropped_total", (("reason", "refused"),))] == 0.0
    # the engine's streams and the shard's partition consumers, as the leader reads them (every 15 s)
    consumers = {(n, (("consumer", S.shard_consumer(p)),)) for p in range(rig.partitions)
                 for n in ("perfd_engine_consumer_pending", "perfd_engine_consumer_ack_pending",
                           "perfd_engine_consumer_redelivered")}
    engine = wait_for(lambda: consumers <= set(s := _samples(_get(base + "/metrics"))) and s, 60,
                      "every partition's consumer on the root's /metrics", ignore=NOT_YET)
    nodes = S.STREAM_LABELS[S.NODES_STREAM]
    assert engine[("perfd_engine_stream_limit_bytes", (("stream", nodes),))] == S.NODES_MAX_BYTES
    assert engine[("perfd_engine_state_read_errors_total", ())] == 0.0
