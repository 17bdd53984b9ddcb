"""Events typed where they enter the aggregator (perfd.core.events.checked over perfd.core.typed), and no
payload of any shape raising past that edge: the class of bug where one process entry without a
``pid`` once took every endpoint down, fuzzed over every kind whose payload a consumer reads."""

from __future__ import annotations

import json
import time
from array import array
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.http import _StateCollector, job_gpus, job_summary
from perfd.core import events
from perfd.core import limits as L
from perfd.core.model import StepRecord
from perfd.transport.codec import F64, I64, U32, DecodedBatch
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import event_from_pb, event_to_pb


def _batch(steps: list[StepRecord] = (), evs: list[Any] = ()) -> DecodedBatch:  # type: ignore[assignment]
    return DecodedBatch("victim-host", 1, 0, {}, [], array(U32), array(I64), array(F64), list(steps),
                        list(evs), {}, 0, 0)


def test_an_entry_without_its_required_key_is_left_out_and_said() -> None:
    ev = {"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"},
          "payload": [{"rank": 0, "job": "victim"}, {"pid": 7, "rank": 0}, {"pid": True, "rank": 1},
                      {"pid": 8, "rank": "one"}, "junk", {"pid": 9, "rank": None, "extra": [1]}]}
    got, problems = events.checked(ev)
    assert got is not None
    assert got["payload"] == [{"pid": 7, "rank": 0}, {"pid": 9, "rank": None, "extra": [1]}]
    assert len(problems) == 4
    assert problems[0] == "[0]: no 'pid'"
    assert "True" in problems[1] and "'one'" in problems[2] and "not a mapping" in problems[3]


def test_a_mapping_payload_is_its_type_or_refused_whole() -> None:
    phase = {"kind": "job_phase", "job": "j", "payload": {"job": "j", "phase": "checkpoint", "state": "begin",
                                                          "iteration": 3, "at": 1.5}}
    assert events.checked(phase) == (phase, [])
    for bad in ({"phase": "lunch", "state": "begin"}, {"state": "end"},
                {"phase": "checkpoint", "state": "begin", "iteration": "x"}):
        got, problems = events.checked({**phase, "payload": bad})
        assert got is None and len(problems) == 1, bad
    assert events.checked({**phase, "payload": [1]}) == (None, ["payload list, not a mapping"])
    # A list of typed entries inside a mapping: the bad ones left out, the event kept.
    ranks = {"kind": "rank_processes", "job": "j",
             "payload": {"job": "j", "ranks": [{"rank": 0, "pid": 5, "state": "running", "cpu_cores": 1},
                                               {"rank": 1}, {"rank": 2, "pid": 6, "allowed_cpus": [1, "2"]}]}}
    got, problems = events.checked(ranks)
    assert got is not None and [r["rank"] for r in got["payload"]["ranks"]] == [0]
    assert len(problems) == 2 and problems[0].startswith("ranks[1]: no 'pid'")
    stacks = {"kind": "rank_stacks", "job": "j",
              "payload": {"job": "j", "ranks": {"0": {"pid": 1, "stack": 5}}}}
    assert events.checked(stacks)[0] is None


def test_kinds_without_a_declared_type_pass_as_they_are() -> None:
    for ev in ({"kind": "xid", "payload": {"xid": "79"}}, {"kind": "not-a-kind", "payload": 5},
               {"kind": "capture_finished", "payload": [1, 2]}, {"kind": "gpu_lost"}):
        assert events.checked(ev) == (ev, [])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8)
    | st.sampled_from(["victim", "checkpoint", "begin", "end", "running", "stopped"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["pid", "rank", "job", "ranks", "phase", "state", "iteration", "stack",
                                       "world_size", "local_rank", "0", "node", "allowed_cpus", "others",
                                       "pressure", "command_id", "uuid", "gpu"]) | st.text(max_size=4),
                      inner, max_size=6),
    max_leaves=20)
TYPED = [k.name for k in events.KINDS.values() if k.item is not None]


@pytest.mark.slow
@settings(max_examples=150, derandomize=True)
@given(kind=st.sampled_from(TYPED), payload=JSON, job=st.sampled_from(["victim", "", "other"]))
def test_no_payload_raises_past_the_edge(kind: str, payload: Any, job: str) -> None:
    """Whatever the payload, an aggregator takes the batch, its refresh, /metrics and the job's views
    answer: nothing raises (one aggregator for every example: what the last ones left stays)."""
    agg = _AGG
    ev = {"kind": kind, "job": job, "time": time.time(), "labels": {"node": "n", "gpu": "0"},
          "payload": payload}
    got, problems = events.checked(ev)
    if got is not None:  # what passed is of its declared type, entries included: checked again, nothing said
        assert events.checked(got) == (got, [])
    before = agg.refusals.get(L.REFUSED_MALFORMED_EVENT)
    agg.on_batch("victim-host", _batch(evs=[ev]))
    assert agg.refusals.get(L.REFUSED_MALFORMED_EVENT) - before == len(problems)
    agg.state.refresh()
    list(_StateCollector(agg.state).collect())
    assert job_summary(agg.state, "victim") is not None and job_gpus(agg.state, "victim") is not None
    assert agg.state.snapshots.errors == 0


