"""MFU from the Megatron-LM log line to the /metrics exposition text, hop by hop, through the
functions the live path calls, naming the representation (the type) its value or its inputs take at
each hop. The expected chain below is the measured answer to "how many representations does MFU pass
through on its way to /metrics": a change of the path fails here until the chain (and the count
docs/architecture.md "Following one number: MFU" gives) is brought up to date with it.

MFU itself is computed in the aggregator's analysis; before that, the log line's step time and the
run's FLOPs travel as fields of the step record (``INPUTS``). From the analysis on it is one float
(``MFU``), checked equal at every hop. The scrape is watched as it runs: every value a function of
perfd returns (or yields) and every local it holds when it returns is looked at, and a container that
holds MFU and is not the family the chain names (an iteration rebuilt from the table, a mapping of
names to values, a row) fails the test.
"""

from __future__ import annotations

import re
import sys
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from perfd.aggregator.http import _StateCollector
from perfd.aggregator.state import AggregatorState
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.collectors.megatron.parser import parse_lines
from perfd.core.model import StepRecord
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
H200 = "NVIDIA H200"
MFU_SERIES = "perfd_job_mfu_ratio"
# The code whose frames the watch looks into: the project's, not prometheus_client's (whose family
# holds its samples as it likes) nor the tests'.
WATCHED = (str(ROOT / "perfd") + "/", str(ROOT / "perfd" / "collectors") + "/")

# The log line's inputs of MFU (step time, the job's spec) on their way to the analysis: the agent
# parses the line, the transport carries the record as a protobuf message (serialized to bytes on the
# wire and in the spool), the aggregator decodes it back into a record. The transport stays, so do
# these: MFU is not in them, its inputs are.
INPUTS = ["str", "StepRecord", "StepRecord (protobuf)", "bytes", "StepRecord"]
# MFU from where the analysis computes it to the exposition: the iteration's result, the run table's
# column of it (one array per field), prometheus_client's family the exporter adds the value to as it
# reads it from the column (the catalog's declaration of the metric: which column, which scale), the
# exposition text.
MFU = ["IterationResult", "array", "GaugeMetricFamily", "str"]
# What the watch may see hold MFU during the scrape: the family, and nothing else.
SCRAPE_HOLDERS = {"GaugeMetricFamily"}


class _Families(Collector):
    def __init__(self, fams: list[Metric]) -> None:
        self.fams = fams

    def collect(self) -> list[Metric]:
        return self.fams


def _name(v: object) -> str:
    if isinstance(v, pb.StepRecord):
        return "StepRecord (protobuf)"
    return type(v).__name__


def _holder(v: object, mfu: float, depth: int = 1) -> str | None:
    """The type name of ``v`` when it is a container holding ``mfu`` (a list or tuple: also through
    one level of lists or tuples in it, as rows in a list); None otherwise. The float itself is the
    value, not a representation of it."""
    if isinstance(v, IterationResult):
        return "IterationResult" if v.mfu == mfu else None
    if isinstance(v, Metric):
        return type(v).__name__ if any(s.value == mfu for s in v.samples) else None
    if isinstance(v, array):
        return "array" if v.typecode == "d" and mfu in v else None
    if isinstance(v, dict):
        return "dict" if any(isinstance(x, float) and x == mfu for x in v.values()) else None
    if isinstance(v, (list, tuple)):
        inner = any((isinstance(x, float) and x == mfu) or (depth > 0 and _holder(x, mfu, depth - 1))
                    for x in v)
        return type(v).__name__ if inner else None
    return None


