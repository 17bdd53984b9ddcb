"""perfd.aggregator.capture_records: a capture record is typed inside the aggregator, its JSON the same
keys as ever, and the state store's JSON reads back into the same record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfd.aggregator.capture_records import CaptureRecord, CaptureSeen, Decided
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.state import AggregatorState
from perfd.analytics.breakdown.bottleneck import BottleneckClass, ClassBasis, Quoted
from perfd.capture.bookkeeping import device_summary
from perfd.collectors.megatron import parse_file
from perfd.core.model import CaptureFailure, CaptureStatus
from perfd.report.capture_text import class_reason
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
    (got,) = coord.book.of_job(JOB)
    return got


def test_the_record_is_typed_and_its_json_reads_back_the_same() -> None:
    rec = _diagnosed()
    assert rec.bottleneck is BottleneckClass.MEMORY and rec.budget is not None and rec.match is not None
    assert isinstance(rec.decided, Decided) and rec.decided.breakdown is not None
    assert rec.status is CaptureStatus.FINISHED and rec.status.ended and not rec.status.live
    doc = json.loads(json.dumps(rec.to_json()))
    assert doc["bottleneck"] == "memory-bound" and doc["decided"] == {"rank": "0", "device": 0}
    assert doc["status"] == "finished" and doc["cause"] is None  # the JSON as ever: the values
    back = CaptureRecord.from_json(doc)
    assert back.status is CaptureStatus.FINISHED  # typed again, not the JSON's string
    assert json.dumps(back.to_json()) == json.dumps(rec.to_json())
    assert back.decided is not None and back.decided.breakdown == rec.decided.breakdown  # from the result
    assert back.timeline() == rec.timeline()
    # why the class, typed to where it is worded: served in words, kept typed, read back the same
    assert isinstance(rec.basis, ClassBasis) and rec.basis.decided is not None
    assert doc["bottleneck_reason"] == class_reason(rec.basis) and back.basis == rec.basis
    tl = rec.timeline()
    assert tl is not None and tl.reason is rec.basis
    seen = CaptureSeen.of(rec)
    seen_back = CaptureSeen.from_json(json.loads(json.dumps(seen.to_json())))
    assert seen_back is not None and seen_back.to_json() == seen.to_json()
    assert CaptureSeen.from_json({**seen.to_json(), "tool": "perf"}) is None  # a tool this version lacks


def test_what_an_older_store_holds_that_is_not_read_is_left_out() -> None:
    doc = json.loads(json.dumps(_diagnosed().to_json()))
    doc["findings"][0]["gone_field"] = 1
    doc["findings"].append({"title": "no severity"})
    doc["recommendations"].append("not one")
    said = doc["bottleneck_reason"]
    del doc["class_basis"]  # an older version's record: the reason in words only
    back = CaptureRecord.from_json(doc)
    assert len(back.findings) == len(doc["findings"]) - 1
    assert len(back.recommendations) == len(doc["recommendations"]) - 1
    assert back.basis == Quoted(said) and back.to_json()["bottleneck_reason"] == said


def test_a_kept_capture_of_a_status_this_version_does_not_know_is_left_out_counted(tmp_path: Path) -> None:
    """The state store's captures read back typed: one whose status or cause this version does not know
    (another version's, or damage) is refused by from_json, and the aggregator's restore leaves it out,
    counted, the others read back."""
    from perfd.aggregator.durable import _restore_documents
    from perfd.aggregator.state_store import StateStore

    rec = CaptureRecord("c1", JOB, [0], "kineto", 3, "manual", 1.0, status=CaptureStatus.FAILED,
                        cause=CaptureFailure.NOT_READY)
    good = json.loads(json.dumps(rec.to_json()))
    assert good["status"] == "failed" and good["cause"] == "not_ready"
    assert CaptureRecord.from_json(good).cause is CaptureFailure.NOT_READY
    bad = {**good, "id": "c2", "status": "paused"}
    with pytest.raises(ValueError):
        CaptureRecord.from_json(bad)
    store = StateStore(tmp_path / "state.db")
    store.put_doc("captures", [good, bad])
    coord = CaptureCoordinator(AggregatorState(), None, lambda agent, cmd: True)
    counts = {"unreadable": 0}

    class Parts:  # what _restore_documents reads of the aggregator: its state's capture records
        captures = coord
        state = coord.state

    _restore_documents(Parts(), store, counts)  # type: ignore[arg-type]
    assert counts["unreadable"] == 1
    assert [(c.id, c.status) for c in coord.book.of_job(JOB)] == [("c1", CaptureStatus.FAILED)]
