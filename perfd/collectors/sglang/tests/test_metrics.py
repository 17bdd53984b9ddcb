"""A real HTTP /metrics endpoint serving SGLang-style exposition (prometheus_client on 127.0.0.1, an
ephemeral port), scraped twice: the window percentiles must equal a direct computation on the
observations made between the scrapes. Metric names, labels and bucket bounds as SGLang 0.4.9
(srt/metrics/collector.py) defines them; the older time_per_output_token name as 0.3.6 does."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from perfd.analytics.serving.histogram import window_quantile
from perfd.analytics.serving.serving_analysis import summarize
from perfd.analytics.steps.provenance import Code, cite
from perfd.collectors.sglang.metrics import parse_exposition, read_file, scrape

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800]
SCHED = ["model_name", "engine_type", "tp_rank", "pp_rank"]


class Server:
    def __init__(self, itl_name: str = "sglang:inter_token_latency_seconds") -> None:
        self.reg = CollectorRegistry()
        lab = ["model_name"]
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "ttft", lab, buckets=TTFT_BUCKETS,
                              registry=self.reg)
        self.itl = Histogram(itl_name, "itl", lab, buckets=ITL_BUCKETS, registry=self.reg)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "e2e", lab, buckets=E2E_BUCKETS,
                             registry=self.reg)
        self.prompt = Counter("sglang:prompt_tokens_total", "p", lab, registry=self.reg)
        self.gen = Counter("sglang:generation_tokens_total", "g", lab, registry=self.reg)
        self.cached = Counter("sglang:cached_tokens_total", "c", lab, registry=self.reg)
        self.running = Gauge("sglang:num_running_reqs", "r", SCHED, registry=self.reg)
        self.queue = Gauge("sglang:num_queue_reqs", "q", SCHED, registry=self.reg)
        self.usage = Gauge("sglang:token_usage", "u", SCHED, registry=self.reg)
        for tp in ("0", "1"):  # both TP ranks report the same scheduler numbers
            self.running.labels("m", "unified", tp, "0").set(12)
            self.queue.labels("m", "unified", tp, "0").set(3)
            self.usage.labels("m", "unified", tp, "0").set(0.42)
        self.httpd, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.reg)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/metrics"

    def observe(self, ttft: Sequence[float], itl: Sequence[float], e2e: Sequence[float]) -> None:
        for x in ttft:
            self.ttft.labels("m").observe(x)
        for x in itl:
            self.itl.labels("m").observe(x)
        for x in e2e:
            self.e2e.labels("m").observe(x)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def direct_quantile(q: float, obs: Sequence[float], bounds: Sequence[float]) -> float:
    """Written out independently of perfd: bucket the observations, then Prometheus' interpolation."""
    les = [*bounds, math.inf]
    cum = [sum(1 for x in obs if x <= le) for le in les]
    rank = q * len(obs)
    b = next(i for i, c in enumerate(cum) if c >= rank)
    if b == len(les) - 1:
        return les[-2]
    lo = 0.0 if b == 0 else les[b - 1]
    below = 0 if b == 0 else cum[b - 1]
    return lo + (les[b] - lo) * (rank - below) / (cum[b] - below)


def bucket_of(x: float, bounds: Sequence[float]) -> tuple[float, float]:
    les = [*bounds, math.inf]
    i = next(i for i, le in enumerate(les) if x <= le)
    return (0.0 if i == 0 else les[i - 1]), les[i]


