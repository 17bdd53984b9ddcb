"""The ranks of a requested capture, checked where the request enters: each an
integer 0 <= rank < the job's world size (else below perfd.aggregator.capture_ranks.MAX_RANK, inside
the protocol's int32), each once, at most perfd.core.limits.MAX_CAPTURE_RANKS; a refusal is counted
(``capture_ranks``) and makes no record. A command the sender cannot send ends its record failed with
its ranks free; the records kept are bounded in count and bytes.

Before: ranks [0, 2147483648] made a record ``requested`` whose command raised in the sender (rank 0
then held for 600 s: a real capture got "busy"); -1 went on to the agent; a webhook label "-1" became a
capture of every rank; 500,000 ranks made a 7.5 MB record."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from perfd.aggregator.capture_ranks import MAX_RANK, RanksRefused, checked_ranks
from perfd.aggregator.captures import CaptureCoordinator, alertmanager_requests
from perfd.aggregator.http import HttpServer
from perfd.aggregator.state import AggregatorState
from perfd.app.commands.capture import run_capture
from perfd.collectors.megatron import parse_file
from perfd.core import limits as L
from perfd.core.refusals import Refusals
from perfd.transport.codec import Command, command_to_pb

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"  # world size 2


def _state(world_known: bool = True) -> AggregatorState:
    st = AggregatorState()
    st.hello("agent-1", ["j"])
    if world_known:
        st.ingest_job_info("agent-1", "j", parse_file(LOG, job="j").job_info)
    return st


def _recording(sent: list[Command]) -> Callable[[str, Command], bool]:
    def send(_agent: str, cmd: Command) -> bool:
        command_to_pb(cmd)  # encoded as the gRPC server does (perfd.transport.server): may raise
        sent.append(cmd)
        return True

    return send


def _encoding_sender(sent: list[Command]) -> CaptureCoordinator:
    return CaptureCoordinator(_state(world_known=False), None, _recording(sent), refusals=Refusals())


def test_a_rank_past_int32_is_refused_counted_and_holds_no_rank() -> None:
    sent: list[Command] = []
    co = _encoding_sender(sent)
    with pytest.raises(ValueError, match="rank 2147483648 is out of range"):
        co.request("j", [0, 2147483648], "kineto", 3, "manual", now=1.0)
    assert co.refusals.get(L.REFUSED_CAPTURE_RANKS) == 1
    assert co.list() == [] and sent == []  # no record, no command
    rec = co.request("j", [0], "kineto", 3, "manual", now=2.0)  # rank 0 is free: not "busy"
    assert rec.status == "requested" and [c.ranks for c in sent] == [(0,)]


@pytest.mark.parametrize("ranks, said", [
    ([-1], "rank -1 is out of range"),
    ([MAX_RANK], f"rank {MAX_RANK} is out of range"),
    ([0, True], "rank True is not an integer"),
    ([0, "1"], "rank '1' is not an integer"),
    ([1.0], "rank 1.0 is not an integer"),
    ([1 << 100], "an integer of 101 bits"),
    ("0,1", "'ranks' must be a list of integers"),
    (list(range(L.MAX_CAPTURE_RANKS + 1)), f"at most {L.MAX_CAPTURE_RANKS} distinct ranks"),
])
def test_bad_ranks_are_refused_by_name(ranks: object, said: str) -> None:
    sent: list[Command] = []
    co = _encoding_sender(sent)
    with pytest.raises(RanksRefused, match=said):
        co.request("j", ranks, "kineto", 3, "manual", now=1.0)
    assert co.refusals.get(L.REFUSED_CAPTURE_RANKS) == 1 and co.list() == [] and sent == []


def test_ranks_within_the_jobs_world_size_each_once() -> None:
    sent: list[Command] = []
    co = CaptureCoordinator(_state(), None, _recording(sent), refusals=Refusals())
    with pytest.raises(RanksRefused, match="below the job's world size 2"):
        co.request("j", [0, 2], "kineto", 3, "manual", now=1.0)
    rec = co.request("j", [1, 0, 1, 1], "kineto", 3, "manual", now=2.0)
    assert rec.ranks == [1, 0] and sent[0].ranks == (1, 0)
    # A duplicated list within the cap of distinct ranks is one capture of those ranks.
    assert checked_ranks([3] * (10 * L.MAX_CAPTURE_RANKS), None) == (3,)
    assert checked_ranks([], None) is None and checked_ranks(None, 4) is None  # every rank


def test_every_rank_of_a_job_is_asked_for_by_naming_none() -> None:
    sent: list[Command] = []
    co = CaptureCoordinator(_state(), None, _recording(sent), refusals=Refusals())
    rec = co.request("j", None, "kineto", 3, "manual", now=1.0)
    assert rec.status == "requested" and rec.ranks is None and sent[0].ranks == ()


def test_webhook_ranks_are_checked_as_the_apis() -> None:
    def body(ranks: str) -> dict[str, object]:
        return {"alerts": [{"status": "firing", "labels": {
            "alertname": "A", "job_name": "j", "perfd_capture": "true", "perfd_ranks": ranks}}]}

    sent: list[Command] = []
    co = _encoding_sender(sent)
    for text, said in (("0,2147483648", "rank 2147483648 is out of range"),
                       ("-1", "rank -1 is out of range"),  # was dropped: a capture of every rank
                       ("0,x", "rank 'x' is not an integer"),
                       ("9" * 5000, "is not an integer")):
        (r,) = alertmanager_requests(body(text))
        with pytest.raises(RanksRefused, match=said):
            co.request(r["job"], r["ranks"], r["tool"], r["steps"], r["origin"], now=1.0)
    assert co.refusals.get(L.REFUSED_CAPTURE_RANKS) == 4 and co.list() == [] and sent == []
    (r,) = alertmanager_requests(body(" 1, 0 ,1"))
    assert co.request(r["job"], r["ranks"], r["tool"], r["steps"], r["origin"], now=2.0).ranks == [1, 0]


def test_a_job_name_no_job_may_have_is_refused() -> None:
    co = _encoding_sender([])
    with pytest.raises(ValueError, match=f"at most {L.MAX_JOB_NAME_BYTES} bytes"):
        co.request("j" * (1 << 20), None, "kineto", 3, "manual", now=1.0)
    assert co.refusals.get(L.REFUSED_LABELS) == 1 and co.list() == []


def test_a_command_the_sender_cannot_send_fails_its_record_and_frees_its_ranks() -> None:
    calls: list[Command] = []

    def send(_agent: str, cmd: Command) -> bool:
        calls.append(cmd)
        if len(calls) == 1:
            raise RuntimeError("the stream's queue is gone")
        return True

    co = CaptureCoordinator(_state(), None, send, refusals=Refusals())
    rec = co.request("j", [0], "kineto", 3, "manual", now=1.0)
    assert rec.status == "failed" and "RuntimeError: the stream's queue is gone" in rec.reason
    assert not co.arbiter.busy("j", 0)
    assert co.request("j", [0], "kineto", 3, "manual", now=2.0).status == "requested"


def test_capture_records_are_bounded_in_bytes() -> None:
    st = _state()
    limits = L.Limits(max_capture_record_bytes=1 << 20, capture_requests_per_job=100)
    co = CaptureCoordinator(st, None, lambda _a, _c: True, limits=limits, refusals=Refusals())
    for i in range(10):  # each capture's agent reports a result of ~200 KB
        rec = co.request("j", [i % 2], "kineto", 3, "manual", now=float(i))
        st.ingest_events("agent-1", [{"kind": "capture_finished", "text": "ok",
                                      "links": {"capture_id": rec.id},
                                      "payload": {"status": "ok", "note": "x" * 200_000}}])
    held = co.list()
    assert 0 < len(held) < 10 and held[-1]["id"] == rec.id  # the oldest went
    assert sum(len(str(r["result"])) for r in held) <= limits.max_capture_record_bytes


def test_perfd_capture_says_a_refused_rank_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    st = _state()
    co = CaptureCoordinator(st, None, _recording([]), refusals=Refusals())
    http = HttpServer(st, "127.0.0.1", 0, co)
    http.start()
    try:
        args = argparse.Namespace(aggregator=f"http://127.0.0.1:{http.port}", job="j", ranks="0,-1",
                                  steps=2, tool="nsys", wait=0.0)
        assert run_capture(args) == 1
    finally:
        http.stop()
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "rank -1 is out of range" in err, err


def test_a_huge_step_count_is_refused_and_logged_cut(caplog: pytest.LogCaptureFixture) -> None:
    """A 4,000-digit step count was refused (400) but written whole into the refusal's log line."""
    co = _encoding_sender([])
    with caplog.at_level("WARNING", logger="perfd.refused"), \
            pytest.raises(ValueError, match="steps must be <="):
        co.request("j", [0], "kineto", 10 ** 3999, "manual", now=1.0)
    line = next(r.getMessage() for r in caplog.records if "capture_steps" in r.getMessage())
    assert f"~2^{(10 ** 3999).bit_length()} steps" in line and len(line) < 300
