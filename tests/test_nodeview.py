"""The aggregator's node view keeps each series' last value in per-agent columns: each series id
resolves once to its slot, a batch shaped like an earlier one is copied as slices, and an id that a
new stream defines again resolves anew (never updates the series it meant before), also when the
definition came in a batch without samples."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.aggregator.nodes import NodeView
from perfd.transport.codec import F64, I64, U32


def test_latest_value_per_series_and_an_id_defined_again_resolves_anew() -> None:
    view = NodeView()
    models: list[str] = []
    util = ("perfd_gpu_utilization_ratio", (("gpu", "0"),))
    power = ("perfd_gpu_power_watts", (("gpu", "0"),))
    name = ("perfd_gpu_memory_total_bytes", (("gpu", "0"), ("model", "NVIDIA H200")))
    defs = {1: util, 2: power, 3: name}
    view.ingest_samples("a", defs, [1, 1, 2, 3], [10, 30, 10, 10], [0.5, 0.7, 300.0, 1.0], models.append)
    view.ingest_samples("a", defs, [1], [20], [0.1], models.append)  # sent last: kept (its time is older)
    def latest(agent: str, key: tuple[str, tuple[tuple[str, str], ...]]) -> tuple[int, float]:
        s = view.latest(agent, *key)
        assert s is not None
        return s.time_ns, s.value

    assert latest("a", util) == (20, 0.1)
    assert latest("a", power) == (10, 300.0)
    assert models == ["NVIDIA H200", "NVIDIA H200"]
    # A restarted agent's new stream defines id 1 as another series (a new definition object).
    defs[1] = ("perfd_gpu_temperature_celsius", (("gpu", "0"),))
    view.defined("a", [1])
    view.ingest_samples("a", defs, [1], [40], [61.0], models.append)
    assert latest("a", util) == (20, 0.1)  # the old series is not touched
    assert latest("a", defs[1]) == (40, 61.0)
    # The same series from another agent stays apart.
    view.ingest_samples("b", {7: util}, [7], [50], [0.9], models.append)
    assert latest("b", util) == (50, 0.9) and latest("a", util) == (20, 0.1)
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
    from perfd.aggregator.daemon import Aggregator, AggregatorConfig
    from perfd.core.model import Sample
    from perfd.transport.codec import DecodedBatch, decode_batch, encode_batch
    from perfd.transport.gen import perfd_pb2 as pb
    from perfd.transport.series import Series, SeriesTable

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
    power = agg.state.nodes.latest("a", "perfd_gpu_power_watts", (("gpu", "0"),))
    temp = agg.state.nodes.latest("a", "perfd_gpu_temperature_celsius", (("gpu", "0"),))
    assert power is not None and power.value == 300.0
    assert temp is not None and temp.value == 62.0


# ---- the columnar path: a batch shaped like an earlier one is copied as slices ----------------

_KEYS = [(f"perfd_gpu_m{k}", (("gpu", str(g)),)) for g in range(2) for k in range(3)]  # 6 series


@st.composite
def _batches(draw: st.DrawFn) -> list[tuple[str, list[int], list[int], list[float]]]:
    """Batches of two agents drawn from a few shapes (so shapes repeat), ids repeated within a
    batch, and (as "define") an agent's stream numbering its series anew."""
    shapes = [list(range(6)), [3, 4, 5], [5, 0], [1, 1, 2]]
    out: list[tuple[str, list[int], list[int], list[float]]] = []
    t = 100
    for _ in range(draw(st.integers(1, 25))):
        agent = draw(st.sampled_from(["a", "b"]))
        if draw(st.integers(0, 9)) == 0:
            out.append((agent, [], [], []))  # "define": ids renumbered from here
            continue
        ids = draw(st.sampled_from(shapes))
        t += draw(st.integers(-30, 20))  # a node's clock may step back: arrival order still rules
        ts = [t + draw(st.sampled_from([0, 0, 0, -5, 3])) for _ in ids]
        vals = [float(draw(st.integers(0, 99))) for _ in ids]
        out.append((agent, ids, ts, vals))
    return out