def test_window_percentiles_match_a_direct_computation(server: Server) -> None:
    rng = random.Random(7)
    # before the first scrape: a slow phase that must not leak into the window
    server.observe([rng.uniform(5, 30) for _ in range(300)], [rng.uniform(0.2, 0.9) for _ in range(3000)],
                   [rng.uniform(20, 90) for _ in range(300)])
    first, err = scrape(server.url, 1000.0)
    assert first is not None and err is None, err
    ttft = [rng.lognormvariate(-1.0, 0.8) for _ in range(500)]
    itl = [rng.lognormvariate(-4.0, 0.5) for _ in range(20000)] + [rng.uniform(0.2, 0.5) for _ in range(150)]
    e2e = [rng.lognormvariate(1.5, 0.6) for _ in range(500)]
    server.observe(ttft, itl, e2e)
    server.prompt.labels("m").inc(100_000)
    server.cached.labels("m").inc(25_000)
    server.gen.labels("m").inc(40_000)
    second, err = scrape(server.url, 1020.0)
    assert second is not None and err is None, err
    for name, obs, bounds in (("sglang:time_to_first_token_seconds", ttft, TTFT_BUCKETS),
                              ("sglang:inter_token_latency_seconds", itl, ITL_BUCKETS),
                              ("sglang:e2e_request_latency_seconds", e2e, E2E_BUCKETS)):
        for q in (0.5, 0.9, 0.99):
            got = window_quantile(q, name, second, first)
            assert got.observations == len(obs)
            assert got.value == pytest.approx(direct_quantile(q, obs, bounds), rel=1e-12), (name, q)
            # the estimate lies in the bucket of the true (nearest-rank) percentile
            true = sorted(obs)[max(math.ceil(q * len(obs)) - 1, 0)]
            lo, hi = bucket_of(true, bounds)
            assert got.value is not None and lo <= got.value <= hi, (name, q, true, got.value)
            assert got.method is not None and got.method.args[2] == cite(Code.SG_BUCKETS_DELTA, 20.0)
        lifetime = window_quantile(0.99, name, second, None)
        assert lifetime.observations > len(obs) and lifetime.method is not None
        assert lifetime.method.args[2] == cite(Code.SG_BUCKETS_LIFETIME)
    # the same numbers through the summary: gauges de-duplicated over TP ranks, counters as rates
    s = summarize([], scrape=second, prev_scrape=first)
    assert s.value("running_requests") == 12 and s.value("queued_requests") == 3
    assert s.value("kv_usage") == pytest.approx(0.42)
    assert s.value("gen_throughput") == pytest.approx(40_000 / 20)
    assert s.value("input_throughput") == pytest.approx(75_000 / 20)  # computed = prompt − cached
    assert s.value("prefix_hit") == pytest.approx(0.25)
    assert s.value("itl_p99") == pytest.approx(direct_quantile(0.99, itl, ITL_BUCKETS))
    assert s.value("itl_p99") > 3 * s.value("itl_p50")  # type: ignore[operator]


def test_older_time_per_output_token_name_is_used() -> None:
    srv = Server(itl_name="sglang:time_per_output_token_seconds")
    try:
        srv.observe([0.7], [], [])  # a TTFT before the window: the series exists, the window has none
        first, _ = scrape(srv.url, 0.0)
        obs = [0.01, 0.02, 0.02, 0.03, 0.5]
        srv.observe([], obs, [])
        second, _ = scrape(srv.url, 10.0)
        assert first is not None and second is not None
        s = summarize([], scrape=second, prev_scrape=first)
        assert s.value("itl_p50") == pytest.approx(direct_quantile(0.5, obs, ITL_BUCKETS))
        assert "time_per_output_token_seconds" in str(s.values["itl_p50"].source)
        assert s.value("ttft_p50") is None and s.values["ttft_p50"].reason == cite(
            Code.SG_NO_OBSERVATIONS_OF, "sglang:time_to_first_token_seconds")
    finally:
        srv.close()


def test_one_scrape_gives_no_window_percentiles_unless_lifetime_is_asked(server: Server) -> None:
    server.observe([0.3, 0.5], [0.01], [1.0])
    snap, _ = scrape(server.url, 5.0)
    assert snap is not None
    live = summarize([], scrape=snap)
    assert live.value("ttft_p50") is None and live.values["ttft_p50"].reason == cite(Code.SG_TWO_SCRAPES)
    assert live.value("gen_throughput") is None  # a counter rate needs two scrapes
    offline = summarize([], scrape=snap, lifetime_percentiles=True)
    assert offline.value("ttft_p50") == pytest.approx(direct_quantile(0.5, [0.3, 0.5], TTFT_BUCKETS))


def test_exposition_parsing_edge_cases(tmp_path) -> None:
    reg = CollectorRegistry()
    Gauge("other:thing", "x", registry=reg).set(1)
    h = Histogram("sglang:e2e_request_latency_seconds", "e", ["model_name"], buckets=[1, 2], registry=reg)
    h.labels("a").observe(1.5)
    text = generate_latest(reg).decode()
    snap = parse_exposition(text, 1.0, "mem")
    assert "other:thing" not in snap.gauges  # only sglang: names
    assert not any(k.endswith("_created") for k in (*snap.gauges, *snap.counters))
    (series,) = snap.histograms["sglang:e2e_request_latency_seconds"]
    assert series.buckets == ((1.0, 0.0), (2.0, 1.0), (math.inf, 1.0))
    assert series.count == 1 and series.sum == 1.5
    bad = parse_exposition("sglang:x{le=\"1\"} 1\nthis is not { exposition", 1.0, "bad")
    assert bad.issues and "unparseable" in bad.issues[0]
    no_inf = parse_exposition("sglang:h_bucket{le=\"1\"} 1\n", 1.0, "x")
    assert no_inf.histograms == {} and "no +Inf bucket" in no_inf.issues[0]
    p = tmp_path / "m.txt"
    p.write_text(text)
    from_file, err = read_file(p, 3.0)
    assert err is None and from_file is not None and from_file.time == 3.0
    assert read_file(tmp_path / "missing.txt", 0.0)[1] == "read-failed:FileNotFoundError"
    assert scrape("http://127.0.0.1:9/metrics", 0.0, timeout_s=0.5)[1] is not None  # nothing listens on 9
