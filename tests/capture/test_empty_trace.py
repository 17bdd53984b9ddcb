"""A trace that holds no timed event (tests/data/captures/kineto_empty_cpu: torch's CPU profiler around
no op) is refused, not analysed as a job with no device: ``perfd analyze trace`` says so and exits 1, and
a Kineto capture counts it as the rank's miss (TraceMissKind.EMPTY), its file kept, no analysis made of it.
A trace whose timed events are all of kinds perfd does not read is refused too, saying so."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.capture import bookkeeping
from perfd.capture.analysis import TraceData, TraceEmpty, analyze_trace
from perfd.capture.bookkeeping import TraceMiss, TraceMissKind
from perfd.capture.chrome_trace import analyze_chrome_trace
from perfd.capture.manager import CaptureManager
from perfd.capture.store import CaptureStore
from tests.capture.test_manager import cmd, two_ranks
from tests.cli_main import perfd

DATA = Path(__file__).resolve().parents[1] / "data" / "captures" / "kineto_empty_cpu"
EMPTY = DATA / "trace.json"


def test_the_recorded_empty_trace_is_refused_by_the_reader() -> None:
    with pytest.raises(TraceEmpty, match="no timed event"):
        analyze_chrome_trace(EMPTY)


def test_a_trace_of_kinds_perfd_does_not_read_says_so(tmp_path: Path) -> None:
    """Not the profiler's empty window: timed events, none of a category perfd reads (an older Kineto's
    names, a tool's own) — refused, with what it held."""
    doc = json.loads(EMPTY.read_text())
    span = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"] += [{"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1,
                            "ts": span["ts"] + 10 * i, "dur": 5.0} for i in range(3)]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with pytest.raises(TraceEmpty, match="holds 3 timed event"):
        analyze_chrome_trace(other)


def test_an_empty_capture_from_any_reader_is_refused() -> None:
    """The refusal is the analysis's, whatever read the capture (an nsys export's reader too)."""
    with pytest.raises(TraceEmpty, match="recorded nothing"):
        analyze_trace(TraceData(source="nsys.sqlite"))


def test_the_same_trace_with_one_op_is_analysed(tmp_path: Path) -> None:
    """What makes it empty is the missing op: one CPU op in the window and it is a trace to analyse."""
    doc = json.loads(EMPTY.read_text())
    span = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                               "ts": span["ts"] + 10, "dur": 50.0})
    one = tmp_path / "one.json"
    one.write_text(json.dumps(doc))
    assert analyze_chrome_trace(one) is not None


def test_perfd_analyze_trace_says_it_holds_nothing_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    ran = perfd(capsys, "analyze", "trace", EMPTY)
    assert ran.returncode == 1 and "holds no timed event" in ran.stderr and str(EMPTY) in ran.stderr, ran


def test_record_trace_keeps_no_analysis_and_says_the_rank_missed(tmp_path: Path) -> None:
    counted: list[str] = []
    store = CaptureStore(tmp_path, 10**6)
    ctx = bookkeeping.RunContext(store, time.time, 0.1, threading.Event(), lambda *a: None,
                                 lambda reason, detail: counted.append(reason))
    m = store.new_capture("job1", (3,), "kineto")
    miss = bookkeeping.record_trace(ctx, m, 3, EMPTY)
    assert isinstance(miss, TraceMiss) and miss.kind is TraceMissKind.EMPTY
    assert miss.text.startswith("rank 3: the trace holds no timed event")
    # not an input refusal: nothing counted against a cap
    assert "3" not in m.get("analysis", {}) and counted == []


@pytest.fixture
def ranks_one_empty(tmp_path: Path) -> Iterator[tuple[CaptureManager, list[dict[str, Any]]]]:
    """Two ranks on a stand-in libkineto: rank 0 writes a trace with kernels, rank 1 the empty one."""
    for mgr, events, _ in two_ranks(tmp_path, {1: json.loads(EMPTY.read_text())}):
        yield mgr, events


@pytest.mark.slow
def test_a_kineto_capture_counts_an_empty_trace_as_its_ranks_miss(
        ranks_one_empty: tuple[CaptureManager, list[dict[str, Any]]]) -> None:
    mgr, events = ranks_one_empty
    cid = mgr.handle(cmd(ranks=(0, 1)))
    assert cid is not None and mgr.wait_idle(20)
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    assert (m["reason"] or "").startswith("partial: rank 1: the trace holds no timed event"), m["reason"]
    assert list(m["analysis"]) == ["0"]  # rank 1's trace made no analysis
    assert sorted(a["name"] for a in m["artifacts"]) == ["rank0_1000.json", "rank1_1001.json"]  # both kept
    assert [e["kind"] for e in events] == ["capture_started", "capture_finished"]

    only = mgr.handle(cmd(ranks=(1,)))
    assert only is not None and mgr.wait_idle(20)
    m1 = mgr.store.read(only)
    assert m1["status"] == "failed"
    assert (m1["reason"] or "").startswith("rank 1: the trace holds no timed event")
    assert [a["name"] for a in m1["artifacts"]] == ["rank1_1001.json"] and not m1.get("analysis")
    assert [e["kind"] for e in events[2:]] == ["capture_started", "capture_failed"]
