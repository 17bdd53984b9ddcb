"""Real programs on loopback: `perfd aggregator` + `perfd agent` (the shipped Megatron log and NVML
recording), their /metrics linted by `promtool check metrics`, scraped by a real Prometheus that also
evaluates deploy/prometheus/perfd.rules.yml, and the HTML report made from the live aggregator."""

from __future__ import annotations

import json
import math
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perfd.app.cli import main as perfd_main
from perfd.core import catalog
from tests.integrations.integrations_helpers import (
    RULES,
    Live,
    free_port,
    get,
    need,
    start_live,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prometheus_live")]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from start_live(tmp_path_factory.mktemp("live"))


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("endpoint", ["aggregator", "agent"])
def test_promtool_check_metrics_passes(live: Live, endpoint: str) -> None:
    promtool = need("promtool")
    url = live.aggregator_url if endpoint == "aggregator" else live.agent_url
    text = get(f"{url}/metrics")
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    # promtool prints one line per problem (naming, units, HELP, counters without _total) and exits 1.
    # One finding is by design: DCGM-exporter's camelCase modelName, on the one info series per GPU
    # made for joins with it (catalog.DCGM_INFO_IDENTITY; docs/prometheus.md).
    allowed = {f"{catalog.GPU_INFO} label names should be written in 'snake_case' not 'camelCase'"}
    found = [ln.strip() for ln in (r.stdout + r.stderr).decode().splitlines() if ln.strip()]
    assert (r.returncode == 0 or found) and not set(found) - allowed, \
        f"promtool check metrics on the {endpoint}:\n{r.stdout.decode()}{r.stderr.decode()}"
    names = {name for name, _ in _samples(text.decode())}
    if endpoint == "aggregator":
        assert {"perfd_job_mfu_ratio", "perfd_job_step_time_seconds",
                "perfd_aggregator_samples_total"} <= names
        # The agent serves its node's series; the aggregator does not repeat them (no doubled sums).
        assert not {n for n in names if n.startswith(("perfd_gpu_", "perfd_host_"))}
    else:
        assert {"perfd_gpu_sm_util_ratio", "perfd_agent_cpu_seconds_total",
                "perfd_agent_spool_dropped_samples_total"} <= names


def _prom_query(base: str, query: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{base}/api/v1/query?query={urllib.parse.quote(query)}"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_real_prometheus_scrapes_agent_and_aggregator(live: Live, tmp_path: Path) -> None:
    prometheus = need("prometheus")
    agg_target = live.aggregator_url.removeprefix("http://")
    agent_target = live.agent_url.removeprefix("http://")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: perfd-agent
    static_configs: [{{targets: ["{agent_target}"]}}]
  - job_name: perfd-aggregator
    static_configs: [{{targets: ["{agg_target}"]}}]
""")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = tmp_path / "prometheus.out"
    proc = subprocess.Popen([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
                            stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(lambda: get(f"{base}/-/ready") is not None, 30, "Prometheus ready")

        def both_up() -> list[dict[str, Any]] | None:
            res = _prom_query(base, 'up{job=~"perfd-.*"}')
            return res if len(res) == 2 and all(r["value"][1] == "1" for r in res) else None

        ups = wait_for(both_up, 30, "up == 1 for the agent and the aggregator")
        assert {r["metric"]["job"] for r in ups} == {"perfd-agent", "perfd-aggregator"}

        # Job metrics: what Prometheus stored equals what the aggregator serves. The log was
        # ingested completely before Prometheus started, so the values no longer change.
        agg = _samples(get(f"{live.aggregator_url}/metrics").decode())
        key = ("perfd_job_mfu_ratio", (("job_name", live.job),))
        assert key in agg and 0 < agg[key] < 1
        res = wait_for(lambda: _prom_query(base, f'perfd_job_mfu_ratio{{job_name="{live.job}"}}'), 20,
                       "perfd_job_mfu_ratio in Prometheus")
        assert len(res) == 1 and res[0]["metric"]["job"] == "perfd-aggregator"
        assert math.isclose(float(res[0]["value"][1]), agg[key], rel_tol=1e-12)
        step = _prom_query(base, f'perfd_job_step_time_seconds{{job_name="{live.job}"}}')
        assert math.isclose(float(step[0]["value"][1]),
                            agg[("perfd_job_step_time_seconds", (("job_name", live.job),))], rel_tol=1e-12)
        it = _prom_query(base, f'perfd_job_iteration{{job_name="{live.job}"}}')
        assert float(it[0]["value"][1]) == live.last_iteration

        # A GPU metric arrives once, from the agent's scrape job (the aggregator leaves node series
        # out unless --export-node-series), equal to the agent's value; a sum counts each GPU once.
        # (The memory total is constant in the NVML recording; utilisations move with its clock.)
        agent = _samples(get(f"{live.agent_url}/metrics").decode())
        gpu_rows = _prom_query(base, f'perfd_gpu_memory_total_bytes{{job_name="{live.job}"}}')
        assert [r["metric"]["job"] for r in gpu_rows] == ["perfd-agent"]
        for r in gpu_rows:
            m = dict(r["metric"])
            served = agent if m.pop("job") == "perfd-agent" else agg
            m.pop("instance")
            name = m.pop("__name__")
            assert math.isclose(float(r["value"][1]), served[(name, tuple(sorted(m.items())))], rel_tol=1e-12)
            assert m["node"] == "itest-node" and m["replay"] == "1"

        # The rules evaluate without errors on real series; MFU 8% makes the MFU alert pending.
        def rules_ok() -> list[dict[str, Any]] | None:
            groups = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return rules if rules and all(r["health"] == "ok" for r in rules) else None

        rules = wait_for(rules_ok, 20, "every rule evaluated with health ok")
        assert len(rules) >= 25
        rec = wait_for(lambda: _prom_query(base, "job_name:perfd_job_mfu_ratio:avg_over_time_10m"), 10,
                       "the MFU recording rule")
        assert rec[0]["metric"] == {"__name__": "job_name:perfd_job_mfu_ratio:avg_over_time_10m",
                                    "job_name": live.job}

        def mfu_alert() -> list[dict[str, Any]] | None:
            alerts = json.loads(get(f"{base}/api/v1/alerts"))["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "PerfdJobMFULow"] or None

        alert = wait_for(mfu_alert, 15, "PerfdJobMFULow pending")[0]
        assert alert["state"] == "pending" and alert["labels"]["job_name"] == live.job  # for: 15m
        # No perfd target is down, nothing is dropped.
        alerts = json.loads(get(f"{base}/api/v1/alerts"))["data"]["alerts"]
        firing = [a["labels"]["alertname"] for a in alerts]
        assert "PerfdTargetDown" not in firing and "PerfdAgentSpoolDropping" not in firing
    finally:
        rc = stop(proc)
        assert rc == 0, out.read_text()[-3000:]


def test_iterations_endpoint_and_html_report_from_the_aggregator(live: Live, tmp_path: Path) -> None:
    its = json.loads(get(f"{live.aggregator_url}/api/jobs/{live.job}/iterations"))
    assert its["job_name"] == live.job
    assert [i["iteration"] for i in its["iterations"]] == list(range(1, live.last_iteration + 1))
    summary = json.loads(get(f"{live.aggregator_url}/api/jobs/{live.job}/summary"))
    assert its["iterations"][-1] == summary["latest"]
    slim = json.loads(get(f"{live.aggregator_url}/api/jobs/{live.job}/iterations?sources=0"))
    assert slim["iterations"][-1] == {k: v for k, v in summary["latest"].items() if k != "sources"}
    with pytest.raises(Exception, match="404"):
        get(f"{live.aggregator_url}/api/jobs/no-such-job/iterations")

    out = tmp_path / "report.html"
    argv = ["report", "--job", live.job, "--aggregator", live.aggregator_url, "--html", str(out)]
    assert perfd_main(argv) == 0
    page = out.read_text()
    mfu = summary["summary"]["medians"]["mfu"]
    assert f"{mfu:.1%}" in page and "Step time per iteration" in page and "Time breakdown" in page
    assert f"source: live, the aggregator at {live.aggregator_url}, job {live.job}" in page
    assert page.count("<svg") >= 4
