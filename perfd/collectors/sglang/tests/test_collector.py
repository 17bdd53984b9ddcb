"""The agent-side collector: tail a growing log, scrape a live endpoint, send plain records.

The serving gauges are computed on the aggregator (perfd/aggregator/serving.py) from what the
collector sends; these tests feed the collector's events to that store and check the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.aggregator.serving import ServingStore
from perfd.collectors.collector import Collected, Registry
from perfd.collectors.sglang import register
from perfd.collectors.sglang.collector import SglangCollector
from perfd.collectors.sglang.tests.test_metrics import Server
from perfd.core import catalog
from perfd.core.events import SERVING_DATA
from perfd.core.serving_records import ServingData

DATA = Path(__file__).parent / "data"


def _feed(store: ServingStore, out: Collected) -> None:
    assert out.samples == []  # the agent sends records; the aggregator computes the gauges
    for ev in out.events:
        assert ev["kind"] == SERVING_DATA.name
        assert store.ingest(ev["payload"]) == ev["job"]


def _gauges(store: ServingStore, job: str) -> dict[str, float]:
    return {name: v for labels, name, v in store.rows() if labels == {"job_name": job}}


def test_register_and_config_validation(tmp_path: Path) -> None:
    reg = Registry()
    register(reg)
    assert "sglang" in reg.names()
    c = reg.create("sglang", {"log_path": str(tmp_path / "x.log"), "job": "llm"})
    assert isinstance(c, SglangCollector) and c.job == "llm"
    cap = c.probe()
    assert cap.available and "does not exist yet" in cap.reason
    with pytest.raises(ValueError, match="log_path"):
        SglangCollector({})
    with pytest.raises(ValueError, match="unknown config key"):
        SglangCollector({"log_path": "x", "logpath": "y"})
    with pytest.raises(ValueError, match="unknown model spec key"):
        SglangCollector({"log_path": "x", "model": {"parms": 8e9}})


def test_tails_a_growing_log_and_the_aggregator_computes_job_gauges(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = (DATA / "sglang_0_5_5_dp2.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:9]))  # start-up and the first prefill line
    c = SglangCollector({"log_path": str(log), "job": "llm", "from_start": True, "gpu": "NVIDIA H100 80GB "
                                                                                        "HBM3",
                         "model": {"params": 8.03e9, "dtype": "bf16"}})
    store = ServingStore(min_recompute_s=0.0)
    c.start()
    out = c.collect(1000.0)
    assert c.server is not None and c.server.max_running_requests == 4096
    _feed(store, out)
    first = _gauges(store, "llm")
    assert first["perfd_serving_prefix_cache_hit_ratio"] == 0.0
    with log.open("a") as fh:
        fh.writelines(lines[9:])
    out = c.collect(1002.0)
    _feed(store, out)
    assert ServingData.from_json(out.events[0]["payload"]).server is None  # sent once, not due again
    got = _gauges(store, "llm")
    for name in got:
        assert catalog.get(name).labels == ("job_name",)
    assert got["perfd_serving_running_requests"] == pytest.approx(2 * (8 + 16 + 16 + 16) / 4)
    assert got["perfd_serving_kv_cache_usage_ratio"] == pytest.approx((2 * 0.02 + 4 * 0.04) / 6)
    assert "perfd_serving_decode_mbu_ratio" in got and "perfd_serving_ttft_p99_seconds" not in got
    assert c.errors == {"parse:bad-value": 1, "parse:truncated-batch-line": 1}
    assert c.collect(1004.0).events == []  # nothing new: nothing sent
    view = store.view("llm")
    assert view is not None and view.metrics == got and view.report is not None and view.report.summary.status
    c.stop()


def test_scrapes_the_metrics_endpoint() -> None:
    srv = Server()
    store = ServingStore(min_recompute_s=0.0)
    try:
        c = SglangCollector({"metrics_url": srv.url, "job": "llm", "scrape_interval_s": 0.001})
        c.start()
        srv.observe([0.3], [0.01], [1.0])
        _feed(store, c.collect(10.0))
        assert "perfd_serving_ttft_p50_seconds" not in _gauges(store, "llm")
        srv.observe([0.15, 0.15, 0.15], [0.005] * 10, [0.5])
        srv.gen.labels("m").inc(500)
        _feed(store, c.collect(20.0))
        names = _gauges(store, "llm")
        assert names["perfd_serving_ttft_p50_seconds"] == pytest.approx(0.15)  # 1.5 of 3 in (0.1, 0.2]
        assert names["perfd_serving_gen_throughput_tokens_per_second"] == pytest.approx(50.0)
        assert names["perfd_serving_running_requests"] == 12
    finally:
        srv.close()
    bad = SglangCollector({"metrics_url": "http://127.0.0.1:9/metrics", "scrape_timeout_s": 0.5})
    bad.start()
    out = bad.collect(1.0)
    assert out.samples == [] and out.events == []
    assert list(bad.errors) == ["scrape:fetch-failed:URLError"]


def test_sample_yaml_is_a_valid_config() -> None:
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "sample.yaml").read_text())
    c = SglangCollector(cfg)
    assert c.job == "llama-8b-serve" and c.spec.params == 8.03e9 and c.window_s == 60


def test_nothing_is_sent_while_catching_up_on_an_old_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text((DATA / "sglang_0_5_5_dp2.log").read_text())
    c = SglangCollector({"log_path": str(log), "max_bytes_per_collect": 1024})
    c.start()
    first = c.collect(1.0)
    assert first.events == [] and c.counts["catching_up"] == 1 and c.errors == {}
    while not (out := c.collect(2.0)).events:
        pass
    assert c.server is not None and c.server.max_running_requests == 4096
    assert c.counts["catching_up"] >= 3
    data = [ServingData.from_json(ev["payload"]) for ev in out.events]
    assert data[0].server is not None and data[0].server.max_running_requests == 4096
    assert sum(len(d.records) for d in data) == c.counts["records_sent"] > 0


def test_records_older_than_the_window_are_not_sent_after_catching_up(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text((DATA / "sglang_0_5_5_dp2.log").read_text())  # batch lines span 42 s
    c = SglangCollector({"log_path": str(log), "max_bytes_per_collect": 512, "window_s": 10})
    c.start()
    while not (out := c.collect(2.0)).events:
        pass
    sent = [r for ev in out.events for r in ServingData.from_json(ev["payload"]).records]
    times = [r.time for r in sent if r.time is not None]
    assert c.counts["records_pruned"] > 0 and sent and max(times) - min(times) <= 10
    assert c.counts["records_sent"] == len(sent)
