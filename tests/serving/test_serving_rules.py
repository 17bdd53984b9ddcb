"""rules/serving.yaml loads, reads only serving metrics the engine knows, and fires exactly when the
report's findings do (same thresholds: perfd/analytics/serving/serving_findings.py)."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from perfd.analytics.serving.serving_analysis import CATALOG_NAMES, ServingSummary
from perfd.analytics.serving.serving_findings import derive_serving_findings
from perfd.analytics.serving.spec import MetricValue
from perfd.analytics.steps.provenance import Code, cite
from perfd.core import catalog
from perfd.core.serving_records import ServerInfo
from perfd.rules.check_command import run_rules_check
from perfd.rules.evaluator import RuleEngine
from perfd.rules.pack_loader import load_pack

PACK = Path(__file__).resolve().parents[2] / "rules" / "serving.yaml"
RULE_TO_FINDING = {
    "serving_itl_tail": "itl-tail", "serving_ttft_high": "ttft-high",
    "serving_prefix_hit_low": "prefix-hit-low",
    "serving_kv_near_full": "kv-near-full", "serving_kv_low_while_queued": "kv-low-while-queued",
    "serving_queue_growing_small_batch": "queue-growing", "serving_cuda_graph_low": "cuda-graph-low",
}


def test_pack_checks_and_reads_only_serving_metrics() -> None:
    out = io.StringIO()
    assert run_rules_check([str(PACK)], out) == 0, out.getvalue()
    pack = load_pack(PACK)
    assert {r.name for r in pack.rules} == set(RULE_TO_FINDING)
    for r in pack.rules:
        assert r.scope == "job"
        for name in r.expr.metrics:
            assert name.startswith("perfd_serving_") and catalog.get(name).labels == ("job_name",)


def _summary(values: dict[str, float | None]) -> ServingSummary:
    why = cite(Code.UNKNOWN)
    vals = {k: MetricValue(v) if v is not None else MetricValue.absent(why) for k, v in values.items()}
    return ServingSummary(vals, {"window": "test"})


def _random_values(rng: random.Random) -> dict[str, float | None]:
    def maybe(x: float) -> float | None:
        return None if rng.random() < 0.15 else x

    p50 = rng.uniform(0.005, 0.05)
    return {
        "itl_p50": maybe(p50), "itl_p99": maybe(p50 * rng.uniform(1.0, 6.0)),
        "ttft_p50": maybe(rng.uniform(0.05, 1.0)), "ttft_p99": maybe(rng.uniform(0.1, 4.0)),
        "prefix_hit": maybe(rng.uniform(0, 0.6)), "prefix_hit_batches": maybe(rng.uniform(0, 1)),
        "kv_usage": maybe(rng.choice([rng.uniform(0, 0.3), rng.uniform(0.9, 1.0), rng.uniform(0, 1)])),
        "queued_requests": maybe(rng.choice([0.0, rng.uniform(0, 20)])),
        "queue_growth": maybe(rng.uniform(-0.5, 0.5)), "batch_fill": maybe(rng.uniform(0, 1)),
        "cuda_graph": maybe(rng.uniform(0.7, 1.0)), "running_requests": maybe(rng.uniform(0, 64)),
    }


def test_rules_and_findings_agree_on_the_same_values() -> None:
    pack = load_pack(PACK)
    rng = random.Random(11)
    fired_any = {name: False for name in RULE_TO_FINDING}
    for _ in range(2000):
        values = _random_values(rng)
        findings, _ = derive_serving_findings(_summary(values), ServerInfo(chunked_prefill_size=8192))
        ids = {f.id for f in findings}
        series = {CATALOG_NAMES[k]: v for k, v in values.items()}
        for rule in pack.rules:
            fires = rule.expr.evaluate(series)
            fired_any[rule.name] |= fires
            assert fires == (RULE_TO_FINDING[rule.name] in ids), (rule.name, values)
    assert all(fired_any.values()), fired_any


def test_the_engine_fires_a_serving_rule_after_its_for_duration() -> None:
    pack = load_pack(PACK)
    eng = RuleEngine(pack.rules)
    job = {"llm": {"perfd_serving_kv_cache_usage_ratio": 0.97}}
    assert not [f for f in eng.evaluate(0.0, job) if f.rule.name == "serving_kv_near_full"]
    fired = [f for f in eng.evaluate(121.0, job) if f.rule.name == "serving_kv_near_full"]
    assert fired and fired[0].values == {"perfd_serving_kv_cache_usage_ratio": 0.97}
    assert not [f for f in eng.evaluate(200.0, {"llm": {}}) if f.rule.name == "serving_kv_near_full"]


@pytest.mark.parametrize("alias", ["kv_usage", "itl_p99", "ttft_p99", "prefix_hit", "decode_mbu",
                                   "queue_growth"])
def test_serving_aliases_resolve_to_catalog_names(alias: str) -> None:
    from perfd.rules.expr import ALIASES

    assert ALIASES[alias] in set(CATALOG_NAMES.values())
