"""Aggregators sharded by job: every agent of a job picks the same aggregator (rendezvous hashing),
and each aggregator holds only its jobs — two real aggregators, agents from the command line (in the
test's process: tests/inproc.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfd.agent.config import apply_overrides, load_config
from perfd.transport.shard_routing import pick_aggregator
from tests.faults.test_network_faults import _megatron_lines
from tests.inproc import pipeline
from tests.procs import http_get, wait_for

ROOT = Path(__file__).resolve().parents[1]


def test_rendezvous_is_stable_and_moves_few_jobs_when_an_aggregator_is_added() -> None:
    two = ["a:1", "b:1"]
    jobs = [f"job-{i}" for i in range(400)]
    first = {j: pick_aggregator(j, two) for j in jobs}
    assert first == {j: pick_aggregator(j, list(reversed(two))) for j in jobs}  # order does not matter
    assert 120 < sum(v == "a:1" for v in first.values()) < 280  # both get jobs
    three = {j: pick_aggregator(j, [*two, "c:1"]) for j in jobs}
    moved = [j for j in jobs if three[j] != first[j]]
    assert all(three[j] == "c:1" for j in moved) and len(moved) < 200  # only to the new one


def test_the_agent_resolves_its_shard_from_the_job() -> None:
    cfg = apply_overrides(load_config(None), aggregator="h1:5,h2:5", job="gpt-a", nvml="off", host=False)
    assert cfg.aggregator == pick_aggregator("gpt-a", ["h1:5", "h2:5"])


@dataclass
class ShardedPair:
    """Two real aggregators and one agent per job, the agents given both addresses."""

    aggs: list[tuple[str, str]]  # (gRPC HOST:PORT, HTTP base URL)
    jobs: list[str]  # jobs[i] lands on aggs[i]


@contextlib.contextmanager
def sharded_pair(tmp_path: Path, aggregator_args: tuple[str, ...] = ()) -> Iterator[ShardedPair]:
    """The pair in the test's process (tests/inproc.py), each agent as `perfd agent --aggregator A,B`."""
    with contextlib.ExitStack() as stack:
        ps = [stack.enter_context(pipeline(tmp_path, "--no-rules", *aggregator_args)) for _ in range(2)]
        addrs = [p.target for p in ps]
        names = [f"job-{i}" for i in range(50)]
        jobs = [next(j for j in names if pick_aggregator(j, addrs) == a) for a in addrs]
        head, lines = _megatron_lines(12)
        for i, job in enumerate(jobs):
            log = tmp_path / f"{job}.log"
            log.write_text(head + "".join(lines))
            # Run by the pipeline that ends first (the last entered): the agents stop before either
            # aggregator does.
            ps[-1].agent("--aggregator", ",".join(addrs), "--job", job, "--megatron-log", log, "--nvml",
                         "off", "--host", "off", "--metrics-port", "-1", "--agent-id", f"node-{i}",
                         name=f"agent{i}")
        yield ShardedPair([(p.target, p.base) for p in ps], jobs)


def jobs_at(base: str) -> list[str]:
    jobs = json.loads(http_get(f"{base}/api/jobs"))["jobs"]
    return sorted(j["job"] if isinstance(j, dict) else j for j in jobs)


@pytest.mark.slow
def test_two_aggregators_each_hold_only_their_jobs(tmp_path: Path) -> None:
    with sharded_pair(tmp_path) as pair:
        (_, b0), (_, b1) = pair.aggs
        wait_for(lambda: jobs_at(b0) and jobs_at(b1), 60, "both jobs at their shards")
        assert jobs_at(b0) == [pair.jobs[0]] and jobs_at(b1) == [pair.jobs[1]]
