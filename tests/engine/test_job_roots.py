"""A root per job (``perfd aggregator --engine --engine-job NAME``): its lease and subjects are the
job's alone (and the events of no job), and the root of every job leaves a job with a root of its own
to it, letting go of what it held of it, while the engine's job-roots bucket has the job's key
(perfd.engine.job_roots; a real nats-server below, and tests/engine/test_engine_faults.py's own-root
test with real processes); here what the root does with what it read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.model import StepRecord
from perfd.core.refusals import Refusals
from perfd.engine import job_roots
from perfd.engine import subjects as S
from perfd.engine.connect import ensure_streams
from perfd.engine.natsd import NatsCluster
from perfd.engine.partial import Partial, encode
from perfd.engine.root import Root
from tests.engine.test_natsd import _need_nats_server

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
        def __init__(self, expected: int) -> None:
            super().__init__()
            self.expected, self.all_made = expected, asyncio.Event()

        async def subscribe(self, subject: str, stream: str, **kw: object) -> Any:
            subjects[subject] = stream
            if len(subjects) == self.expected:  # the partials' and each reader's
                self.all_made.set()
            return await super().subscribe(subject, stream)

    async def lead(root: Root) -> None:
        stop, js = asyncio.Event(), JS(len(root._readers) + 1)
        task = asyncio.create_task(root._lead(js, _Keeper(), stop, _KV(), _KV()))  # type: ignore[arg-type]
        await asyncio.wait_for(js.all_made.wait(), 10)
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


def _message(job: str, it: int, ranks: range) -> tuple[str, bytes]:
    """A shard's partials message of ``job``'s iteration ``it``, ``ranks`` folded in."""
    p = Partial(job, it, ranks=set(ranks), messages=[f"{job}:{it}:{min(ranks)}"])
    p.add_records([StepRecord(job=job, iteration=it, rank=r, end_time=1_795_000_000.0 + it,
                              step_time_ms=100.0) for r in ranks])
    return S.partials_subject(job), encode(f"{job}:{it}:{min(ranks)}", "shard-0", 0, [p])


def test_what_the_root_held_back_of_a_job_let_go_of_never_reaches_the_store_after() -> None:
    """A large job's iterations held back at the root (not whole, under HAND_ON_S) when the job gets a root
    of its own: let go of with the rest, so the lead's last flush brings no half-copy of it back."""
    state = AggregatorState()
    sink = EngineSink(state, Guard(Limits(), Refusals()))
    root = Root(S.EngineConfig(("nats://127.0.0.1:1",)), sink, "every")
    root.handle(root.job_roots.ours([_message(BIG, it, range(0, 3000)) for it in (1, 2, 3)]))
    root.handle(root.job_roots.ours([_message(BIG, it, range(3000, 5000)) for it in (1, 2, 3)]))
    assert BIG in state.job_names()
    root.note_job_roots({S.job_token(BIG)})
    assert BIG not in state.job_names() and root.stats.jobs_forgotten == 0  # let go of, not idle
    root.handle(root.job_roots.ours([_message(BIG, 3, range(5000, 6000)), _message(SMALL, 1, range(0, 8))]))
    root.flush(every=True)  # the lead's end: whatever the fold held back goes to the store
    assert sorted(state.job_names()) == [SMALL], "a half-copy of the job came back"


class _FailingJS:
    async def key_value(self, bucket: str) -> object:
        raise TimeoutError("nats: timeout")


def test_a_failed_first_reading_of_the_job_roots_ends_the_session_a_later_one_keeps_the_last() -> None:
    root = _root()
    root.note_job_roots({S.job_token(BIG)})
    with pytest.raises(TimeoutError):  # before any stream is read: never read past
        asyncio.run(root._look_for_job_roots(_FailingJS(), first=True))  # type: ignore[arg-type]
    asyncio.run(root._look_for_job_roots(_FailingJS()))  # type: ignore[arg-type]
    assert root.job_roots.tokens == {S.job_token(BIG)}


@pytest.mark.timeout(60)
def test_the_bucket_says_which_jobs_have_roots_a_key_deleted_by_hand_not_among_them(tmp_path: Path) -> None:
    _need_nats_server()

    async def main(urls: list[str]) -> list[set[str]]:
        import nats

        nc = await nats.connect(urls)
        try:
            js = nc.jetstream()
            seen = [await job_roots.read(js)]  # no bucket yet: no job has a root of its own
            await ensure_streams(nc, S.EngineConfig(tuple(urls)), job_roots=True)
            roots = await js.key_value(S.JOB_ROOTS_BUCKET)
            await job_roots.mark(roots, BIG, "root-a")
            await job_roots.mark(roots, SMALL, "root-b")
            seen.append(await job_roots.read(js))
            await roots.delete(S.job_token(SMALL))  # an operator handing the job back
            seen.append(await job_roots.read(js))
            info = await js.stream_info(S.kv_stream(S.JOB_ROOTS_BUCKET))
            assert info.config.max_age == S.JOB_ROOTS_TTL_S == S.PARTIALS_MAX_AGE_S
            return seen
        finally:
            await nc.close()

    with NatsCluster(tmp_path / "nats", 1) as cluster:
        seen = asyncio.run(main(list(cluster.urls)))
    assert seen == [set(), {S.job_token(BIG), S.job_token(SMALL)}, {S.job_token(BIG)}]
