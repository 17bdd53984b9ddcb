"""Every name the distributed path uses on the engine, declared once: streams, subjects, consumers,
the KV bucket of leases, and how a node's records find their partition.

Subjects carry a job *token* (a hash of the job name), never the name itself: a job name may hold
dots, spaces or wildcards that are subject syntax (the name travels inside the message). A node's
partition is a hash of (job, node) into ``partitions`` buckets, so one job's nodes spread over every
partition and the shard that holds a partition reduces a fixed slice of each job's nodes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

NODES_STREAM = "PERFD_NODES"  # node messages: a work queue, each taken by one shard
PARTIALS_STREAM = "PERFD_PARTIALS"  # shard partials: the jobs' history, read by their root
RECORDS_STREAM = "PERFD_RECORDS"  # nodes' collective records (the store's share), read by the root as sent
# Nodes' events (hang events, XIDs, process lists, ...), read by the root as sent: a stream of their own,
# so that the collective records' volume, which a root behind lets the engine drop (RECORDS_MAX_BYTES),
# never takes them with it (perfd.engine.root counts what a stream let go unread)
EVENTS_STREAM = "PERFD_EVENTS"
# Shards' step summaries (perfd.engine.stepsummary: a size no rank count changes), beside the partials
# they summarise, read by the job's root: a stream of their own, so that an engine made before them
# takes them without its partials stream's subjects changing (JetStream refuses another config).
SUMMARIES_STREAM = "PERFD_SUMMARIES"
# The agents' window-figure rows a shard holds for its partitions' communication summaries
# (perfd shard --comm-summaries: perfd.engine.comm_rows), saved as they are taken, a subject per
# (job, partition, iteration), purged as the shard lets an iteration go: a partition's next holder reads
# them back, so that a lease that moves (a shard killed, or its loop held past the TTL) takes no row with
# it. Read by no root.
COMMROWS_STREAM = "PERFD_COMMROWS"
# Each stream's short name: the ``stream`` label of the root's series (what it let go unread, the
# streams' state) and the keys of its counters
STREAM_LABELS = {NODES_STREAM: "nodes", PARTIALS_STREAM: "partials", RECORDS_STREAM: "records",
                 EVENTS_STREAM: "events", SUMMARIES_STREAM: "summaries", COMMROWS_STREAM: "commrows"}
ROOT_STREAMS = (PARTIALS_STREAM, RECORDS_STREAM, EVENTS_STREAM, SUMMARIES_STREAM)  # those a job's root reads
LEASES_BUCKET = "perfd_leases"  # KV: partition -> shard, "root" -> root (expire unless renewed)


def kv_stream(bucket: str) -> str:
    """The stream under a KV bucket, as JetStream names it (nats.js.kv's KV_STREAM_TEMPLATE)."""
    return f"KV_{bucket}"


def kv_subject(bucket: str, key: str) -> str:
    """A key's subject in its bucket's stream (a subject filter where ``key`` ends in ``>``)."""
    return f"$KV.{bucket}.{key}"


# KV: job token -> the job's info as a shard last read it from the job's node messages (its layout: which
# rank is which pipeline stage). A shard that takes a partition over reads it here before it folds that
# job's first message: the agents send it on change and once a minute (perfd.agent.node_agent
# .JOBINFO_RESEND_S), so without it the taking shard's ranks went stage-unknown for up to a minute.
JOBINFO_BUCKET = "perfd_jobinfo"
JOBINFO_TTL_S = 3600.0  # a job info no shard put for this long is let go (a shard puts it again at half)
JOBINFO_MAX_BYTES = 64 * 1024 * 1024  # the bucket's bound: ~16k jobs of a 4 KiB info
NODES_PREFIX = "perfd.nodes"
PARTIALS_PREFIX = "perfd.partials"
RECORDS_PREFIX = "perfd.records"
EVENTS_PREFIX = "perfd.events"  # a subject on the wire, not a module path
SUMMARIES_PREFIX = "perfd.summaries"
COMMROWS_PREFIX = "perfd.commrows"
# Commands to one agent (a capture, a stall's stacks): core NATS request/reply, not a stream — a
# command is only meaningful now (as on a stream to an aggregator), and the reply says it arrived.
COMMANDS_PREFIX = "perfd.commands"
COMMAND_REPLY_TIMEOUT_S = 5.0
# The lease of the root that leads every job without a root of its own; a job's own root (perfd
# aggregator --engine-job NAME) holds ROOT_LEASE.<job token> (root_lease) and reads only that job's subjects.
ROOT_LEASE = "root"
JOB_ROOTS_PREFIX = ROOT_LEASE + "."  # the lease keys of jobs' own roots
# KV: job token -> the id of the job's own root that led it last, put while it leads (every renew):
# a key lasts JOB_ROOTS_TTL_S past the last put, so the root of every job — any of its processes, a
# standby that takes over or one started again included — leaves the job to its own root across that
# root's failover (a lease TTL) and for the grace after, and then reads it again. As long as the
# partials are kept (below): a root of every job that starts reading the streams again after the key
# went finds none of the job's history there to rebuild a stale copy from.
JOB_ROOTS_BUCKET = "perfd_jobroots"
# The leading root's HTTP as it advertises it (--engine-advertise-http), in the lease bucket: it expires
# with the leadership, and a standby forwards the API there (perfd.aggregator.forward). A job's own root
# puts it under ROOT_HTTP_KEY.<job token>.
ROOT_HTTP_KEY = "root-http"
DEFAULT_PARTITIONS = 16
# Where a job's collective operations are folded into per-window figures when its ranks' step records
# come from this node (the step hook): on the agent (its `window_fold`), or at the shard holding the
# node's partition (every operation sent there: a shard from before the agents folded takes only
# these). The first is the default (perfd.engine.publisher says what each costs).
COLLECTIVES_FOLDED_AT = ("agent", "shard")
# The engine's timers: the defaults of EngineConfig's, per deployment (--engine-lease-ttl,
# --engine-ack-wait), the same on every shard and root. A lease is renewed every lease_ttl_s / 3; a
# holder silent for lease_ttl_s loses it (the bucket's keys expire), and another shard takes the
# partition, its unacknowledged messages redelivered.
LEASE_TTL_S = 6.0
# A node message unacknowledged this long is delivered again (to whichever shard holds the partition).
ACK_WAIT_S = 10.0
# A node message a shard holds for its windows (perfd.engine.shard_windows) is released this long
# before its ack wait runs out (its hold is the rest: 7 s of the 10 s), for the flush that publishes
# what it fed and acknowledges it (the next flush, a fold's turn of the loop, the publishes' round
# trips); or half the ack wait before, where that is less: a hold under the ack wait whatever it is.
HOLD_MARGIN_S = 3.0
DUPLICATE_WINDOW_S = 120.0  # the engine drops a message whose id it saw within this window


def job_token(job: str) -> str:
    """The job's name as one subject token: 16 hex digits of its sha256."""
    return hashlib.sha256(job.encode()).hexdigest()[:16]


def partition_of(job: str, node: str, partitions: int) -> int:
    """The partition of ``node``'s records of ``job`` (0 .. partitions-1)."""
    h = hashlib.sha256(f"{job}\0{node}".encode()).digest()
    return int.from_bytes(h[:8], "big") % partitions


def root_lease(job: str | None) -> str:
    """The lease of ``job``'s own root, or (None) of the root of every job without one."""
    return ROOT_LEASE if job is None else JOB_ROOTS_PREFIX + job_token(job)


def root_http_key(job: str | None) -> str:
    """Where the leading root of ``job`` (None: of every job without one) advertises its HTTP."""
    return ROOT_HTTP_KEY if job is None else f"{ROOT_HTTP_KEY}.{job_token(job)}"


def root_filter(prefix: str, job: str | None) -> str:
    """What a root reads of a stream whose subjects are ``prefix.<job token>``: ``job``'s subject alone
    (its own root: the engine delivers it no other job's message), or every job's (None)."""
    return f"{prefix}.{'>' if job is None else job_token(job)}"


def token_of(subject: str) -> str:
    """The job token of a partials, records, events or summaries subject (its last token)."""
    return subject.rpartition(".")[2]


def node_subject(job: str, partition: int) -> str:
    return f"{NODES_PREFIX}.{job_token(job)}.{partition}"


def partition_filter(partition: int) -> str:
    """Every job's node messages of one partition."""
    return f"{NODES_PREFIX}.*.{partition}"


def partials_subject(job: str) -> str:
    return f"{PARTIALS_PREFIX}.{job_token(job)}"


def summaries_subject(job: str) -> str:
    """A shard's summaries of ``job``'s partitions (perfd.engine.summary_codec, in an EngineBatch)."""
    return f"{SUMMARIES_PREFIX}.{job_token(job)}"


def commrows_subject(job: str, partition: int, iteration: int | None = None) -> str:
    """Where a shard saves ``job``'s rows of ``partition`` whose newest iteration is ``iteration`` (None:
    a filter of every one)."""
    return f"{COMMROWS_PREFIX}.{job_token(job)}.{partition}.{'*' if iteration is None else iteration}"


def commrows_filter(partition: int) -> str:
    """Every job's saved rows of one partition."""
    return f"{COMMROWS_PREFIX}.*.{partition}.*"


def records_subject(job: str) -> str:
    """A node's collective records of ``job`` (and, from an agent before the events stream, its events)."""
    return f"{RECORDS_PREFIX}.{job_token(job)}"


def events_subject(job: str) -> str:
    """A node's events of ``job`` ("": events of no job, a node's own)."""
    return f"{EVENTS_PREFIX}.{job_token(job)}"


def command_subject(agent_id: str) -> str:
    """Where ``agent_id`` listens for commands (its id hashed, as a job's name is)."""
    return f"{COMMANDS_PREFIX}.{job_token(agent_id)}"


def partition_lease(partition: int) -> str:
    return f"partition.{partition}"


def partition_handed(partition: int) -> str:
    """Put (in the lease bucket, expiring with its TTL) by a shard that gave a partition up on purpose,
    its held messages handed back (nak: the engine delivers them first to the next holder), so that
    holder need not wait out the ack wait as after a crash."""
    return f"handed.{partition}"


def shard_consumer(partition: int) -> str:
    """The durable consumer of a partition: whichever shard holds its lease pulls from it, so the
    engine keeps what was delivered and not acknowledged across a change of holder."""
    return f"shard-p{partition}"


@dataclass(frozen=True)
class EngineConfig:
    """How a process reaches the engine: its servers, a token, TLS (a CA, and a client certificate
    for mutual TLS), and the number of partitions the streams were made with; and the engine's timers,
    the same on every shard and root of a deployment (the lease bucket is made with the TTL, each
    partition's consumer with the ack wait, by the first process that makes them)."""

    servers: tuple[str, ...]
    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    partitions: int = DEFAULT_PARTITIONS
    lease_ttl_s: float = LEASE_TTL_S
    ack_wait_s: float = ACK_WAIT_S

    @property
    def renew_s(self) -> float:
        """How often a lease is renewed (and a standby root looks for a free one): a third of its TTL."""
        return self.lease_ttl_s / 3

    @property
    def hold_s(self) -> float:
        """How long a shard holds a node message for its windows from its delivery: under the ack wait
        by HOLD_MARGIN_S (7 s of 10), or by half of it where that is less (2 s of 4)."""
        return self.ack_wait_s - min(HOLD_MARGIN_S, self.ack_wait_s / 2)

# Stream bounds. Node messages wait for a shard: 1 GiB holds ~10 minutes of a 12,500-node job at one
# iteration every 2 s (~13 KB a message with 8 ranks' timers) should every shard be down. Partials,
# and the nodes' events and collective records beside them, are the jobs' history a new root replays:
# kept an hour.
NODES_MAX_BYTES = 1 << 30
PARTIALS_MAX_BYTES = 4 << 30
PARTIALS_MAX_AGE_S = 3600.0
JOB_ROOTS_TTL_S = PARTIALS_MAX_AGE_S
RECORDS_MAX_BYTES = 1 << 30
# Events are few (a node's hang events, XIDs, process lists: KBs a minute) and each may matter alone
EVENTS_MAX_BYTES = 256 << 20
# A summary is a few KB whatever the ranks, one a partition and iteration a flush touched
SUMMARIES_MAX_BYTES = 256 << 20
# The rows the shards hold (~60-100 bytes a row: a 100,000-rank job's hundred kept iterations ~0.8 GB);
# the oldest go first past it (a partition then read back with fewer windows than its holder had)
COMMROWS_MAX_BYTES = 2 << 30
# Past the hundred iterations a holder keeps at an iteration every ~14 minutes: what is let go of is purged
COMMROWS_MAX_AGE_S = 24 * 3600.0
