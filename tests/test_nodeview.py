"""The aggregator's node view keeps the latest value per series: each series id resolves once to its
series object, and an id that a new stream defines again resolves anew (never updates the series
it meant before)."""

from __future__ import annotations

from perfd.aggregator.nodes import NodeView


def test_latest_value_per_series_and_an_id_defined_again_resolves_anew() -> None:
    view = NodeView()
    models: list[str] = []
    util = ("perfd_gpu_utilization_ratio", (("gpu", "0"),))
    power = ("perfd_gpu_power_watts", (("gpu", "0"),))
    name = ("perfd_gpu_memory_total_bytes", (("gpu", "0"), ("model", "NVIDIA H200")))
    defs = {1: util, 2: power, 3: name}
    view.ingest_samples("a", defs, [1, 1, 2, 3], [10, 30, 10, 10], [0.5, 0.7, 300.0, 1.0], models.append)
    view.ingest_samples("a", defs, [1], [20], [0.1], models.append)  # older than the kept value
    node = view.node["a"]
    assert node[util].value == 0.7 and node[util].time_ns == 30
    assert node[power].value == 300.0
    assert models == ["NVIDIA H200", "NVIDIA H200"]
    # A restarted agent's new stream defines id 1 as another series (a new definition object).
    defs[1] = ("perfd_gpu_temperature_celsius", (("gpu", "0"),))
    view.ingest_samples("a", defs, [1], [40], [61.0], models.append)
    assert node[util].value == 0.7  # the old series is not touched
    assert node[defs[1]].value == 61.0
    # The same series from another agent stays apart.
    view.ingest_samples("b", {7: util}, [7], [50], [0.9], models.append)
    assert view.node["b"][util].value == 0.9 and node[util].value == 0.7
    assert view.samples == 7
