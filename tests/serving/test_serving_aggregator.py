"""Serving is analysed on the aggregator from the records the agent sends
(perfd.core.serving_records.ServingData through the transport's event codec), with the same numbers as
``perfd analyze sglang`` offline."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perfd.aggregator.serving import ServingStore
from perfd.aggregator.snapshot import overview_of
from perfd.aggregator.state import AggregatorState
from perfd.analytics.serving.serving_analysis import analyze_serving
from perfd.collectors.sglang import parse_file
from perfd.core.clock import ManualClock
from perfd.core.events import SERVING_DATA
from perfd.core.serving_records import (
    HistogramSeries,
    MetricsSnapshot,
    ServerInfo,
    ServingData,
    ServingRecord,
)
from perfd.core.typed import obj
from perfd.report.serving_report import build_serving_report
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import event_from_pb, event_to_pb

LOG = Path(__file__).resolve().parents[2] / "perfd/collectors/sglang/tests/data/sglang_0_5_5_dp2.log"
CFG = {"window_s": 1e9, "gpu": "NVIDIA H100 80GB HBM3", "model": {"params": 8.03e9, "dtype": "bf16"}}


def _wire(data: ServingData) -> dict[str, object]:
    """One event through the transport's protobuf encoding, as the aggregator receives it."""
    m = pb.Event()
    event_to_pb({"kind": SERVING_DATA.name, "job": data.job, "time": 1.0, "payload": data.to_json()}, m)
    ev = event_from_pb(pb.Event.FromString(m.SerializeToString()))
    assert ev["kind"] == SERVING_DATA.name
    return dict(ev)


def _snapshot() -> MetricsSnapshot:
    lab = (("model_name", "llama"), ("tp_rank", "0"))
    return MetricsSnapshot(
        50.0, "http://x/metrics", {"sglang:num_running_reqs": [(lab, 12.0)]},
        {"sglang:generation_tokens_total": [(lab, 500.0)]},
        {"sglang:time_to_first_token_seconds": [
            HistogramSeries(lab, ((0.1, 1.0), (0.2, 4.0), (math.inf, 4.0)), 4.0, 0.75)]}, ["one issue"])


def test_serving_data_round_trips_through_the_transport() -> None:
    parsed = parse_file(LOG)
    data = ServingData("llm", parsed.records, parsed.server, _snapshot(), CFG)
    back = ServingData.from_json(_wire(data)["payload"])  # type: ignore[arg-type]
    assert back == data
    assert back.scrape is not None and math.isinf(back.scrape.histograms[
        "sglang:time_to_first_token_seconds"][0].buckets[-1][0])


def test_aggregator_numbers_equal_the_offline_analysis() -> None:
    parsed = parse_file(LOG)
    offline = analyze_serving("llm", parsed.records, parsed.server, gpu_name=CFG["gpu"],  # type: ignore[arg-type]
                              spec=None, lifetime_percentiles=False)
    state = AggregatorState()
    half = len(parsed.records) // 2
    for chunk, server in ((parsed.records[:half], parsed.server), (parsed.records[half:], None)):
        ev = _wire(ServingData("llm", chunk, server, None, {k: v for k, v in CFG.items() if k != "model"}))
        state.ingest_events("agent-1", [ev])
    got = state.serving_view("llm")
    assert got is not None and got.report is not None
    view = got.to_json()
    assert view["metrics"] == pytest.approx(offline.summary.job_metrics())
    assert obj(view["metrics"])["perfd_serving_running_requests"] == pytest.approx(2 * (8 + 16 + 16 + 16) / 4)
    assert view["report"] == build_serving_report(offline).to_json()
    assert str(view["source"]).startswith("collectors/sglang") and view["report_age_s"] is not None
    # the data is state, not history; the job knows its agent
    assert state.recent_events("llm") == [] and overview_of(state.snapshot("llm"))["agents"] == ["agent-1"]  # type: ignore[index]
    assert state.stats_json()["serving_records_ingested"] == len(parsed.records)


def test_bad_payloads_are_refused_and_counted() -> None:
    store = ServingStore()
    assert store.ingest({"records": []}) is None  # no job
    assert store.ingest({"job": "j", "records": [{"kind": "decode", "no_such_field": 1}]}) is None
    assert store.ingest({"job": "j", "config": {"model": {"parms": 1}}}) is None  # unknown spec key
    assert store.ingest("not a mapping") is None
    assert store.errors == {"bad-payload": 3, "bad-config": 1}
    assert store.view("j") is None and store.rows() == []
    ok = ServingData("j", [ServingRecord("decode", line_no=1, time=10.0, running_req=4)], ServerInfo())
    assert store.ingest(ok.to_json()) == "j"
    assert store.view("j").metrics["perfd_serving_running_requests"] == 4  # type: ignore[union-attr]


def test_analysis_is_cached_until_data_arrives() -> None:
    clock = ManualClock(100.0)
    store = ServingStore(min_recompute_s=5.0, clock=clock)
    rec = ServingRecord("decode", line_no=1, time=10.0, running_req=4)
    store.ingest(ServingData("j", [rec]).to_json())
    assert store.view("j").metrics["perfd_serving_running_requests"] == 4  # type: ignore[union-attr]
    store.ingest(ServingData("j", [ServingRecord("decode", line_no=2, time=11.0, running_req=8)]).to_json())
    assert store.view("j").metrics["perfd_serving_running_requests"] == 4  # type: ignore[union-attr]
    clock.advance(5.0)
    v = store.view("j")
    assert v is not None and v.metrics["perfd_serving_running_requests"] == 6 and v.report_age_s == 0
