"""A root per job (``perfd aggregator --engine --engine-job NAME``): its lease and subjects are the
job's alone, and the root of every job leaves a job with a root of its own to it — through its
standby's takeover (the lease lapses a TTL) and for the grace after — then reads it again. The reading
of the lease bucket is perfd.engine.leases.holders (real servers: tests/engine/test_engine_faults.py's
own-root test); here what the root does with what it read, at the times given."""

from __future__ import annotations

from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.core.limits import Limits
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.root import LED_ELSEWHERE_GRACE_S, Root

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


def test_the_root_of_every_job_leaves_a_job_to_its_own_root_through_a_failover_and_the_grace() -> None:
    root = _root()
    big, small = ((S.partials_subject(j), j.encode()) for j in (BIG, SMALL))
    assert root.ours([big, small]) == [BIG.encode(), SMALL.encode()]  # no job has a root of its own
    root.note_job_roots({S.job_token(BIG): "root-a"}, now=100.0)
    assert root.ours([big, small, big]) == [SMALL.encode()]
    assert root.stats.led_elsewhere == 2 and root.stats.jobs_led_elsewhere == 1
    # its leader killed: the lease lapses, its standby takes it a TTL later; meanwhile still left to it
    root.note_job_roots({}, now=106.0)
    assert root.ours([big]) == [] and root.stats.jobs_led_elsewhere == 1
    root.note_job_roots({S.job_token(BIG): "root-b"}, now=108.0)
    root.note_job_roots({}, now=108.0 + LED_ELSEWHERE_GRACE_S)  # gone, within the grace
    assert root.ours([big]) == [] and root.stats.led_elsewhere == 4
    # no root of its own for longer than the grace: this root reads the job again
    root.note_job_roots({}, now=108.0 + LED_ELSEWHERE_GRACE_S + 1)
    assert root.ours([big, small]) == [BIG.encode(), SMALL.encode()]
    assert root.stats.jobs_led_elsewhere == 0 and root.stats.led_elsewhere == 4
