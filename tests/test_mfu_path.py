"""MFU from the Megatron-LM log line to the /metrics exposition text, hop by hop, through the
functions the live path calls, naming the representation (the type) its value or its inputs take at
each hop. The expected chain below is the measured answer to "how many representations does MFU pass
through on its way to /metrics": a change of the path fails here until the chain (and the count
docs/architecture.md "Following one number: MFU" gives) is brought up to date with it.

MFU itself is computed in the aggregator's analysis; before that, the log line's step time and the
run's FLOPs travel as fields of the step record (``INPUTS``). From the analysis on it is one float
(``MFU``), checked equal at every hop.
"""

from __future__ import annotations

import re
from array import array
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from collectors.megatron.parser import parse_lines
from perfd import catalog
from perfd.analytics.run.run_analysis import analyze_run
from perfd.exporters.prometheus import iteration_rows, job_families
from perfd.model import StepRecord
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb

LOG = Path(__file__).resolve().parents[1] / "perfd" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
H200 = "NVIDIA H200"
MFU_SERIES = "perfd_job_mfu_ratio"

# The log line's inputs of MFU (step time, the job's spec) on their way to the analysis: the agent
# parses the line, the transport carries the record as a protobuf message (serialized to bytes on the
# wire and in the spool), the aggregator decodes it back into a record.
INPUTS = ["str", "StepRecord", "StepRecord (protobuf)", "bytes", "StepRecord"]
# MFU from where the analysis computes it to the exposition: the iteration's result, the analysis's
# columns (the result packed into one array per field), the row rebuilt from them when /metrics reads
# the latest iteration, the catalog's {name: value} mapping, the exporter's (labels, name, value)
# rows, prometheus_client's family, the exposition text.
MFU = ["IterationResult", "array", "IterationResult", "dict", "tuple", "GaugeMetricFamily", "str"]


class _Families(Collector):
    def __init__(self, fams: list[Metric]) -> None:
        self.fams = fams

    def collect(self) -> list[Metric]:
        return self.fams


def _name(v: object) -> str:
    if isinstance(v, pb.StepRecord):
        return "StepRecord (protobuf)"
    return type(v).__name__


def test_mfu_reaches_the_exposition_through_the_representations_named() -> None:
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

    records = [step_from_pb(_through_wire(r)) for r in parsed.records]
    analysis = analyze_run(parsed.job_info, records, gpu_name=H200, job_name="demo")
    i = analysis.iterations.last_index_of(rec.iteration)
    assert i is not None
    # How the table holds the field (its column's store: private, and the thing measured here).
    column = analysis.iterations._cols["mfu"].store
    row = analysis.iterations[i]
    mfu = row.mfu
    assert mfu is not None and 0 < mfu < 1
    values = catalog.job_values(row)
    rows = [r for r in iteration_rows("demo", row) if r[1] == MFU_SERIES]
    fams = [f for f in job_families({"demo": row}) if f.name == MFU_SERIES]
    registry = CollectorRegistry()
    registry.register(_Families(fams))
    text = generate_latest(registry).decode()
    # analyze_run computes each iteration's result as an IterationResult and packs it into the
    # table's columns; what comes back out is a new IterationResult of the same values (`row`).
    mfu_chain = [row, column, row, values, rows[0], fams[0], text]

    assert isinstance(column, array) and column[i] == pytest.approx(mfu)
    assert values[MFU_SERIES] == pytest.approx(mfu) and rows[0][2] == pytest.approx(mfu)
    assert [s.value for s in fams[0].samples] == [pytest.approx(mfu)]
    exposed = [ln for ln in text.splitlines() if ln.startswith(MFU_SERIES + "{")]
    assert len(exposed) == 1 and float(exposed[0].rsplit(" ", 1)[1]) == pytest.approx(mfu)

    assert [_name(v) for v in inputs] == INPUTS
    assert [_name(v) for v in mfu_chain] == MFU
    # Between the log line and the exposition text (neither counted): 4 for the inputs, 6 for MFU.
    assert len(INPUTS) - 1 + len(MFU) - 1 == 10


def _through_wire(rec: StepRecord) -> pb.StepRecord:
    m = pb.StepRecord()
    step_to_pb(rec, m)
    return pb.StepRecord.FromString(m.SerializeToString())
