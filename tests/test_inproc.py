"""tests/inproc.py itself: the pipeline it runs is configured by the commands' own code, leaves nothing
running behind it, and a wait that runs out says what each side saw."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from perfd.core.model import StepRecord
from tests.inproc import agent_config, aggregator_config, pipeline
from tests.procs import WaitTimeout


def test_the_configuration_is_the_commands_and_a_refusal_is_its_line() -> None:
    cfg = aggregator_config("--gpu", "NVIDIA H200", "--job-stale-after", "10", "--no-rules")
    assert (cfg.grpc_host, cfg.grpc_port, cfg.http_port) == ("127.0.0.1", 0, 0)
    assert cfg.gpu == "NVIDIA H200" and cfg.job_stale_after_s == 10 and cfg.rules_files == []
    with pytest.raises(AssertionError, match="--job-stale-after must be > 0 seconds"):
        aggregator_config("--job-stale-after", "0")
    a = agent_config("127.0.0.1:1", "--job", "j", "--nvml", "off", "--host", "off")
    assert a.aggregator == "127.0.0.1:1" and a.job == "j" and a.metrics_port is None
    with pytest.raises(AssertionError, match="configuration error"):
        agent_config("127.0.0.1:1", "--job", "$(PERFD_JOB)")


def test_it_stops_every_thread_it_started_and_a_timeout_names_what_each_side_saw(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    log = tmp_path / "train.log"
    log.write_text("")
    with pipeline(tmp_path, "--no-rules") as p:
        a = p.agent("--job", "j", "--megatron-log", log, "--nvml", "off", "--host", "off", "--ranks", "off")
        p.send("node-b", [{"steps": [StepRecord(job="j", iteration=i, rank="last", end_time=1e9 + i,
                                                  step_time_ms=100.0) for i in range(1, 4)]}], ["j"])
        p.collected(a, "megatron")
        with pytest.raises(WaitTimeout) as got:
            p.wait(lambda: False, 0.3, "nothing")
        said = str(got.value)
        assert "aggregator saw" in said and "3 step records" in said
        assert "agents saw" in said and '"megatron"' in said and "batches_acked" in said
    # gRPC's asyncio poller is one thread of the process, started at its first use and never ended.
    left = [t for t in threading.enumerate()
            if t not in before and t.is_alive() and "_poll_wrapper" not in t.name]
    assert not left, [t.name for t in left]
