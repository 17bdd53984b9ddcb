"""The aggregator joins a job's ranks with their GPUs' state (process lists + NVML values)."""

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from perfd.aggregator.http import _StateCollector, job_summary
from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def _labels(node: str, gpu: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node": node, "gpu": gpu, "model": "NVIDIA H200", **extra}.items()))


def test_summary_places_ranks_and_explains_the_straggler_gpu():
    st = AggregatorState(gpu_override="NVIDIA H200")
    parsed = parse_file(LOG, job="j")
    st.hello("agent-1", ["j"])
    st.ingest_job_info("agent-1", "j", parsed.job_info)
    st.ingest_steps("agent-1", parsed.records)
    defs = {
        0: ("perfd_gpu_sm_clock_hertz", _labels("n1", "0")),
        1: ("perfd_gpu_sm_clock_hertz", _labels("n1", "1")),
        2: ("perfd_gpu_throttle_active", _labels("n1", "1", reason="hw_slowdown")),
        3: ("perfd_gpu_throttle_active", _labels("n1", "0", reason="hw_slowdown")),
    }
    st.ingest_samples("agent-1", defs, [0, 1, 2, 3], [1, 1, 1, 1], [1.98e9, 1.2e9, 1.0, 0.0])
    st.ingest_events("agent-1", [
        {"kind": "gpu_processes", "labels": {"node": "n1", "gpu": "0"},
         "payload": [{"pid": 100, "rank": 0, "world_size": 2, "cmdline": "python pretrain_gpt.py"}]},
        {"kind": "gpu_processes", "labels": {"node": "n1", "gpu": "1"},
         "payload": [{"pid": 101, "rank": 1, "world_size": 2, "cmdline": "python pretrain_gpt.py"},
                     {"pid": 555, "rank": None, "name": "python", "cmdline": "python burn.py"}]},
    ])
    s = job_summary(st, "j")
    assert s is not None
    assert [(r["rank"], r["node"], r["gpu"]) for r in s["ranks"]] == [(0, "n1", "0"), (1, "n1", "1")]
    assert s["ranks"][1]["throttle_reasons"] == ["hw_slowdown"]
    assert [p["pid"] for p in s["ranks"][1]["other_processes"]] == [555]
    # The fixture's rtt spread is between pipeline stages (stage imbalance, not a straggler), so no
    # rank is a candidate and no GPU hint is made (tests/analytics/test_attribution.py covers hints).
    assert s["summary"]["straggler_persistent_ranks"] == [] and s["gpu_hints"] == []
    reg = CollectorRegistry()
    reg.register(_StateCollector(st))
    metrics = generate_latest(reg).decode()
    assert 'perfd_job_rank_info{gpu="1",job_name="j",node="n1",rank="1"} 1.0' in metrics
