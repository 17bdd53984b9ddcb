"""deploy/prometheus: rules, their unit tests, the scrape config and the Alertmanager routing pass
Prometheus' own tools, and every metric the rules reference is one perfd exports."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integrations.integrations_helpers import (
    KNOWN_LABELS,
    PROM_DIR,
    RULES,
    catalog_problems,
    need,
    promql_label_names,
    promql_metric_names,
)


def _run(*cmd: str, cwd: Path = PROM_DIR) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, cwd=cwd)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{out}"
    return out


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    out = _run(need("promtool"), "check", "rules", str(RULES))
    assert "SUCCESS" in out and "WARNING" not in out.upper()


@pytest.mark.slow
@pytest.mark.parametrize("tests", ["perfd.rules.test.yml", "perfd-serving.rules.test.yml"])
def test_promtool_unit_tests_of_the_rules(tests: str) -> None:
    # Training: alerts fire on the fixture's shape (MFU 8%, PP idle 24%), stay quiet where they must
    # (stage imbalance is not a straggler; sw_power_cap is not throttling), count a GPU once although two
    # scrape jobs deliver it. Serving: the serving alerts (tests/integrations/test_serving_alerts.py checks
    # their thresholds are perfd's own) fire and stay quiet on theirs.
    out = _run(need("promtool"), "test", "rules", tests)
    assert "SUCCESS" in out


def test_promtool_check_config_and_amtool_check_config() -> None:
    out = _run(need("promtool"), "check", "config", "prometheus.yml")
    assert "1 rule files found" in out
    out = _run(need("amtool"), "check-config", "alertmanager.yml")
    assert "SUCCESS" in out


def test_rules_reference_only_perfd_metrics_and_labels() -> None:
    rules = _rules()
    names: set[str] = set()
    for r in rules:
        expr = str(r["expr"])
        used = promql_metric_names(expr)
        assert used or "up{" in expr, f"{r.get('alert') or r.get('record')}: references no perfd metric"
        names |= used
        unknown = promql_label_names(expr) - KNOWN_LABELS
        assert not unknown, f"{r.get('alert') or r.get('record')}: labels {unknown} are not perfd's"
    assert not catalog_problems(names), catalog_problems(names)
    # The brief: MFU, exposed comm, PP idle, data loading, straggler, throttling, XID, agent down,
    # spool dropping.
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert {"PerfdJobMFULow", "PerfdJobExposedCommHigh", "PerfdJobPipelineIdleHigh",
            "PerfdJobDataLoadingHigh", "PerfdRankStraggler", "PerfdGPUThrottling", "PerfdGPUXidErrors",
            "PerfdTargetDown", "PerfdAgentSpoolDropping"} <= alerts
    for r in rules:
        if "alert" in r:
            assert r["labels"]["severity"] in {"info", "warning", "critical"}
            assert r["annotations"]["summary"] and r["annotations"]["description"]
        else:  # recording rules: level:metric:operations
            assert r["record"].count(":") == 2, r["record"]


def test_name_checks_catch_mistakes() -> None:
    assert promql_metric_names("rate(perfd_gpu_xid_errors_total[5m]) / job_name:perfd_job_mfu_ratio:avg") == {
        "perfd_gpu_xid_errors_total", "perfd_job_mfu_ratio"}
    assert catalog_problems({"perfd_gpu_xid_errors"}) == [
        "perfd_gpu_xid_errors: a counter; its samples are named perfd_gpu_xid_errors_total"]
    assert catalog_problems({"perfd_job_mfu"}) == ["perfd_job_mfu: not in perfd.core.catalog"]
    assert promql_label_names('max by (node, gpu) (x{job_name=~"$job_name", reason!="a"})') == {
        "node", "gpu", "job_name", "reason"}


@pytest.mark.parametrize("path", sorted(PROM_DIR.glob("*.yml")), ids=lambda p: p.name)
def test_deploy_prometheus_files_are_yaml(path: Path) -> None:
    assert isinstance(yaml.safe_load(path.read_text()), dict)


DCGM_RULES = PROM_DIR / "perfd-dcgm.rules.yml"


def test_dcgm_join_rules_check_and_unit_tests() -> None:
    """perfd-dcgm.rules.yml: valid, its unit tests pass (units converted, one info series per GPU,
    the documented join), and each rule records a perfd catalog name in that metric's unit: the
    conversions' targets are the catalog, not a hand list."""
    promtool = need("promtool")
    out = _run(promtool, "check", "rules", str(DCGM_RULES))
    assert "SUCCESS" in out and "WARNING" not in out.upper()
    assert "SUCCESS" in _run(promtool, "test", "rules", "perfd-dcgm.rules.test.yml")
    doc = yaml.safe_load(DCGM_RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules
    for r in rules:
        level, name, op = r["record"].split(":")
        assert level == "gpu" and op in ("dcgm", "max"), r["record"]
        assert not catalog_problems({name}) and name.startswith("perfd_gpu_"), r["record"]
        used = promql_label_names(str(r["expr"]))
        assert used <= KNOWN_LABELS, (r["record"], used - KNOWN_LABELS)
        if op == "dcgm":  # DCGM-exporter's field in, perfd's unit out
            assert "DCGM_FI_" in str(r["expr"]) and not promql_metric_names(str(r["expr"])), r["record"]
    # Only fields dcgm-exporter serves by default (its default-counters.csv): FB_TOTAL is not one
    # (with it, the memory-total rule was empty on a stock dcgm-exporter).
    assert "DCGM_FI_DEV_FB_TOTAL" not in DCGM_RULES.read_text().split("groups:", 1)[1]


@pytest.mark.parametrize(("labels", "receivers"), [
    (("perfd_capture=true", "severity=warning"), "perfd-capture,team"),
    (("severity=warning",), "team"),
    (("perfd_capture=true", "severity=critical"), "perfd-capture,team-pager"),
    (("severity=critical",), "team-pager"),
    (("severity=info",), "null"),
], ids=["capture-warning", "warning", "capture-critical", "critical", "info"])
def test_alertmanager_routes_a_capture_alert_to_the_team_too(labels: tuple[str, ...], receivers: str) -> None:
    """alertmanager.yml as Alertmanager's own router reads it (`amtool config routes test`): an alert
    labelled for capture reaches the aggregator's webhook and the team's receiver it would reach
    without the label (before, a capture-labelled warning reached only the webhook)."""
    out = subprocess.run([need("amtool"), "config", "routes", "test", "--config.file=alertmanager.yml",
                          *labels], capture_output=True, text=True, timeout=60, cwd=PROM_DIR)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == receivers
