"""perfd.aggregator.capture_records: a capture record is typed inside the aggregator, its JSON the same
keys as ever, and the state store's JSON reads back into the same record (issue 57)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.megatron import parse_file
from perfd.aggregator.capture_records import CaptureRecord, CaptureSeen, Decided
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.state import AggregatorState
from perfd.analytics.breakdown.bottleneck import BottleneckClass
from perfd.capture.bookkeeping import device_summary
from perfd.transport.codec import Command
from tests.trace_cache import analyze_chrome_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "captures" / "kineto_h100_megatron"
JOB = "ops-live"
# Both tests read a real Megatron-LM log and analyse its Kineto trace (once a session): 6.9 s of CPU for
# the two, most of it in whichever runs first (the 2-core machine, 2026-11-26).
pytestmark = pytest.mark.slow


def _diagnosed() -> CaptureRecord:
    """A real Megatron-LM job's steps and its Kineto capture, through the coordinator."""
    parsed = parse_file(DATA / "ops_live_megatron.log.gz", job=JOB)
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("agent-a", [JOB])
    st.ingest_job_info("agent-a", JOB, parsed.job_info)
    st.ingest_steps("agent-a", parsed.records)
    st.analysis(JOB, force=True)

    def send(agent: str, cmd: Command) -> bool:
        return True

    coord = CaptureCoordinator(st, None, send)
    end = max(r.end_time or 0.0 for r in parsed.records)
    rec = coord.request(JOB, [0], "kineto", 3, "rule:x", now=end - 20.0)
    devices = device_summary(analyze_chrome_trace(DATA / "ops_live_rank0.json.gz"))
    done = {"status": "ok", "ranks": {"0": {"devices": devices}}}
    for kind, at, payload in (("capture_started", end - 19.0, None), ("capture_finished", end - 10.0, done)):
        st.ingest_events("agent-a", [{"kind": kind, "time": at, "job": JOB, "text": kind, "payload": payload,
                                      "links": {"command_id": rec.id, "capture_id": "c1"}}])
    (got,) = coord.of_job(JOB)
    return got


def test_the_record_is_typed_and_its_json_reads_back_the_same() -> None:
    rec = _diagnosed()
    assert rec.bottleneck is BottleneckClass.MEMORY and rec.budget is not None and rec.match is not None
    assert isinstance(rec.decided, Decided) and rec.decided.breakdown is not None
    doc = json.loads(json.dumps(rec.to_json()))
    assert doc["bottleneck"] == "memory-bound" and doc["decided"] == {"rank": "0", "device": 0}
    back = CaptureRecord.from_json(doc)
    assert json.dumps(back.to_json()) == json.dumps(rec.to_json())
    assert back.decided is not None and back.decided.breakdown == rec.decided.breakdown  # from the result
    assert back.timeline() == rec.timeline()
    seen = CaptureSeen.of(rec)
    assert CaptureSeen.from_json(json.loads(json.dumps(seen.to_json()))).to_json() == seen.to_json()


def test_what_an_older_store_holds_that_is_not_read_is_left_out() -> None:
    doc = json.loads(json.dumps(_diagnosed().to_json()))
    doc["findings"][0]["gone_field"] = 1
    doc["findings"].append({"title": "no severity"})
    doc["recommendations"].append("not one")
    back = CaptureRecord.from_json(doc)
    assert len(back.findings) == len(doc["findings"]) - 1
    assert len(back.recommendations) == len(doc["recommendations"]) - 1