@pytest.mark.slow
@settings(max_examples=300, derandomize=True)
@given(_batches())
def test_columns_keep_the_latest_value_of_each_series_whatever_the_batch_shapes(
        batches: list[tuple[str, list[int], list[int], list[float]]]) -> None:
    """Against a reference that keeps, sample by sample, the last value each series was sent: the
    slice path (a repeated shape), the sample path (a new shape, an id twice in a batch) and ids
    defined anew must all give the same values and times."""
    view = NodeView()
    ref: dict[tuple[str, tuple[str, tuple[tuple[str, str], ...]]], tuple[int, float]] = {}
    offset = {"a": 0, "b": 0}  # a renumbered stream maps id i to series (i + offset) % 6
    for agent, ids, ts, vals in batches:
        if not ids:
            offset[agent] += 1
            view.defined(agent, list(range(6)))
            continue
        defs = {i: _KEYS[(i + offset[agent]) % 6] for i in range(6)}
        view.ingest_samples(agent, defs, ids, ts, vals, lambda _m: None)
        for sid, t, v in zip(ids, ts, vals, strict=True):
            ref[(agent, defs[sid])] = (t, v)
    for (agent, (name, labels)), (t, v) in ref.items():
        got = view.latest(agent, name, labels)
        assert got is not None and (got.time_ns, got.value) == (t, v), (agent, name, labels)
    assert sorted((a, s.name, s.labels) for a, s in view.snapshot()) == sorted(
        (a, k[0], k[1]) for a, k in ref)


def test_a_repeated_batch_shape_is_learnt_then_copied_as_slices() -> None:
    view = NodeView()
    defs = {i: _KEYS[i] for i in range(6)}
    view.ingest_samples("a", defs, list(range(6)), [10] * 6, [1.0] * 6, lambda _m: None)
    cols = view._agents["a"]
    assert cols.layouts == {bytes(array(U32, range(6))): 0}  # learnt from the first batch
    view.ingest_samples("a", defs, array(U32, range(6)), array(I64, [20] * 6), array(F64, [2.0] * 6),
                        lambda _m: None)
    assert list(cols.values) == [2.0] * 6 and list(cols.times) == [20] * 6
    view.ingest_samples("a", defs, [4, 5], [30, 30], [3.0, 4.0], lambda _m: None)  # another shape
    assert list(cols.values) == [2.0] * 4 + [3.0, 4.0] and len(cols.layouts) == 2
    view.ingest_samples("a", defs, [5, 5], [40, 41], [5.0, 6.0], lambda _m: None)  # an id twice
    assert cols.values[5] == 6.0 and len(cols.layouts) == 2  # not a shape of consecutive slots
    view.defined("a", [0])  # a new definition of id 0: the learnt shapes go
    assert cols.layouts == {}
    with pytest.raises(ValueError, match="differ in length"):
        view.ingest_samples("a", defs, [1, 2], [50], [1.0, 2.0], lambda _m: None)


def test_job_nodes_are_where_its_processes_or_its_agents_are() -> None:
    """perfd_job_node_info's nodes (what joins a node agent's host series to a job): the
    node of a GPU whose processes declare the job, whoever reports it; of the job's own agents' GPUs
    that no other job declares; and the nodes its own agents' series name. Not a node where only
    another job runs."""
    view = NodeView()

    def procs(agent: str, node: str, gpu: str, job: str | None) -> None:
        payload = [{"pid": 10, "job": job}] if job else [{"pid": 11}]
        assert view.on_gpu_processes(agent, {"kind": "gpu_processes", "labels": {"node": node, "gpu": gpu},
                                             "payload": payload})

    procs("n1/node", "n1", "0", "gpt")        # a node agent, no job: its GPU runs gpt
    procs("n2/node", "n2", "0", "other")      # another job's node
    procs("n3/gpt", "n3", "0", None)           # gpt's own agent, a GPU no process declares
    procs("n3/gpt", "n3", "1", "other")        # ... and one another job declares
    view.ingest_samples("n4/gpt", {1: ("perfd_host_cpu_util_ratio", (("node", "n4"),))}, [1], [1], [0.5],
                        lambda _m: None)       # gpt's sidecar on n4: its series name its node
    assert view.job_nodes("gpt", {"n3/gpt", "n4/gpt"}) == {"n1", "n3", "n4"}
    assert view.job_nodes("other", set()) == {"n2", "n3"}
    assert view.job_nodes("idle", set()) == set()
    view.forget_agent("n1/node")  # gone for good: its GPUs leave the job's nodes
    assert view.job_nodes("gpt", {"n3/gpt"}) == {"n3"}
    assert view.job_nodes("gpt", {"n3/gpt", "n4/gpt"}) == {"n3", "n4"}
    view.forget_agent("n4/gpt")  # an agent of series only (no GPU): the node its series named goes
    assert view.job_nodes("gpt", {"n3/gpt", "n4/gpt"}) == {"n3"}


