"""A Kineto capture of N training steps asks libkineto for N steps' worth of its iterations: libkineto
counts every torch.optim step, a nested one too, so a torchtitan step (its OptimizersContainer
stepping one AdamW per model part inside its own step) is 2 of them. From the job's framework at the
aggregator, through the capture command, to the config the agent hands the rank's process."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.state import AggregatorState
from perfd.capture.kineto_daemon import KinetoDaemon
from perfd.capture.manager import CaptureManager
from perfd.capture.request import CaptureArgError, parse_command
from perfd.capture.store import CaptureStore, Manifest
from perfd.collectors.torchtitan.parser import TorchtitanLogParser
from perfd.core.model import JobInfo, ParallelLayout, kineto_iterations_per_step
from perfd.transport.codec import Command, command_from_pb, command_to_pb
from tests.capture.test_manager import FakeRank

TITAN_LOG = (Path(__file__).resolve().parents[2] / "perfd" / "collectors" / "torchtitan" / "tests" / "data"
             / "llama3_debugmodel_1gpu.log")


def _titan_info() -> JobInfo:
    """The job info torchtitan's log makes (pp=1 in its mesh line)."""
    p = TorchtitanLogParser("tt", TITAN_LOG.name)
    for line in TITAN_LOG.read_text().splitlines(keepends=True):
        p.feed(line)
    return p.job_info


def test_iterations_per_step_by_framework() -> None:
    titan = _titan_info()
    assert titan.framework == "torchtitan" and titan.layout.pp == 1
    assert kineto_iterations_per_step(titan) == 2  # the container and its one AdamW
    assert kineto_iterations_per_step(JobInfo(framework="torchtitan")) == 2  # pp not said yet: torchtitan's 1
    # Under pipeline parallelism one optimizer per stage of the rank: a stated count is used, else one
    # (torchtitan's single-stage schedules)
    assert kineto_iterations_per_step(JobInfo(framework="torchtitan", layout=ParallelLayout(pp=2))) == 2
    assert kineto_iterations_per_step(JobInfo(framework="torchtitan",
                                              layout=ParallelLayout(pp=4, vpp=2))) == 3
    for fw in ("megatron", "pytorch", "hf_trainer", "lightning"):
        assert kineto_iterations_per_step(JobInfo(framework=fw, layout=ParallelLayout(pp=4, vpp=2))) == 1


def _cmd(**args: str) -> Command:
    return Command("capture", "j", (0,), {"tool": "kineto", "steps": "3", **args}, id="c1")


def test_the_command_argument_is_checked() -> None:
    assert parse_command(_cmd(), time.time()).iterations_per_step is None  # not said: unknown
    assert parse_command(_cmd(iterations_per_step="2"), time.time()).iterations_per_step == 2
    for bad in ("0", "65", "two"):
        with pytest.raises(CaptureArgError, match="iterations_per_step"):
            parse_command(_cmd(iterations_per_step=bad), time.time())
    # a start past Kineto's count once scaled is refused, not wrapped
    with pytest.raises(CaptureArgError, match="start_iteration"):
        parse_command(_cmd(iterations_per_step="2", start_iteration=str(2**30)), time.time())


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[CaptureManager]:
    """An agent's capture manager with its Kineto daemon, rank 0 a libkineto stand-in polling it."""
    daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
    mgr = CaptureManager(CaptureStore(tmp_path / "captures", quota_bytes=10**7), daemon, None,
                         pids_for_ranks=lambda job, ranks: {0: 1001}, settle_s=0.2, kineto_poll_s=0.2)
    rank = FakeRank(daemon.socket_name, 1001)
    rank.start()
    yield mgr
    mgr.close()
    rank.stop.set()
    daemon.stop()


def _captured(mgr: CaptureManager, job: str, info: JobInfo | None) -> Manifest:
    """`perfd capture --tool kineto --steps 3` of rank 0 of ``job`` (described by ``info``, or not at
    all) at the aggregator, its command over the wire to the agent; the capture's manifest."""
    st = AggregatorState(gpu_override="NVIDIA H200")
    st.hello("agent-1", [job])
    if info is not None:
        st.ingest_job_info("agent-1", job, info)
    ids: list[str] = []

    def send(agent_id: str, cmd: Command) -> bool:
        cid = mgr.handle(command_from_pb(command_to_pb(cmd)))
        ids.extend([cid] if cid is not None else [])
        return cid is not None

    rec = CaptureCoordinator(st, None, send).request(job, [0], "kineto", 3, "manual")
    assert rec.status == "requested", rec
    assert mgr.wait_idle(20)
    (cid,) = ids
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    return m


def _config(m: Manifest) -> dict[str, str]:
    return dict(line.split("=", 1) for line in m["config"].splitlines())


@pytest.mark.slow
def test_a_torchtitan_capture_of_3_steps_asks_kineto_for_6_iterations(agent: CaptureManager) -> None:
    m = _captured(agent, "tt", _titan_info())
    c = _config(m)
    assert (c["ACTIVITIES_ITERATIONS"], c["PROFILE_START_ITERATION"]) == ("6", "0")
    # rounded up to a whole number of training steps: each rank starts at the same point of a step
    assert c["PROFILE_START_ITERATION_ROUNDUP"] == "2"
    assert m["args"]["iterations_per_step"] == "2"
    assert m["steps"] == {"start": None, "count": 3,
                          "kineto": {"iterations_per_step": 2, "start": None, "roundup": 2, "count": 6}}


@pytest.mark.slow
def test_a_plain_job_still_asks_for_3(agent: CaptureManager) -> None:
    for fw in ("pytorch", "megatron"):
        m = _captured(agent, fw, JobInfo(framework=fw))
        c = _config(m)
        assert (c["ACTIVITIES_ITERATIONS"], c["PROFILE_START_ITERATION_ROUNDUP"]) == ("3", "1"), fw
        assert m["steps"]["kineto"] == {"iterations_per_step": 1, "start": None, "roundup": 1, "count": 3}


@pytest.mark.slow
def test_a_job_of_unknown_framework_is_captured_as_before(agent: CaptureManager) -> None:
    m = _captured(agent, "nobody-described", None)
    c = _config(m)
    assert (c["ACTIVITIES_ITERATIONS"], c["PROFILE_START_ITERATION_ROUNDUP"]) == ("3", "1")
    assert "iterations_per_step" not in m["args"] and m["steps"] == {"start": None, "count": 3}


@pytest.mark.slow
def test_a_given_start_and_roundup_are_training_steps(agent: CaptureManager) -> None:
    cid = agent.handle(_cmd(iterations_per_step="2", start_iteration="40", roundup="10"))
    assert cid is not None and agent.wait_idle(20)
    m = agent.store.read(cid)
    c = _config(m)
    assert (c["PROFILE_START_ITERATION"], c["PROFILE_START_ITERATION_ROUNDUP"],
            c["ACTIVITIES_ITERATIONS"]) == ("80", "20", "6")
    kineto: dict[str, Any] = dict(m["steps"]["kineto"])
    assert m["steps"]["start"] == 40 and kineto == {"iterations_per_step": 2, "start": 80, "roundup": 20,
                                                     "count": 6}
