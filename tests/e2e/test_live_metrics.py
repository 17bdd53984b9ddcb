"""What the live pipeline exports, in the test's process (tests/inproc.py): the aggregator's and the
agent's /metrics with a real Megatron-LM log tailed and a real NVML recording replayed (the e2e
conftest's ``live`` pair)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import JOB, Live
from tests.procs import http_get

pytestmark = pytest.mark.slow


def _json(url: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(http_get(url))
    return got


def test_build_info_and_both_straggler_names_on_metrics(live: Live) -> None:
    import platform

    from perfd import __version__

    agg = {s.name: s for f in text_string_to_metric_families(http_get(f"{live.base}/metrics").decode())
           for s in f.samples}
    agent = {s.name: s for f in text_string_to_metric_families(http_get(live.agent_metrics).decode())
             for s in f.samples}
    for got in (agg, agent):
        info = got["perfd_build_info"]
        assert info.value == 1.0
        assert info.labels == {"version": __version__, "python": platform.python_version()}
    old, new = agg.get("perfd_job_straggler_ratio"), agg.get("perfd_job_straggler_rtt_spread_times")
    if old is None:  # this log's straggler lines may be absent: then both are
        assert new is None
    else:
        assert new is not None and new.value == old.value and new.value >= 1.0


def _node_series(url: str) -> set[str]:
    text = http_get(url).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith(("perfd_gpu_", "perfd_host_"))}


def test_aggregator_leaves_node_series_to_the_agents_by_default(live: Live) -> None:
    assert not _node_series(f"{live.base}/metrics")
    assert "perfd_gpu_power_watts" in _node_series(live.agent_metrics)
    # ... and perfd top / the API still see the GPUs.
    assert _json(f"{live.base}/api/jobs/{JOB}/gpus")["gpus"]


@pytest.mark.parametrize("live", [["--export-node-series"]], indirect=True)
def test_export_node_series_puts_them_back(live: Live) -> None:
    agg = _node_series(f"{live.base}/metrics")
    assert "perfd_gpu_power_watts" in agg and agg <= _node_series(live.agent_metrics)
