"""A root per job (``perfd aggregator --engine --engine-job NAME``): its lease and subjects are the
job's alone, and the root of every job leaves a job with a root of its own to it — through its
standby's takeover (the lease lapses a TTL) and for the grace after — then reads it again. The reading
of the lease bucket is perfd.engine.leases.holders (real servers: tests/engine/test_engine_faults.py's
own-root test); here what the root does with what it read, at the times given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.model import StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.root import Root

BIG, SMALL = "pretrain 405b", "sft.small *"  # a dot, a space, a wildcard: subject syntax, as tokens


def _root(job: str | None = None) -> Root:
    cfg = S.EngineConfig(("nats://127.0.0.1:1",))
    return Root(cfg, EngineSink(AggregatorState(), Guard(Limits(), Refusals())), "root-x", job=job)


def test_a_jobs_own_root_holds_the_jobs_lease_and_reads_the_subjects_its_shards_and_agents_publish() -> None:
    own, every = _root(BIG), _root()
    assert own.lease == S.root_lease(BIG) != S.root_lease(SMALL) and every.lease == S.ROOT_LEASE
    assert own.lease.startswith(S.JOB_ROOTS_PREFIX) and not every.lease.startswith(S.JOB_ROOTS_PREFIX)
    assert S.root_http_key(BIG) != S.root_http_key(None) == S.ROOT_HTTP_KEY
    # what the job's own root subscribes to is exactly where its messages are published
    for prefix, subject in ((S.PARTIALS_PREFIX, S.partials_subject), (S.RECORDS_PREFIX, S.records_subject),
                            (S.EVENTS_PREFIX, S.events_subject), (S.SUMMARIES_PREFIX, S.summaries_subject)):
        assert S.root_filter(prefix, BIG) == subject(BIG) != subject(SMALL)
        assert S.root_filter(prefix, None) == f"{prefix}.>"
        assert S.token_of(subject(BIG)) == S.job_token(BIG)
    assert own.stats_json()["job"] == BIG and every.stats_json()["job"] is None
    # its streams' gaps are other jobs' messages: what they let go is unknown to it, not 0
    assert own.stats_json()["partials_skipped"] is None and every.stats_json()["partials_skipped"] == 0


def test_the_root_of_every_job_leaves_a_job_to_its_own_root_and_lets_go_of_what_it_held() -> None:
    state = AggregatorState()
    sink = EngineSink(state, Guard(Limits(), Refusals()))
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "every")
    for job in (BIG, SMALL):  # held before BIG got a root of its own
        state.ingest_steps("engine", [StepRecord(job=job, iteration=1, rank="all", step_time_ms=100.0)])
    big, small = ((S.partials_subject(j), j.encode()) for j in (BIG, SMALL))
    assert root.job_roots.ours([big, small]) == [BIG.encode(), SMALL.encode()]  # no job has a root of its own
    root.note_job_roots({S.job_token(BIG)})
    # its copy here let go of (it would stand still while the job runs), its messages left to its root
    assert sorted(state.job_names()) == [SMALL]
    assert root.job_roots.ours([big, small, big]) == [SMALL.encode()]
    assert root.stats.led_elsewhere == 2 and root.stats.jobs_led_elsewhere == 1
    root.note_job_roots({S.job_token(BIG)})  # read again, the same: nothing more let go of
    assert root.job_roots.ours([big]) == [] and root.stats.led_elsewhere == 3
    # its key expired (no root of its own for the grace): read again, from the next message
    root.note_job_roots(set())
    assert root.job_roots.ours([big, small]) == [BIG.encode(), SMALL.encode()]
    assert root.stats.jobs_led_elsewhere == 0 and root.stats.led_elsewhere == 3


def test_a_jobs_own_root_also_reads_the_nodes_events_of_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' process lists come as events of no job (the node's agent reads the GPUs for every job
    on it): a job's own root reads them beside its job's subjects, or it could not place its ranks on
    their GPUs (a hang would read as an exit)."""
    from perfd.engine import root as root_module
    from tests.engine.test_root_lead_ends import _JS, _KV, _Keeper

    async def never(*args: object, **kw: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(root_module, "watch_engine", never)
    subjects: dict[str, str] = {}

    class JS(_JS):
        async def subscribe(self, subject: str, stream: str, **kw: object) -> Any:
            subjects[subject] = stream
            return await super().subscribe(subject, stream)

    async def lead(root: Root) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(root._lead(JS(), _Keeper(), stop, _KV(), _KV()))  # type: ignore[arg-type]
        while len(subjects) < len(root._readers) + 1:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(lead(_root(BIG)))
    assert subjects == {S.partials_subject(BIG): S.PARTIALS_STREAM, S.records_subject(BIG): S.RECORDS_STREAM,
                        S.events_subject(BIG): S.EVENTS_STREAM, S.summaries_subject(BIG): S.SUMMARIES_STREAM,
                        S.events_subject(""): S.EVENTS_STREAM}
    subjects.clear()
    asyncio.run(lead(_root()))  # the root of every job: every job's, those of no job among them
    assert sorted(subjects) == sorted(f"{p}.>" for p in (S.PARTIALS_PREFIX, S.RECORDS_PREFIX, S.EVENTS_PREFIX,
                                                         S.SUMMARIES_PREFIX))