@contextmanager
def _watch(mfu: float) -> Iterator[set[str]]:
    """The type names of the containers holding ``mfu`` that the project's functions return, yield or
    hold as locals as they return, while the block runs (this thread)."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "return" or not frame.f_code.co_filename.startswith(WATCHED):
            return
        for v in (arg, *frame.f_locals.values()):
            if (h := _holder(v, mfu)) is not None:
                seen.add(h)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def test_mfu_reaches_the_exposition_through_the_representations_named(monkeypatch: pytest.MonkeyPatch
                                                                       ) -> None:
    lines = LOG.read_text().splitlines(keepends=True)
    line = next(ln for ln in reversed(lines) if " iteration " in ln and "elapsed time per iteration" in ln)
    parsed = parse_lines(lines, job="demo")
    m = re.search(r"iteration\s+(\d+)/", line)
    assert m is not None
    rec = next(r for r in parsed.records if r.iteration == int(m.group(1)))
    msg = pb.StepRecord()
    step_to_pb(rec, msg)
    wire = msg.SerializeToString()
    back = step_from_pb(pb.StepRecord.FromString(wire))
    assert back.step_time_ms == rec.step_time_ms and back.iteration == rec.iteration
    inputs = [line, rec, msg, wire, back]

    # The aggregator's analysis, each iteration's result caught as it enters the run's table.
    computed: list[IterationResult] = []
    append = Table.append

    def caught(self: Table[IterationResult], row: IterationResult) -> None:
        if isinstance(row, IterationResult) and row.iteration == rec.iteration:
            computed.append(row)
        append(self, row)

    monkeypatch.setattr(Table, "append", caught)
    st = AggregatorState(gpu_override=H200, min_recompute_s=0.0)
    st.hello("agent", ["demo"])
    st.ingest_job_info("agent", "demo", parsed.job_info)
    st.ingest_steps("agent", [step_from_pb(_through_wire(r)) for r in parsed.records])
    st.refresh()
    monkeypatch.undo()
    assert computed, "the analysis put no result of the line's iteration in the table"
    mfu = computed[-1].mfu
    assert mfu is not None and 0 < mfu < 1
    snap = st.snapshot("demo")
    its = snap.iterations if snap is not None else None
    assert its is not None and its.get(len(its) - 1, "iteration") == rec.iteration
    # How the table holds the field (its column's store: private, and the thing measured here).
    column = its._cols["mfu"].store

    with _watch(mfu) as held:
        fams = [f for f in _StateCollector(st).collect() if f.name == MFU_SERIES]
    registry = CollectorRegistry()
    registry.register(_Families(fams))
    text = generate_latest(registry).decode()
    mfu_chain = [computed[-1], column, fams[0], text]

    assert isinstance(column, array) and column[len(its) - 1] == mfu
    assert [s.value for s in fams[0].samples] == [mfu]
    exposed = [ln for ln in text.splitlines() if ln.startswith(MFU_SERIES + "{")]
    assert len(exposed) == 1 and float(exposed[0].rsplit(" ", 1)[1]) == pytest.approx(mfu)

    assert [_name(v) for v in inputs] == INPUTS
    assert [_name(v) for v in mfu_chain] == MFU
    assert held == SCRAPE_HOLDERS, f"MFU passed through {sorted(held - SCRAPE_HOLDERS)} on the scrape"
    # Between the log line and the exposition text (neither counted): 4 for the inputs, 3 for MFU.
    assert len(INPUTS) - 1 + len(MFU) - 1 == 7


def test_the_watch_sees_a_hop_come_back() -> None:
    """The watch is no blind spot: the old route (the row rebuilt from the table, the catalog's
    mapping of it, the exporter's rows) is what it reports."""
    from perfd.analytics.steps.iteration import job_values

    mfu = 0.0842
    table: Table[IterationResult] = Table(IterationResult, "iteration")
    table.append(IterationResult(1, mfu=mfu))
    with _watch(mfu) as held:
        row = table[0]
        rows = [({"job_name": "j"}, name, v) for name, v in job_values(row).items()]
    assert rows and held >= {"IterationResult", "dict"}
    assert _holder(rows, mfu) == "list" and _holder(rows[0], mfu) == "tuple"


def _through_wire(rec: StepRecord) -> pb.StepRecord:
    m = pb.StepRecord()
    step_to_pb(rec, m)
    return pb.StepRecord.FromString(m.SerializeToString())