_AGENTS = ["n1/node", "n2/node", "n1/gpt", "n3/gpt"]
_OPS = st.one_of(
    st.tuples(st.just("procs"), st.sampled_from(_AGENTS), st.sampled_from(["n1", "n2", "n3"]),
              st.sampled_from(["0", "1"]), st.sampled_from([None, "gpt", "other"])),
    st.tuples(st.just("series"), st.sampled_from(_AGENTS), st.sampled_from(["n1", "n4"])),
    st.tuples(st.just("forget"), st.sampled_from(_AGENTS)),
    st.tuples(st.just("read"), st.sampled_from(["gpt", "other"]),
              st.frozensets(st.sampled_from(_AGENTS))),
)


def _apply(view: NodeView, op: tuple[object, ...], sid: list[int]) -> None:
    if op[0] == "procs":
        _, agent, node, gpu, job = op
        payload = [{"pid": 10, "job": job}] if job else [{"pid": 11}]
        assert view.on_gpu_processes(str(agent), {"kind": "gpu_processes",
                                                  "labels": {"node": node, "gpu": gpu}, "payload": payload})
    elif op[0] == "series":  # a new series naming a node (a new id each: a new slot)
        sid[0] += 1
        view.ingest_samples(str(op[1]), {sid[0]: ("perfd_host_cpu_util_ratio", (("node", str(op[2])),
                                                                                 ("cpu", str(sid[0]))))},
                            [sid[0]], [1], [0.5], lambda _m: None)
    elif op[0] == "forget":
        view.forget_agent(str(op[1]))


@settings(max_examples=200)
@given(st.lists(_OPS, max_size=30))
def test_a_jobs_nodes_kept_between_reads_are_what_reading_them_afresh_gives(ops: list[tuple[object, ...]]
                                                                            ) -> None:
    """job_nodes keeps its answer while its inputs are unchanged (every snapshot of a 100,000-GPU job
    read it, walking every GPU); after any change of a GPU's agent or declared job, of the nodes an
    agent's series name, or of the agents asked about, it is what a view that never answered before
    gives over the same inputs."""
    kept, sid = NodeView(), [0]
    done: list[tuple[object, ...]] = []
    for op in ops:
        if op[0] != "read":
            _apply(kept, op, sid)
            done.append(op)
            continue
        fresh, fsid = NodeView(), [0]
        for d in done:
            _apply(fresh, d, fsid)
        job, agents = str(op[1]), op[2]
        assert isinstance(agents, frozenset)
        assert kept.job_nodes(job, set(agents)) == fresh.job_nodes(job, agents)


def test_a_jobs_gpu_model_is_named_by_its_process_lists_and_forgotten_with_their_agent() -> None:
    """The model label of a GPU's process list (the recorded H100 event's shape,
    tests/data/incidents/cotenant_h100/nvml.jsonl.gz) names the model of the jobs placed on it; a job
    on no listed GPU has none; a hostile label is cut; the agent forgotten, its GPUs' models go."""
    nv = NodeView()
    model = "NVIDIA H100 80GB HBM3"
    ev = {"kind": "gpu_processes", "labels": {"node": "n1", "gpu": "3", "model": model},
          "payload": [{"pid": 7, "rank": 3, "job": "train"}]}
    assert nv.on_gpu_processes("node-agent", ev)
    assert nv.model_of("train", set()) == model
    assert nv.model_of("other", {"engine"}) is None
    # a sidecar's own GPU, its processes declaring no job: the model is its agent's job's
    nv.on_gpu_processes("side", {"kind": "gpu_processes", "payload": [{"pid": 8}],
                                 "labels": {"node": "n2", "gpu": "0", "model": "X" * 999}})
    assert nv.model_of("sidecar-job", {"side"}) == "X" * 128
    nv.forget_agent("node-agent")
    assert nv.model_of("train", set()) is None
