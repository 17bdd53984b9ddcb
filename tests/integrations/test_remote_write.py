"""Prometheus remote-write of the aggregator's series (perfd/exporters/remote_write.py).

The wire format is checked by decoding it; retries and drops against a receiver that answers what
the test tells it; the real thing against a real Prometheus (remote-write receiver on) and a real
VictoriaMetrics, fed by a sharded pair of aggregators: every job's derived series is there once.
"""

from __future__ import annotations

import functools
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import cramjam
import pytest
from prometheus_client.core import GaugeMetricFamily, Metric

from perfd.exporters.prompb.gen import remote_pb2 as pb
from perfd.exporters.remote_write import RemoteWriter, encode
from tests.integrations.integrations_helpers import free_port, get, need, stop, wait_for
from tests.test_sharding import ShardedPair, jobs_at, sharded_pair


def _families() -> list[Metric]:
    g = GaugeMetricFamily("perfd_job_step_time_seconds", "step", labels=["job_name"])
    g.add_metric(["a"], 1.5)
    g.add_metric(["b"], float("nan"))
    return [g]


def test_generated_code_is_current() -> None:
    from perfd.exporters.prompb.regen_remote import GEN_DIR, stale_files

    assert not stale_files(GEN_DIR), ("run `python -m perfd.exporters.prompb.regen_remote` and commit the "
                                      "result")


def test_write_request_carries_every_sample_with_sorted_labels() -> None:
    raw, n = encode(_families(), 1_700_000_000_123, {"perfd_aggregator": "h:1", "job_name": "never-wins"})
    req = pb.WriteRequest.FromString(raw)
    assert n == 2 and len(req.timeseries) == 2
    first = req.timeseries[0]
    names = [lb.name for lb in first.labels]
    assert names == sorted(names) == ["__name__", "job_name", "perfd_aggregator"]
    assert {lb.name: lb.value for lb in first.labels} == {
        "__name__": "perfd_job_step_time_seconds", "job_name": "a", "perfd_aggregator": "h:1"}
    assert [(s.value, s.timestamp) for s in first.samples] == [(1.5, 1_700_000_000_123)]


class _Receiver:
    """A receiver answering the status codes it is given, in turn, and keeping what it took."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes
        self.taken: list[pb.WriteRequest] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.headers["Content-Encoding"] == "snappy"
                code = outer.codes.pop(0) if outer.codes else 204
                if code < 300:
                    outer.taken.append(pb.WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body))))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/api/v1/write"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver([])
    yield r
    r.srv.shutdown()


def test_a_5xx_is_retried_in_order_and_a_4xx_dropped_and_counted(receiver: _Receiver) -> None:
    receiver.codes[:] = [503, 204, 400]
    t = [1000.0]
    w = RemoteWriter([receiver.url], _families, clock=lambda: t[0])
    w.tick()  # 503: kept
    st = w.stats()
    (s,) = st.values()
    assert s.samples_sent == 0 and s.requests_failed == 1 and not receiver.taken
    t[0] = 1015.0
    w.tick()  # the kept one goes first (204), then this one (400: dropped for good)
    (s,) = w.stats().values()
    assert [r.timeseries[0].samples[0].timestamp for r in receiver.taken] == [1_000_000]
    assert s.samples_sent == 2 and s.samples_dropped == 2 and s.requests_failed == 2
    t[0] = 1030.0
    w.tick()
    assert len(receiver.taken) == 2 and w.stats()[next(iter(w.stats()))].samples_sent == 4


def test_an_unreachable_receiver_keeps_at_most_the_pending_bound() -> None:
    port = free_port()  # nobody listens
    w = RemoteWriter([f"http://127.0.0.1:{port}/api/v1/write"], _families, max_pending_bytes=1,
                     timeout_s=1.0)
    for _ in range(3):
        w.tick()
    (s,) = w.stats().values()
    assert s.samples_sent == 0 and s.requests_failed == 3
    assert s.samples_dropped == 4  # two rounds of two samples pushed out by the bound; the newest waits


def test_a_bad_url_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="http"):
        RemoteWriter(["ftp://x/y"], _families)


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    got = json.loads(get(f"{url}/api/v1/query?query={quote(expr)}"))
    assert got["status"] == "success", got
    return list(got["data"]["result"])


def _at_least(n: int, url: str, expr: str) -> list[dict[str, Any]] | None:
    rows = _query(url, expr)
    return rows if len(rows) >= n else None


@pytest.mark.slow
def test_a_sharded_pair_in_prometheus_and_victoriametrics_every_job_once(tmp_path: Path) -> None:
    prometheus, vm = need("prometheus"), need("victoria-metrics")
    pport, vport = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    stores = [
        subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{pport}", "--web.enable-remote-write-receiver"],
                         stdout=(tmp_path / "prometheus.out").open("wb"), stderr=subprocess.STDOUT),
        subprocess.Popen([vm, f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{vport}",
                          "-search.latencyOffset=0s"],
                         stdout=(tmp_path / "vm.out").open("wb"), stderr=subprocess.STDOUT),
    ]
    prom_url, vm_url = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{vport}"
    try:
        wait_for(lambda: get(f"{prom_url}/-/ready"), 60, "prometheus ready")
        wait_for(lambda: get(f"{vm_url}/health"), 60, "victoria-metrics ready")
        pair_cm = sharded_pair(tmp_path, ("--remote-write", f"{prom_url}/api/v1/write", "--remote-write",
                                          f"{vm_url}/api/v1/write", "--remote-write-interval", "1"))
        with pair_cm as pair:
            _check_remote_write(pair, prom_url, vm_url)
    finally:
        for p in stores:
            stop(p)


def _check_remote_write(pair: ShardedPair, prom_url: str, vm_url: str) -> None:
    (_, b0), (_, b1) = pair.aggs
    wait_for(lambda: jobs_at(b0) and jobs_at(b1), 60, "both jobs at their shards")
    metric = "perfd_job_step_time_seconds"
    for name, url in (("prometheus", prom_url), ("victoria-metrics", vm_url)):
        rows = wait_for(functools.partial(_at_least, 2, url, metric), 60,
                        f"both jobs' {metric} in {name}")
        by_job = sorted((r["metric"]["job_name"], r["metric"]["perfd_aggregator"]) for r in rows)
        assert [j for j, _ in by_job] == sorted(pair.jobs), f"{name}: each job once, got {by_job}"
        assert len({a for _, a in by_job}) == 2, f"{name}: one job from each shard, got {by_job}"
        own = _query(url, "perfd_aggregator_step_records_total")
        assert len(own) == 2, f"{name}: each aggregator's own series apart, got {own}"
    page = get(f"{b0}/metrics").decode()
    key = "perfd_aggregator_remote_write_samples_total{"
    sent = [ln for ln in page.splitlines() if ln.startswith(key)]
    assert len(sent) == 2 and all(float(ln.rsplit(" ", 1)[1]) > 0 for ln in sent), sent