def _aggregator() -> Aggregator:
    agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[]))
    agg.on_batch("victim-host", _batch(steps=[
        StepRecord(job="victim", iteration=i, rank="last", end_time=time.time() - 10 + i, step_time_ms=100.0)
        for i in range(1, 11)]))
    agg.guard.hello("victim-host", ["victim"])
    return agg


_AGG = _aggregator()


@pytest.mark.slow
def test_what_the_producers_send_is_of_its_declared_type() -> None:
    """The contract from the other side: a real ranks collector following real processes — this test's
    own (busy: it computes between the readings) and its parent (waiting on it) — sends rank_processes
    events the edge takes whole. A rank gone between two readings: the recorded ``gone`` case below (the
    collector reports a pid as gone only once it had seen it, so that shape needs a process that exits)."""
    import os
    import sys

    from perfd.collectors.ranks import RanksCollector

    if not sys.platform.startswith("linux"):
        return
    c = RanksCollector({"job": "j", "event_every_s": 0})
    c.note(os.getpid(), 0, "hook", uid=os.getuid())
    c.note(os.getppid(), 1, "gpu")
    evs = []
    for _ in range(3):
        until = time.monotonic() + 0.1
        while time.monotonic() < until:  # the busy rank's CPU between two readings
            sum(range(10000))
        evs += [e for e in c.collect(time.time()).events if e["kind"] == events.RANK_PROCESSES.name]
    assert len(evs) == 3
    for ev in evs:
        got, problems = events.checked(ev)
        assert problems == [] and got is not None and len(got["payload"]["ranks"]) == 2
    assert {r["rank"]: r["pid"] for r in evs[-1]["payload"]["ranks"]} == {0: os.getpid(), 1: os.getppid()}


_RECORDED = Path(__file__).resolve().parent / "data" / "host" / "rank_observations.json"


@pytest.mark.parametrize("name", ["calm", "contention", "stopped", "gone"])
def test_a_recorded_rank_processes_payload_round_trips_as_declared(name: str) -> None:
    """A payload the ranks collector sent (recorded: tests/data/host) crosses the wire and the edge
    unchanged, and every key of it is one RankProcesses and RankHost declare: a key the collector sends
    and the declaration lacks passes the edge unchecked and is read untyped."""
    payload = json.loads(_RECORDED.read_text())[name]
    m = pb.Event()
    event_to_pb({"kind": events.RANK_PROCESSES.name, "time": 1.0, "job": "j", "payload": payload}, m)
    got, problems = events.checked(event_from_pb(m))
    assert problems == [] and got is not None and got["payload"] == payload
    assert set(payload) <= set(get_type_hints(events.RankProcesses))
    declared = set(get_type_hints(events.RankHost))
    for row in payload["ranks"]:
        assert set(row) <= declared, set(row) - declared
    row = payload["ranks"][0]
    assert ("threads" in row) == (row["state"] != "gone")  # the key that was sent undeclared


def test_a_launch_without_an_exit_code_round_trips_as_declared(tmp_path: Path) -> None:
    """The ranks collector's launch end from a manifest that gives no code and no end time (None)."""
    from perfd.collectors.ranks import RanksCollector
    from perfd.core.manifest import MANIFEST_VERSION, STATUS_EXITED, write_manifest

    manifest = tmp_path / "launch.json"
    write_manifest(manifest, {"version": MANIFEST_VERSION, "job": "j", "status": STATUS_EXITED, "pid": None,
                              "exit_code": None, "ended": None, "collectors": {}})
    c = RanksCollector({"job": "j", "launch_manifest": str(manifest), "event_every_s": 0})
    if not c.probe().available:
        pytest.skip(c.probe().reason)
    sent = [e for e in c.collect(time.time()).events if e["kind"] == events.RANK_PROCESSES.name]
    assert len(sent) == 1
    payload = sent[0]["payload"]
    assert payload["launch"] == {"status": STATUS_EXITED, "exit_code": None, "ended": None}
    m = pb.Event()
    event_to_pb(sent[0], m)
    got, problems = events.checked(event_from_pb(m))
    assert problems == [] and got is not None and got["payload"] == payload
    assert set(payload["launch"]) <= set(get_type_hints(events.LaunchExit))
