"""deploy/grafana/perfd-dashboard.json: valid dashboard JSON whose every query references only
metrics (and labels) perfd exports. Grafana itself is not in Debian; no Grafana server test runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import yaml

from perfd.core import catalog
from tests.integrations.integrations_helpers import (
    KNOWN_LABELS,
    ROOT,
    catalog_problems,
    promql_label_names,
    promql_metric_names,
)

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "perfd-dashboard.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def _dash() -> dict[str, Any]:
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d, dict)
    return d


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])


def _queries(d: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target, annotation and template-variable query."""
    for p in _panels(d["panels"]):
        for t in p.get("targets") or []:
            yield f"panel {p['id']} {p['title']!r}", t["expr"]
    for a in d["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation {a['name']!r}", a["expr"]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable {v['name']}", v["query"]["query"] if isinstance(v["query"], dict) else v["query"]


def test_dashboard_shape() -> None:
    d = _dash()
    assert 36 <= d["schemaVersion"] <= 41
    assert d["uid"] and d["title"]
    panels = list(_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"job_name", "node"} <= set(variables)
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"] == DS, f"panel {p['id']} must use the ${{DS_PROMETHEUS}} variable"
        assert p["targets"] and all(t["datasource"] == DS for t in p["targets"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
    # No two panels overlap on the grid.
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap"
                cells[(x, y)] = p["id"]


def test_dashboard_has_the_views_the_issue_asks_for() -> None:
    d = _dash()
    by_type: dict[str, list[str]] = {}
    exprs = " ".join(e for _, e in _queries(d))
    for p in _panels(d["panels"]):
        by_type.setdefault(p["type"], []).append(p["title"])
    # Job overview: MFU, step time, throughput, communication (exposed total/DP/PP), PP bubble analytic
    # vs stage idle, data share, bottleneck.
    for name in ("perfd_job_mfu_ratio", "perfd_job_step_time_seconds", "perfd_job_model_tflops_per_gpu",
                 "perfd_job_comm_exposed_ratio", "perfd_job_comm_exposed_dp_ratio",
                 "perfd_job_comm_exposed_pp_ratio",
                 "perfd_job_pp_bubble_analytic_ratio", "perfd_job_pp_stage_idle_max_ratio",
                 "perfd_job_data_loading_ratio", "perfd_job_bottleneck_info",
                 # GPU: GPM utilisations, power, clocks, throttling
                 "perfd_gpu_sm_util_ratio", "perfd_gpu_tensor_util_ratio", "perfd_gpu_dram_bw_util_ratio",
                 "perfd_gpu_power_watts", "perfd_gpu_sm_clock_hertz", "perfd_gpu_throttle_active",
                 # Ranks on their hosts, stalls and incidents (test_dashboard_ranks fills them)
                 "perfd_host_rank_state_info", "perfd_host_rank_cpu_wait_ratio", "perfd_host_rank_cpu_cores",
                 "perfd_host_rank_others_cpu_ratio", "perfd_host_rank_cpu_throttled_ratio",
                 "perfd_job_state_info", "perfd_job_stalled_seconds", "perfd_job_incidents_total",
                 "perfd_job_incidents_open"):
        assert name in exprs, name
    heatmaps = [p for p in _panels(d["panels"]) if p["type"] == "heatmap"]
    assert heatmaps and "perfd_job_rank_compute_ratio" in heatmaps[0]["targets"][0]["expr"]
    assert heatmaps[0]["targets"][0]["legendFormat"] == "{{rank}}"
    notes = [a for a in d["annotations"]["list"] if "perfd_agent_captures_total" in a.get("expr", "")]
    assert notes, "capture annotations"
    assert "stat" in by_type and "timeseries" in by_type and "state-timeline" in by_type


def test_every_query_references_only_exported_metrics_and_labels() -> None:
    d = _dash()
    seen: set[str] = set()
    for where, expr in _queries(d):
        names = promql_metric_names(expr)
        assert names or expr.startswith("up{"), f"{where}: no perfd metric in {expr!r}"
        assert not catalog_problems(names), f"{where}: {catalog_problems(names)}"
        unknown = promql_label_names(expr) - KNOWN_LABELS
        assert not unknown, f"{where}: unknown labels {unknown} in {expr!r}"
        seen |= names
    # Counters are rated/increased, never graphed raw; gauges are not rated.
    for where, expr in _queries(d):
        for n in promql_metric_names(expr):
            if n in catalog.names() and catalog.get(n).kind == "counter":  # else a histogram's _bucket
                assert "increase(" in expr or "rate(" in expr, f"{where}: counter {n} used raw"
    assert len(seen) >= 35


def test_provisioning_files_parse() -> None:
    for path in (GRAFANA / "provisioning").rglob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["apiVersion"] == 1, path


def test_dashboard_file_is_stable_json() -> None:
    # Pretty-printed with 2-space indent and a final newline, so diffs stay readable.
    text = DASHBOARD.read_text()
    assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"


def test_grafana_panel_types_are_core() -> None:
    core = {"row", "stat", "timeseries", "heatmap", "state-timeline", "table"}
    assert {p["type"] for p in _panels(_dash()["panels"])} <= core  # no plugins to install
