"""The aggregator's node view keeps the latest value per series: each series id resolves once to its
series object, and an id that a new stream defines again resolves anew (never updates the series
it meant before), also when the definition came in a batch without samples."""

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
    view.defined("a", [1])
    view.ingest_samples("a", defs, [1], [40], [61.0], models.append)
    assert node[util].value == 0.7  # the old series is not touched
    assert node[defs[1]].value == 61.0
    # The same series from another agent stays apart.
    view.ingest_samples("b", {7: util}, [7], [50], [0.9], models.append)
    assert view.node["b"][util].value == 0.9 and node[util].value == 0.7
    assert view.samples == 7


def test_gpu_view_reads_the_latest_values_throttle_flags_and_only_the_names_asked() -> None:
    view = NodeView()
    lab = (("gpu", "1"), ("node", "n1"))
    defs = {
        1: ("perfd_gpu_utilization_ratio", lab),
        2: ("perfd_gpu_temperature_celsius", lab),
        3: ("perfd_gpu_throttle_active", (*lab, ("reason", "hw_thermal"))),
        4: ("perfd_gpu_throttle_active", (*lab, ("reason", "sw_power_cap"))),
        5: ("perfd_gpu_ecc_errors_total", (*lab, ("type", "corrected"))),  # typed: not a GPU value
        6: ("perfd_host_cpu_ratio", (("node", "n1"),)),  # a host series: not a GPU's
    }
    view.ingest_samples("a", defs, [1, 2, 3, 4, 5, 6], [10] * 6, [0.5, 70.0, 1.0, 0.0, 3.0, 0.2],
                        lambda _m: None)
    view.ingest_samples("a", defs, [1, 4], [20, 20], [0.9, 1.0], lambda _m: None)  # values move on
    _procs, values, throttles = view.gpu_view({"a"})
    assert values == {("n1", "1"): {"perfd_gpu_utilization_ratio": 0.9,
                                    "perfd_gpu_temperature_celsius": 70.0}}
    assert sorted(throttles[("n1", "1")]) == ["hw_thermal", "sw_power_cap"]
    _procs, values, throttles = view.gpu_view({"a"}, {"perfd_gpu_temperature_celsius"})
    assert values == {("n1", "1"): {"perfd_gpu_temperature_celsius": 70.0}} and throttles == {}
    _procs, values, throttles = view.gpu_view({"a"}, {"perfd_gpu_throttle_active", "perfd_gpu_nope"})
    assert values == {} and sorted(throttles[("n1", "1")]) == ["hw_thermal", "sw_power_cap"]
    assert view.gpu_view({"b"}) == ({}, {}, {})  # another agent's GPUs are not this one's


def test_a_restarted_agent_numbering_its_series_anew_updates_the_right_series() -> None:
    """Through the aggregator: a new stream's batch defines id 0 as another series; its values
    land there and the series id 0 meant before keeps its value."""
    from perfd.aggregator.main import Aggregator, AggregatorConfig
    from perfd.model import Sample
    from perfd.transport.codec import DecodedBatch, Series, SeriesTable, decode_batch, encode_batch
    from perfd.transport.gen import perfd_pb2 as pb

    def wire(seq: int, samples: list[Sample], table: SeriesTable, stream: dict[int, Series]) -> DecodedBatch:
        b = encode_batch("a", seq, samples, [], [], table)
        return decode_batch(pb.Batch.FromString(b.SerializeToString()), stream)

    agg = Aggregator(AggregatorConfig(rules_files=[]))
    first = SeriesTable()
    agg.on_batch("a", wire(1, [Sample("perfd_gpu_power_watts", 300.0, 1.0, {"gpu": "0"})], first, {}))
    again = SeriesTable()  # the restarted agent: its first series is another one, also id 0
    stream: dict[int, Series] = {}
    agg.on_batch("a", wire(1, [Sample("perfd_gpu_temperature_celsius", 61.0, 2.0, {"gpu": "0"})],
                           again, stream))
    agg.on_batch("a", wire(2, [Sample("perfd_gpu_temperature_celsius", 62.0, 3.0, {"gpu": "0"})],
                           again, stream))
    node = agg.state.nodes.node["a"]
    assert node[("perfd_gpu_power_watts", (("gpu", "0"),))].value == 300.0
    assert node[("perfd_gpu_temperature_celsius", (("gpu", "0"),))].value == 62.0
