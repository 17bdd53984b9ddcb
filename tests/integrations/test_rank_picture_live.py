"""The goodput and rank-picture panels of deploy/grafana/perfd-dashboard.json answer against a real
Prometheus scraping a real aggregator fed by the recorded co-tenant straggler log (DP=2, per-rank
timers): each panel's query, as the dashboard holds it, returns the series the panel draws."""

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

from perfd.analytics.steps.goodput import KINDS
from perfd.core import catalog
from perfd.core.limits import RANK_RATIO_TOP_K
from tests.integrations.integrations_helpers import (
    ROOT,
    Live,
    free_port,
    get,
    need,
    start_live,
    stop,
    wait_for,
)

pytestmark = pytest.mark.slow

COTENANT = ROOT / "tests" / "data" / "incidents" / "costraggler_dp2" / "dp2_cotenant.log"
DASHBOARD = ROOT / "deploy" / "grafana" / "perfd-dashboard.json"
PANELS = ("Goodput", "Where the wall time went", "Ranks by compute ÷ stage median (any rank count)",
          "Slowest ranks", "Step budget (seconds per step, by part)", "Step budget now (share of the step)")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from start_live(tmp_path_factory.mktemp("picture"), job="costraggler", log_source=COTENANT)


def _panel_queries(job: str) -> dict[str, str]:
    d = json.loads(DASHBOARD.read_text())
    out = {}
    for p in d["panels"]:
        if p["title"] in PANELS:
            expr = p["targets"][0]["expr"]
            out[p["title"]] = expr.replace("$job_name", job).replace("$__rate_interval", "1m")
    assert set(out) == set(PANELS)
    return out


def _query(base: str, q: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_goodput_and_rank_picture_panels_answer(live: Live, tmp_path: Path) -> None:
    text = get(f"{live.aggregator_url}/metrics").decode()
    served: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            served[(s.name, tuple(sorted(s.labels.items())))] = s.value
    job = (("job_name", live.job),)
    summary = json.loads(get(f"{live.aggregator_url}/api/jobs/{live.job}/summary"))
    gp = summary["goodput"]
    times = {k: served[(catalog.JOB_TIME, (("job_name", live.job), ("kind", k)))] for k in KINDS}
    assert math.isclose(sum(times.values()), gp["wall_s"], rel_tol=1e-9)
    assert times["incident"] > 10 and times["startup"] > 0
    assert math.isclose(served[(catalog.GOODPUT_RATIO, job)], gp["ratio"], rel_tol=1e-12)
    assert served[(catalog.RANK_RATIO_RANKS + "_bucket", (("job_name", live.job), ("le", "+Inf")))] == 2.0
    assert served[(catalog.RANK_RATIO_RANKS + "_gcount", job)] == 2.0
    r = subprocess.run([need("promtool"), "check", "metrics"], input=text.encode(), capture_output=True,
                       timeout=30)
    found = [ln for ln in (r.stdout + r.stderr).decode().splitlines()
             if any(n in ln for n in (catalog.GOODPUT_RATIO, catalog.JOB_TIME, catalog.RANK_RATIO_TOP,
                                      catalog.RANK_RATIO_RANKS))]
    assert not found, found  # promtool has nothing to say of the new series

    prometheus = need("prometheus")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: perfd-aggregator
    static_configs: [{{targets: ["{live.aggregator_url.removeprefix('http://')}"]}}]
""")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = tmp_path / "prometheus.out"
    proc = subprocess.Popen([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(lambda: get(f"{base}/-/ready") is not None, 30, "Prometheus ready")
        queries = _panel_queries(live.job)
        # Two scrapes at least, so that increase() over the counters has two points.
        wait_for(lambda: len(_query(base, f"count_over_time({catalog.GOODPUT_RATIO}[1m])")) == 1 and int(
            _query(base, f"count_over_time({catalog.GOODPUT_RATIO}[1m])")[0]["value"][1]) >= 2, 30,
            "two scrapes of the aggregator")
        ratio = _query(base, queries["Goodput"])
        assert len(ratio) == 1 and math.isclose(float(ratio[0]["value"][1]), gp["ratio"], rel_tol=1e-12)
        split = _query(base, queries["Where the wall time went"])
        assert {r["metric"]["kind"] for r in split} == set(KINDS)
        heat = _query(base, queries["Ranks by compute ÷ stage median (any rank count)"])
        by_le = {r["metric"]["le"]: float(r["value"][1]) for r in heat}
        assert len(by_le) == len(catalog.RANK_RATIO_BUCKETS) and by_le["+Inf"] == 2.0
        counts = [by_le[k] for k in sorted(by_le, key=float)]
        assert counts == sorted(counts)  # cumulative over le, as the heatmap reads it
        top = _query(base, queries["Slowest ranks"])
        assert 1 <= len(top) <= RANK_RATIO_TOP_K and {r["metric"]["rank"] for r in top} <= {"0", "1"}
        # The step budget's panels: a series per part, in seconds per step and as shares, equal to
        # the budget the job's summary holds (from its timers here: no capture of this job).
        budget = {p["part"]: p for p in summary["summary"]["step_budget"]["parts"]}
        secs = {r["metric"]["part"]: float(r["value"][1])
                for r in _query(base, queries["Step budget (seconds per step, by part)"])}
        shares = {r["metric"]["part"]: float(r["value"][1])
                  for r in _query(base, queries["Step budget now (share of the step)"])}
        assert set(secs) == set(shares) == set(budget) and "compute" in budget
        for part, p in budget.items():
            assert math.isclose(secs[part], p["ms"] / 1e3, rel_tol=1e-9)
            assert math.isclose(shares[part], p["share"], rel_tol=1e-9)
        assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-9)
    finally:
        rc = stop(proc)
        assert rc == 0, out.read_text()[-3000:]
