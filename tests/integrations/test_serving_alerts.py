"""Serving in Grafana and Alertmanager: deploy/grafana/perfd-serving-dashboard.json and the
perfd-serving alert group of deploy/prometheus/perfd.rules.yml. Every query names only catalog
metrics and perfd labels; the alert thresholds are the ones of
perfd/analytics/serving/serving_findings.py (and so of rules/serving.yaml). promtool runs the alerts'
unit tests beside the training alerts' (tests/integrations/test_prometheus_rules.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from perfd.analytics.serving import serving_findings as sf
from perfd.core import catalog
from tests.integrations.integrations_helpers import (
    KNOWN_LABELS,
    ROOT,
    RULES,
    catalog_problems,
    promql_label_names,
    promql_metric_names,
)
from tests.integrations.test_grafana_dashboard import DS, _panels, _queries

DASHBOARD = ROOT / "deploy" / "grafana" / "perfd-serving-dashboard.json"


def _dash() -> dict[str, Any]:
    d = json.loads(DASHBOARD.read_text())
    assert isinstance(d, dict)
    return d


def _serving_alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "perfd-serving"]
    return {r["alert"]: r for r in group["rules"]}


def test_serving_dashboard_queries_use_only_catalog_metrics_and_labels() -> None:
    d = _dash()
    seen: set[str] = set()
    for where, expr in _queries(d):
        names = promql_metric_names(expr)
        assert names, f"{where}: no perfd metric in {expr!r}"
        assert not catalog_problems(names), f"{where}: {catalog_problems(names)}"
        unknown = promql_label_names(expr) - KNOWN_LABELS
        assert not unknown, f"{where}: unknown labels {unknown} in {expr!r}"
        for n in names:
            assert catalog.get(n).kind != "counter" or "rate(" in expr or "increase(" in expr, where
        seen |= names
    serving = {m.name for m in catalog.CATALOG if m.name.startswith("perfd_serving_")}
    assert serving <= seen, f"serving metrics not on the dashboard: {sorted(serving - seen)}"
    assert not any(catalog.get(n).description.startswith("DEPRECATED") for n in seen)


def test_serving_dashboard_shape() -> None:
    d = _dash()
    assert d["uid"] == "perfd-serving" and 36 <= d["schemaVersion"] <= 41
    assert DASHBOARD.read_text() == json.dumps(d, indent=2, ensure_ascii=False) + "\n"
    panels = list(_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"] == DS and all(t["datasource"] == DS for t in p["targets"])
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap"
                cells[(x, y)] = p["id"]
    assert {p["type"] for p in panels} <= {"row", "stat", "timeseries"}


def test_serving_alerts_reference_catalog_metrics_and_have_text() -> None:
    alerts = _serving_alerts()
    assert {"PerfdServingTTFTHigh", "PerfdServingITLTail", "PerfdServingQueueGrowing",
            "PerfdServingKVCacheNearFull", "PerfdServingKVCacheIdleWhileQueued",
            "PerfdServingPrefixCacheHitLow"} == set(alerts)
    for name, r in alerts.items():
        names = promql_metric_names(str(r["expr"]))
        assert names and all(n.startswith("perfd_serving_") for n in names), name
        assert not catalog_problems(names), name
        assert not promql_label_names(str(r["expr"])) - KNOWN_LABELS, name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name


def _numbers(expr: str) -> list[float]:
    return [float(x) for x in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", expr)]


def test_serving_alert_thresholds_are_the_playbook_constants() -> None:
    # One threshold, three readers: the report's findings (serving_findings), the rule pack
    # (rules/serving.yaml, kept in step by tests/serving) and these Prometheus alerts.
    want = {
        "PerfdServingTTFTHigh": [sf.TTFT_P99_HIGH_S],
        "PerfdServingITLTail": [sf.ITL_TAIL_RATIO],
        "PerfdServingQueueGrowing": [sf.QUEUE_GROWTH_PER_S, sf.BATCH_SMALL],
        "PerfdServingKVCacheNearFull": [sf.KV_NEAR_FULL],
        "PerfdServingKVCacheIdleWhileQueued": [sf.KV_LOW, 0.0],
        "PerfdServingPrefixCacheHitLow": [sf.PREFIX_HIT_LOW, sf.PREFIX_REUSE_BATCHES],
    }
    alerts = _serving_alerts()
    pack = {r["name"]: r for r in yaml.safe_load((ROOT / "rules" / "serving.yaml").read_text())["rules"]}
    fors = {"PerfdServingTTFTHigh": "serving_ttft_high", "PerfdServingITLTail": "serving_itl_tail",
            "PerfdServingQueueGrowing": "serving_queue_growing_small_batch",
            "PerfdServingKVCacheNearFull": "serving_kv_near_full",
            "PerfdServingKVCacheIdleWhileQueued": "serving_kv_low_while_queued",
            "PerfdServingPrefixCacheHitLow": "serving_prefix_hit_low"}
    for name, values in want.items():
        assert sorted(_numbers(str(alerts[name]["expr"]))) == sorted(values), name
        assert alerts[name]["for"] == pack[fors[name]]["for"], name
