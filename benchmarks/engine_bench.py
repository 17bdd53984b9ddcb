"""`perfd bench engine`: the distributed path (perfd.engine) under one simulated large job.

    perfd bench engine --nodes 1000 --shards 4 --seconds 30 [--procs 2] [--json]

Every part is a real process on this machine, the shipped code: one nats-server with JetStream (token
auth unless ``--no-auth``; ``--tls``: its client port behind TLS, a CA made for the run), ``--shards``
``perfd shard`` processes and one ``perfd aggregator --engine`` (the job's root). The job has
``--nodes`` nodes of 8 ranks and ends an iteration every ``--iteration-s`` seconds. ``--procs`` load
processes play the agents: per iteration each node publishes the one message a real agent's
EngineClient would (an EngineBatch with the Partial of its 8 ranks' step-hook records) to its
partition's subject with ``js.publish(..., headers={"Nats-Msg-Id": id})``, ``--inflight`` at a time.
Before the first iteration each node sends what a real agent sends as its job starts: its 8 GPUs'
process lists on the records stream (their labels name the GPU model: the root's MFU needs it), and
node 0 the job's info (the hook's dtype). ``--log``: a Megatron-LM job, its last rank's log on node 0:
node 0's message of each iteration also carries the log's record (the recorded H200 log's, replayed in
turn: perfd's demo data), and its job info is the log's start-up; the job's iterations are then the
log's (MFU, the exposed communication from its timers, the slowest rank as its straggler detector
names it), as one aggregator reads such a job.
Each node's message is built once by perfd's own ``partials_of`` + ``encode``; per iteration only what
changes (message id, iteration, end time, step time) is set on the parsed protobuf, so 12,500 nodes
cost the load little. Every rank's end time is the iteration's wall-clock end: the root's lag is real.

Measured over ``--seconds`` after ``--warmup`` (psutil): CPU cores (mean and peak over 0.5 s) and RSS
of each shard, the root and nats-server, the load's CPU, the messages offered per second, the shards'
counters (their --stats-file: node messages, leases, ``consumer_restarts``) and the root's engine
counters from /api/stats (node messages folded, complete iterations, redeliveries; ``lag_s``, from an
iteration's end to the moment the root holds every rank of it, quantiles over every iteration the root
completed, warm-up included: ``n`` says how many); with ``--collectives``, the operations the shards
folded in the window and the shards' CPU per operation and per node message
(``window.shards_cpu_us_per_operation``: everything a shard does, divided). As an independent check,
the root's /api/jobs/<job>/iterations is polled every POLL_S: its newest row against the newest
iteration every load process published (``behind_iterations``), and that row's age (a row shows once
any node of it is in), and what that row answers (``answer_present``: the polls whose newest row had
MFU, the slowest rank, the exposed communication), and ``answer_lag``: per iteration of the window,
from its end to the first poll from which on its row gave the answer it gives after the drain
(benchmarks/answer_lag.py).
The root holds an iteration whole to the world the job's info names
(the hook job's); where it names fewer ranks than the job shows (the ``--log`` job's recorded 2 GPUs),
to the ranks shown, and counts an iteration complete only once the job has shown another: the job's
first iteration is then not counted, and ``complete`` is one short of the iterations offered.

After the window the load stops at a common iteration and the run drains (``--drain`` s at most):
``final`` says whether every message published was folded at the root once and every iteration (but
that first one) complete; ``engine_consumers`` is nats-server's view of the node stream then (messages
waiting, redelivered, and ``stalled``: the partitions whose messages wait while no shard pulls).

With 2 cores every process here, and anything else the host runs (``machine.others_cores``), shares
the same CPUs: the figures are a lower bound of what dedicated hosts do. ``load.behind_s`` (how late
an iteration began publishing) and ``load.publish_span_s`` (an iteration's end to its last
acknowledgement) say when the load itself could not keep up.

``--json`` prints one object: machine, config, message_bytes, offered_msgs_per_s, nominal_msgs_per_s,
published, iterations_offered, window, root, shards, shards_cpu_cores, nats, load, iterations_check,
final, engine_consumers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.answer_lag import AnswerWatch  # noqa: E402
from perfd.aggregator.daemon import AggregatorConfig  # noqa: E402
from perfd.engine import subjects as S  # noqa: E402

JOB = "engine-bench job"  # a space: the subject carries the job's token, the name rides inside
RANKS_PER_NODE = 8
# What a real node's agent names its GPUs by (collectors/nvml: every process list's labels carry the
# model): the root learns the job's GPU model, and with it MFU's peak, from these alone (no series
# reach it, and the root runs without --gpu).
GPU_MODEL = "NVIDIA H100 80GB HBM3"
SAMPLE_S = 0.5  # the CPU sampler's period (the per-interval peaks)
# The root's /iterations is polled this often: the answer's lag is measured to within it (an API read of
# a 100k-rank job's rows took 3 ms p50, 87 ms p99 on the 16-core host: api_iterations_s)
POLL_S = 0.5
# The root rebuilds a changed job's analysis this often (its reads serve the last one); the rows after the
# drain are read until two reads two refreshes apart agree, at most SETTLE_READS of them.
REFRESH_S = AggregatorConfig.refresh_interval_s
SETTLE_READS = 20
# The root's engine counters (/api/stats) and the shards' (--stats-file) the result carries, after the drain.
ROOT_COUNTERS = ("complete", "node_messages", "redelivered", "late", "batches", "partials", "undecodable",
                 "collectives", "collectives_folded", "figure_rows", "node_records_messages",
                 "records_skipped", "partials_skipped", "events_skipped", "leadership_lost")
SHARD_COUNTERS = ("id", "partitions", "node_messages", "delivered_again", "batches_published",
                  "publish_errors", "leases_taken", "leases_lost", "consumer_restarts", "takeover_waits",
                  "figure_rows_forwarded", "windows", "comm_summaries_published", "comm")
# ``--collectives``: each rank's collective operations an iteration (benchmarks.collectives_bench's job:
# COLLECTIVE_OPS tensor-parallel all-reduces, one data-parallel all-reduce and a world barrier)
COLLECTIVE_OPS = 4
OPS_PER_RANK_ITERATION = COLLECTIVE_OPS + 2


# --------------------------------------------------------------------------------------- load side


def _rank_records(job: str, node: int, world: int, iteration: int, end: float) -> list[Any]:
    """The step hook's records of one node's 8 ranks (collectors/hook's shape)."""
    from perfd.core.model import (
        HOOK_COMPUTE,
        HOOK_DATA_WAIT,
        HOOK_OUTSIDE,
        Provenance,
        StepRecord,
        TimerValue,
    )

    out = []
    for lr in range(RANKS_PER_NODE):
        r = node * RANKS_PER_NODE + lr
        pid = 10_000 + lr
        st = 1000.0 + ((r * 37) % 97) * 0.1  # ms: ranks differ a little, the slowest is a fixed one
        timers = {name: TimerValue(round(st * f, 3), round(st * f, 3), {r: round(st * f, 3)})
                  for name, f in ((HOOK_DATA_WAIT, 0.01), (HOOK_COMPUTE, 0.9), (HOOK_OUTSIDE, 0.02))}
        out.append(StepRecord(
            job=job, iteration=iteration, rank=r, end_time=end, step_time_ms=st, interval=1,
            fields={"timing": "cuda", "pid": str(pid), "percentile_window": "100", "step_time": "period",
                    "in_step_ms": f"{st * 0.97:.6g}", "data_wait_from": "fetch",
                    "step_time_p50_ms": f"{st:.6g}", "step_time_p90_ms": f"{st * 1.01:.6g}",
                    "step_time_p99_ms": f"{st * 1.02:.6g}", "compute_ms": f"{st * 0.9:.6g}"},
            timers=timers, source=Provenance("hook", f"rank{r}:pid{pid}"),
            tokens_per_step=8192.0 * world, flops_per_step=6e12 * world))
    return out


# The job's per-iteration answer as the root's /iterations rows give it: MFU, the slowest rank (the
# fold's step is that rank's: its record's source), and the exposed communication (a framework's
# timers give it; the step hook has none, so a hook-only job's is absent, not invented).
ANSWER = ("mfu", "slowest_rank", "comm_exposed_share")


def _answer_of(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The answer's parts in one row: the slowest rank as the framework's straggler detector names it
    (a log's row), else the rank whose step the fold took (its source)."""
    if row is None:
        return None
    src = str(row.get("source") or "")
    rank = row.get("straggler_rtt_max_rank")
    if rank is None:
        rank = next((int(p[4:]) for p in src.split(":") if p.startswith("rank") and p[4:].isdigit()), None)
    return {"mfu": row.get("mfu"), "slowest_rank": rank, "comm_exposed_share": row.get("comm_exposed_share")}


def _settled_rows(job_url: str) -> list[dict[str, Any]]:
    """Each iteration's answer as the run ends: what the polls' rows are held to. The counters say the
    root has every message; the rows come from the analysis, which reads lag by up to a refresh (the
    aggregator rebuilds a changed job's every REFRESH_S), so they are read until two reads two refreshes
    apart agree (at most SETTLE_READS of them)."""
    prev: list[dict[str, Any]] | None = None
    for _ in range(SETTLE_READS):
        try:
            rows = [r for r in _get_json(job_url)[0].get("iterations") or [] if "iteration" in r]
        except OSError:
            rows = []
        if rows and rows == prev:
            return rows
        prev = rows
        time.sleep(2 * REFRESH_S)
    return prev or []


def node_name(n: int) -> str:
    return f"node-{n:05d}"


def node_templates(job: str, first: int, n: int, world: int, partitions: int, epoch: str,
                   collectives: bool = False) -> list[tuple[str, Any, OpsTemplate | None]]:
    """(subject, parsed EngineBatch) of each node, made once by perfd's own encoder; ``collectives``:
    with its ranks' operations of an iteration beside the partial, as an agent sends them to the
    shard (the template's iteration 0; each iteration moves their times and sequence numbers on)."""
    import random

    from benchmarks.collectives_bench import _node_records
    from perfd.core.collfold import SENT_RETENTION, Retention, reduce
    from perfd.engine.partial import encode, partials_of
    from perfd.transport.gen import perfd_pb2 as pb

    out = []
    now = time.time()
    rng = random.Random(1)
    ranks = list(range(world))
    nodes = world // RANKS_PER_NODE
    for node in range(first, first + n):
        mid = f"{node_name(node)}:{epoch}:0"
        recs = _rank_records(job, node, world, 0, now)
        colls = ([reduce(job, _node_records(node, RANKS_PER_NODE, nodes, it, COLLECTIVE_OPS, ranks, rng))
                  for it in (0, 1)] if collectives else [])
        data = encode(mid, node_name(node), time.time_ns(), partials_of(recs, mid), collectives=colls[:1],
                      to_partition=True)
        b = pb.EngineBatch()
        b.ParseFromString(data)
        ops = None
        if colls:  # each row's sequence number's step an iteration, from the template's next iteration
            nxt = pb.EngineBatch()
            nxt.ParseFromString(encode(mid, node_name(node), 0, (), collectives=colls[1:]))
            c0, c1 = b.collective_partials[0], nxt.collective_partials[0]
            s0, s1 = list(c0.collective_seq_id), list(c1.collective_seq_id)
            # the store's share as the agent sends it: each rank's newest of the iteration's operations
            # (SENT_RETENTION's k at the job's world, as collfold.for_sending: 2 at 100,000 ranks)
            keep = Retention(per_rank=SENT_RETENTION.k(world))
            share = pb.EngineBatch.FromString(encode(mid, node_name(node), 0, (), collectives=[
                colls[0].bound(keep)])).collective_partials[0]
            # the next iteration's sequence numbers from its rows in the order the wire lists them (not
            # encoded again: a world group's ranks made into runs is most of an encode at 100,000 ranks)
            h0 = list(share.collective_seq_id)
            h1 = [row.collective_seq_id or 0 for _, row in colls[1].bound(keep).ordered()]
            assert h0 == [row.collective_seq_id or 0 for _, row in colls[0].ordered()], "the wire's order"
            ops = OpsTemplate(s0, [y - x for x, y in zip(s0, s1, strict=True)], ShareTemplate(
                share, h0, [y - x for x, y in zip(h0, h1, strict=True)],
                share.time_created_delta_ns[0] - c0.time_created_delta_ns[0]))
        out.append((S.node_subject(job, S.partition_of(job, node_name(node), partitions)), b, ops))
    return out


@dataclass
class ShareTemplate:
    """The store's share of a node template's operations (a pb CollectivePartial of iteration 0), its
    rows' sequence numbers and their step an iteration, and its first row's enqueue time after the
    operations' first."""

    part: Any
    seq0: list[int]
    step: list[int]
    after_ns: int


@dataclass
class OpsTemplate:
    """A node template's operations: each row's sequence number at iteration 0 and its step an
    iteration (its enqueue times move as one: the column holds differences, the first from 0)."""

    seq0: list[int]
    step: list[int]
    share: ShareTemplate | None = None


# Where an iteration's operations start, after the iteration's previous end (the template's start at
# collectives_bench.T0; its operations span ~1.2 s: --iteration-s must be longer)
OPS_AFTER_S = 0.05


# Node messages the shards fold beside those the load counts as published: the job's info, which the
# job's first node sends on its partition's subject as the job starts (start_messages)
START_NODE_MESSAGES = 1


def start_messages(job: str, first: int, n: int, world: int, epoch: str, partitions: int,
                   log: bool = False) -> list[tuple[str, str, bytes]]:
    """(subject, message id, bytes) of what each node's agent sends once as the job starts: its 8 GPUs'
    process lists (each GPU's rank attributed by the step hook, perfd.agent.hook_gpus) on the records
    stream, and from the job's first node its job info (the hook's: the dtype MFU needs)."""
    from perfd.core.jobinfo_json import job_info_to_json
    from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout
    from perfd.engine.partial import encode
    from perfd.transport.codec import encode_batch
    from perfd.transport.series import SeriesTable

    out = []
    now = time.time()
    for node in range(first, first + n):
        name = node_name(node)
        evs = [{"kind": "gpu_processes", "severity": "info", "time": now, "text": "1 compute process(es)",
                "labels": {"node": name, "gpu": str(lr), "model": GPU_MODEL},
                "payload": [{"pid": 10_000 + lr, "name": "python", "rank": node * RANKS_PER_NODE + lr,
                             "local_rank": lr, "world_size": world, "job": job, "rank_from": "hook pid"}]}
               for lr in range(RANKS_PER_NODE)]
        mid = f"{name}:{epoch}:gpus"
        lists = encode_batch(name, 1, (), (), evs, SeriesTable())
        out.append((S.records_subject(job), mid, encode(mid, name, time.time_ns(), (), records=lists)))
        if node == 0:
            # The hooks' info names the world (torch.distributed's): the root holds an iteration
            # whole to it; the recorded log's start-up names its own 2 GPUs, fewer than the job shows.
            info = (_megatron_log(job).job_info if log
                    else JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                                 layout=ParallelLayout(world_size=world)))
            mid = f"{name}:{epoch}:info"
            out.append((S.node_subject(job, S.partition_of(job, name, partitions)), mid,
                        encode(mid, name, time.time_ns(), (), {job: job_info_to_json(info)})))
    return out


def _megatron_log(job: str) -> Any:
    """The recorded Megatron-LM log the ``--log`` job replays (perfd's demo data: 2 H200s, PP=2)."""
    from perfd.collectors.megatron import parse_file

    return parse_file(Path(__file__).resolve().parents[1] / "perfd" / "app" / "demo" / "data" /
                      "megatron_h200x2_tp1_pp2.log", job=job)


_LOGGED: list[Any] = []  # the log's records, read once per load process


def logged_message(node: int, world: int, epoch: str, iteration: int, end: float,
                   created_ns: int) -> tuple[str, bytes]:
    """Node 0's message of ``iteration`` in a ``--log`` job: its 8 ranks' records and its last rank's
    log record (the recorded log's, in turn, as the iteration's: its end, no start-up after the first,
    no end of training), made by perfd's own encoder."""
    import dataclasses

    from perfd.engine.partial import encode, partials_of

    if not _LOGGED:
        _LOGGED.extend(_megatron_log(JOB).records)
    rec = _LOGGED[(iteration - 1) % len(_LOGGED)]
    rec = dataclasses.replace(rec, iteration=iteration, end_time=end, first_of_run=iteration == 1,
                              train_iters=None)
    mid = f"{node_name(node)}:{epoch}:{iteration}"
    recs = [*_rank_records(JOB, node, world, iteration, end), rec]
    return mid, encode(mid, node_name(node), created_ns, partials_of(recs, mid))


def message_of(b: Any, node: int, epoch: str, iteration: int, end: float,
               created_ns: int, ops: OpsTemplate | None = None, iteration_s: float = 0.0
               ) -> tuple[str, bytes]:
    """The node's message of ``iteration``: the template with what changes set; (message id, bytes).
    ``ops``: its operations moved to the iteration (enqueued from OPS_AFTER_S after the iteration's
    previous end, ``end - iteration_s``)."""
    mid = f"{node_name(node)}:{epoch}:{iteration}"
    b.id, b.created_ns = mid, created_ns
    if ops is not None:
        c = b.collective_partials[0]
        c.time_created_delta_ns[0] = round((end - iteration_s + OPS_AFTER_S) * 1e9)
        seq = c.collective_seq_id
        for i, (s0, k) in enumerate(zip(ops.seq0, ops.step, strict=True)):
            seq[i] = s0 + iteration * k
    p = b.partials[0]
    p.iteration = p.fold.iteration = iteration
    p.fold.end_time = end
    for r in p.fold.rank_end_times:  # each rank's own end (its windows), the iteration's as the fold's
        p.fold.rank_end_times[r] = end
    p.fold.step_time_ms = 1000.0 + (iteration % 7) + (node % 11) * 0.01  # the slowest rank's period
    p.messages[0] = mid
    return mid, b.SerializeToString()


def records_message(share: ShareTemplate, node: int, epoch: str, iteration: int, end: float, created_ns: int,
                    iteration_s: float) -> tuple[str, str, bytes]:
    """(subject, id, bytes) of the node's records message of ``iteration`` with ``--collectives``: the
    store's share of its operations as its agent sends it (perfd.engine.shares: each rank's newest
    operations, SENT_RETENTION's k at the job's world, 2 a rank at 100,000 ranks; a rank's 6 of the
    iteration up to 41,666), marked folded below the root. Its agent holds the share of the dumps
    between two sends and sends the newest k of them: at 100,000 ranks that is the iteration's; under
    ~8,300 ranks (k of 30 and more) it would hold more of the earlier ones than this sends."""
    from perfd.transport.gen import perfd_pb2 as pb

    mid = f"{node_name(node)}:{epoch}:{iteration}:ops"
    r = pb.EngineBatch(id=mid, sender=node_name(node), created_ns=created_ns, collectives_folded=True)
    c = r.collective_partials.add()
    c.CopyFrom(share.part)
    c.time_created_delta_ns[0] = round((end - iteration_s + OPS_AFTER_S) * 1e9) + share.after_ns
    seq = c.collective_seq_id
    for i, (s0, k) in enumerate(zip(share.seq0, share.step, strict=True)):
        seq[i] = s0 + iteration * k
    return S.records_subject(JOB), mid, r.SerializeToString()


@dataclass
class LoadArgs:
    index: int
    servers: tuple[str, ...]
    token: str | None
    tls_ca: str | None
    partitions: int
    first: int
    n: int
    world: int
    iteration_s: float
    inflight: int
    log: bool = False
    collectives: bool = False
    fold_at_agents: bool = False
    share_every: int = 1  # iterations between a node's records messages (its agent's held share)


def _agent_folds(world: int, n: int) -> list[Any]:
    """``--fold-at-agents``: each node's window fold, as ``perfd agent`` holds it (its EngineClient's
    window_fold), with the job's layout (the hook job's: a node's 8 ranks its tensor-parallel group)."""
    from perfd.analytics.collectives.shardfold import ShardCollectives
    from perfd.core.model import ParallelLayout

    out = []
    for _ in range(n):
        f = ShardCollectives()
        f.set_layout(JOB, ParallelLayout(world_size=world, tp=RANKS_PER_NODE, pp=1,
                                         dp=world // RANKS_PER_NODE))
        out.append(f)
    return out


# Iterations a node's fold runs on its template before its figures are taken as a steady iteration's
FIGURE_TEMPLATE_ITERATIONS = 5


@dataclass
class FiguresTemplate:
    """``--fold-at-agents``: the figures a folding agent's node message carries in a steady iteration,
    made by a real fold of the load's first node over FIGURE_TEMPLATE_ITERATIONS iterations
    (:func:`folded_message`), then moved to each node (its ranks) and iteration (its number, its
    times) as the node's message goes (:func:`with_figures`). Folding every node's operations in the
    load processes instead would take more cores than the job's shards at 100,000 ranks (12,500 folds,
    ~0.7 ms each an iteration and ~0.12 s once): the agents' own cost is shard_fold_bench --at-agents'."""

    iteration: int
    end_ns: int
    ranks_from: int  # the first rank of the node whose figures these are
    figures: list[Any]  # perfd_pb2.WindowFigures


def figures_template(b: Any, ops: OpsTemplate, node: int, epoch: str, world: int,
                     iteration_s: float) -> FiguresTemplate:
    from perfd.transport.gen import perfd_pb2 as pb

    [fold] = _agent_folds(world, 1)
    tmp = pb.EngineBatch()
    tmp.CopyFrom(b)
    t = time.time()
    last = pb.EngineBatch()
    end = t
    for it in range(1, FIGURE_TEMPLATE_ITERATIONS + 1):
        end = t + it * iteration_s
        _mid, data = message_of(tmp, node, epoch, it, end, 0, ops, iteration_s)
        last.ParseFromString(folded_message(fold, data))
    return FiguresTemplate(FIGURE_TEMPLATE_ITERATIONS, round(end * 1e9), node * RANKS_PER_NODE,
                           list(last.window_figures))


def with_figures(b: Any, tmpl: FiguresTemplate, node: int, iteration: int, end: float) -> bytes:
    """The node message ``b`` (:func:`message_of` has set it to the iteration) as a folding agent sends
    it: its operations left out, the template's figures moved to this node and iteration beside it."""
    from perfd.transport.gen import perfd_pb2 as pb

    m = pb.EngineBatch()
    m.CopyFrom(b)
    del m.collective_partials[:]
    d_it, d_ns = iteration - tmpl.iteration, round(end * 1e9) - tmpl.end_ns
    d_rank = node * RANKS_PER_NODE - tmpl.ranks_from
    for f in tmpl.figures:
        g = m.window_figures.add()
        g.CopyFrom(f)
        g.iteration[:] = [x + d_it for x in f.iteration]
        g.rank[:] = [x + d_rank for x in f.rank]
        for src, dst in ((f.start_ns, g.start_ns), (f.end_ns, g.end_ns), (f.basis, g.basis)):
            dst[:] = [x + d_ns for x in src]
    return m.SerializeToString()


def folded_message(fold: Any, data: bytes) -> bytes:
    """A node's message as an agent that folds its ranks' windows sends it: its operations folded (the
    fold fed as EngineClient.submit feeds it: the operations, then the step ends), the figures made
    since its last message beside the partial instead of them."""
    from perfd.engine import figures_codec
    from perfd.engine.partial import decode
    from perfd.transport.gen import perfd_pb2 as pb

    d = decode(data)
    for part in d.collectives:
        fold.add(part)
    fold.add_steps([p.fold for p in d.partials if p.fold is not None])
    m = pb.EngineBatch()
    m.ParseFromString(data)
    del m.collective_partials[:]
    for figs in fold.take():
        for piece in figures_codec.chunks(figs):
            figures_codec.to_pb(piece, m.window_figures.add())
    return m.SerializeToString()


def _load(a: LoadArgs, t0: Any, last: Any, abort: Any, published: Any, newest: Any, ready: Any,
          results: Any) -> None:
    """One load process: nodes a.first .. a.first + a.n - 1, each publishing one message an iteration."""
    from perfd.engine.connect import connect

    epoch = secrets.token_hex(4)
    tmpl = node_templates(JOB, a.first, a.n, a.world, a.partitions, epoch, a.collectives)
    figs = (figures_template(tmpl[0][1], ops0, a.first, epoch, a.world, a.iteration_s)
            if a.collectives and a.fold_at_agents and tmpl and (ops0 := tmpl[0][2]) is not None else None)
    size = len(tmpl[0][1].SerializeToString()) if tmpl else 0
    cfg = S.EngineConfig(a.servers, token=a.token, tls_ca=a.tls_ca, partitions=a.partitions)
    spans: list[float] = []
    behind: list[float] = []
    errors = dups = 0

    async def main() -> None:
        nonlocal errors, dups
        nc = await connect(cfg, f"perfd-bench-load-{a.index}")
        js = nc.jetstream()
        for subj, mid, data in start_messages(JOB, a.first, a.n, a.world, epoch, a.partitions, a.log):
            await js.publish(subj, data, timeout=10.0, headers={"Nats-Msg-Id": mid})
        ready.put(a.index)
        while t0.value == 0.0 and not abort.is_set():
            await asyncio.sleep(0.01)
        it = 0
        try:
            while not abort.is_set():
                it += 1
                if last.value and it > last.value:
                    break
                due = t0.value + it * a.iteration_s
                await asyncio.sleep(max(0.0, due - time.time()))
                end = time.time()  # the iteration's wall-clock end: every rank's end_time
                behind.append(end - due)
                ns = time.time_ns()
                msgs = [(subj, *(logged_message(node, a.world, epoch, it, end, ns) if a.log and node == 0
                                 else message_of(b, node, epoch, it, end, ns, ops, a.iteration_s)))
                        for node, (subj, b, ops) in enumerate(tmpl, start=a.first)]
                if figs is not None:  # each node's agent folded its ranks' windows: figures, not operations
                    pairs = enumerate(zip(msgs, tmpl, strict=True), start=a.first)
                    msgs = [(subj, mid, data if a.log and node == 0 else with_figures(b, figs, node, it, end))
                            for node, ((subj, mid, data), (_, b, _)) in pairs]
                # the store's share of the same operations, to the root (the records stream; not counted
                # in ``published``, which the root's node messages are checked against): each node's
                # agent every ``share_every`` iterations (perfd.engine.shares), the nodes in turn
                shares = [records_message(ops.share, node, epoch, it, end, ns, a.iteration_s)
                          for node, (_, b, ops) in enumerate(tmpl, start=a.first)
                          if ops is not None and ops.share is not None and (it + node) % a.share_every == 0]
                for k in range(0, len(shares), a.inflight):
                    got = await asyncio.gather(*(js.publish(s, d, timeout=10.0, headers={"Nats-Msg-Id": m})
                                                 for s, m, d in shares[k:k + a.inflight]),
                                               return_exceptions=True)
                    errors += sum(isinstance(x, BaseException) for x in got)
                todo = msgs
                for _attempt in range(5):  # a failed publish is tried again with its id (deduplicated)
                    failed = []
                    for k in range(0, len(todo), a.inflight):
                        chunk = todo[k:k + a.inflight]
                        acks = await asyncio.gather(
                            *(js.publish(s, d, timeout=10.0, headers={"Nats-Msg-Id": m})
                              for s, m, d in chunk), return_exceptions=True)
                        for msg, ack in zip(chunk, acks, strict=True):
                            if isinstance(ack, BaseException):
                                errors += 1
                                failed.append(msg)
                            else:
                                dups += bool(getattr(ack, "duplicate", False))
                        with published.get_lock():
                            published[a.index] += len(chunk) - sum(isinstance(x, BaseException) for x in acks)
                    todo = failed
                    if not todo or abort.is_set():
                        break
                spans.append(time.time() - end)
                newest[a.index] = it
        finally:
            await nc.close()

    asyncio.run(main())
    results.put({"index": a.index, "spans": spans, "behind": behind, "errors": errors, "duplicates": dups,
                 "message_bytes": size})


# --------------------------------------------------------------------------------------- harness


def _consumers(server: Any) -> dict[str, Any]:
    """The node stream's consumers as nats-server sees them: messages waiting for each partition's
    consumer, and the partitions whose messages wait while no shard pulls (no pull request waiting,
    nothing outstanding): stalled."""
    try:
        doc = server.monitor("/jsz?consumers=true")
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {"pending": 0, "ack_pending": 0, "redelivered": 0, "stalled": []}
    for acc in doc.get("account_details") or []:
        for st in acc.get("stream_detail") or []:
            if st.get("name") != S.NODES_STREAM:
                continue
            out["stream_messages"] = (st.get("state") or {}).get("messages")
            for c in st.get("consumer_detail") or []:
                out["pending"] += c.get("num_pending", 0)
                out["ack_pending"] += c.get("num_ack_pending", 0)
                out["redelivered"] += c.get("num_redelivered", 0)
                if c.get("num_pending", 0) and not c.get("num_waiting") and not c.get("num_ack_pending"):
                    out["stalled"].append(c.get("name"))
    out["stalled"].sort()
    return out


def _get_json(url: str, timeout: float = 30.0) -> tuple[Any, float]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return json.loads(body), time.perf_counter() - t


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return {"p50": round(statistics.median(s), 4), "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 4),
            "max": round(s[-1], 4), "n": len(s)}


class Watched:
    """One process's CPU over the window (its mean, and its peak over one SAMPLE_S) and its peak RSS."""

    def __init__(self, name: str, ps: Any) -> None:
        self.name, self.ps, self.peak, self.rss_max, self.last_cpu = name, ps, 0.0, 0, 0.0

    def _cpu(self) -> float:
        try:
            c = self.ps.cpu_times()
            self.last_cpu = float(c.user + c.system)
        except Exception:  # gone: its last figure stands
            pass
        return self.last_cpu

    def start(self) -> None:
        self.cpu0, self.t0 = self._cpu(), time.perf_counter()
        self.last, self.last_t = self.cpu0, self.t0

    def sample(self) -> None:
        c, t = self._cpu(), time.perf_counter()
        if t - self.last_t > 0.05:
            self.peak = max(self.peak, (c - self.last) / (t - self.last_t))
        self.last, self.last_t = c, t
        try:
            self.rss_max = max(self.rss_max, int(self.ps.memory_info().rss))
        except Exception:  # gone
            pass

    def figures(self) -> dict[str, Any]:
        wall = max(1e-9, self.last_t - self.t0)
        return {"cpu_cores": round((self.last - self.cpu0) / wall, 3), "cpu_cores_peak": round(self.peak, 3),
                "rss_bytes": self.rss_max, "cpu_s": round(self.last - self.cpu0, 3)}


def _tls_files(d: Path) -> tuple[Path, Path, Path]:
    """(server cert, key, CA) for 127.0.0.1, made with the openssl command-line tool."""
    ca_key, ca, key, csr, cert, ext = (d / n for n in ("ca.key", "ca.pem", "server.key", "server.csr",
                                                       "server.pem", "ext.cnf"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1",
                 "-subj", "/CN=perfd-bench-ca"],
                ["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
                ["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                 "-out", cert, "-days", "1", "-extfile", ext]):
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
    return cert, key, ca


def _wait(what: str, cond: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: a process exited ({dead[0].args!r:.200} rc {dead[0].returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.2)


def _busy(t: Any) -> float:
    """CPU seconds the machine spent not idle (psutil.cpu_times())."""
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class Children:
    """The perfd processes of a bench run (``python -m perfd.app.cli ...``), each one's output in
    DIR/<name>.log; ``close()`` ends them (SIGTERM, then SIGKILL after 15 s) and closes the logs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str, argv: list[str], sampled: Path | None = None) -> subprocess.Popen[bytes]:
        """``sampled``: run under benchmarks.frame_sampler, which writes its threads' CPU and stacks there."""
        out = open(self.tmp / f"{name}.log", "wb")
        self._logs.append(out)
        via = ["-m", "benchmarks.frame_sampler", str(sampled)] if sampled is not None else ["-m"]
        p = subprocess.Popen([sys.executable, *via, "perfd.app.cli", *argv], cwd=ROOT, env=self._env,
                             stdout=out,
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for cp in self.procs:
            if cp.poll() is None:
                cp.terminate()
        for cp in self.procs:
            try:
                cp.wait(15)
            except subprocess.TimeoutExpired:
                cp.kill()
                cp.wait(5)
        for f in self._logs:
            f.close()


def run_engine(nodes: int, shards: int, seconds: float, procs: int, iteration_s: float = 2.0,
               warmup_s: float = 10.0, partitions: int = S.DEFAULT_PARTITIONS, auth: bool = True,
               tls: bool = False, inflight: int = 1000, drain_s: float = 30.0, keep: bool = False,
               log: bool = False, collectives: bool = False, fold_at_agents: bool = False,
               profile_root: Path | None = None, root_switch_ms: float | None = None,
               share_every_s: float | None = None, comm_summaries: bool = False,
               kill_shard_at: float | None = None) -> dict[str, Any]:
    import psutil

    from perfd.engine.natsd import NatsCluster
    from perfd.engine.shares import SHARE_EVERY_S, share_round_s

    tmp = Path(tempfile.mkdtemp(prefix="perfd-engine-bench-"))
    ok = False
    token = secrets.token_urlsafe(24) if auth else None
    tls_files = _tls_files(tmp) if tls else None
    cluster = NatsCluster(tmp / "nats", 1, token=token, tls=tls_files)
    kids = Children(tmp)
    spawn, children = kids.spawn, kids.procs
    ctx = mp.get_context("spawn")
    abort = ctx.Event()
    loaders: list[Any] = []
    try:
        cluster.start()
        url = ",".join(cluster.urls)
        eng = ["--engine", url, "--engine-partitions", str(partitions)]
        if token is not None:
            (tmp / "token").write_text(token)
            (tmp / "token").chmod(0o600)
            eng += ["--engine-token-file", str(tmp / "token")]
        if tls_files is not None:
            eng += ["--engine-tls-ca", str(tls_files[2])]
        ready_file = tmp / "root.ready"
        root = spawn("root", ["aggregator", *eng, "--no-rules", "--grpc-port", "0", "--http-port", "0",
                              "--ready-file", str(ready_file), "--engine-root-id", "bench-root",
                              *([] if root_switch_ms is None else ["--gil-switch-ms", str(root_switch_ms)])],
                     sampled=profile_root)
        stats_files = [tmp / f"shard-{i}.json" for i in range(shards)]
        shard_procs = [spawn(f"shard-{i}", ["shard", *eng, "--id", f"bench-shard-{i}", "--stats-file",
                                            str(stats_files[i]), "--stats-interval", "0.5",
                                            *(["--comm-summaries"] if comm_summaries else [])])
                       for i in range(shards)]
        _wait("the root's ready file", lambda: ready_file.read_text().strip(), 60, children)
        http = int(ready_file.read_text().split()[1])
        base = f"http://127.0.0.1:{http}"

        def engine_stats() -> dict[str, Any]:
            return dict(_get_json(f"{base}/api/stats")[0].get("engine") or {})

        def gc_ms() -> tuple[float, float, int] | None:
            """The root's garbage collector's time, of it its full collections', and their number
            (perfd.aggregator.runtime); None: not timed."""
            t = _get_json(f"{base}/api/stats")[0].get("transport") or {}
            if t.get("gc_ms") is None or t.get("gc_full_ms") is None:
                return None
            return float(t["gc_ms"]), float(t["gc_full_ms"]), int(t.get("gc_full_collections") or 0)

        _wait("the root's lease", lambda: engine_stats().get("leader"), 60, children)
        share = math.ceil(partitions / shards)

        def balanced() -> bool:
            held = [list(_read_json(f).get("partitions") or []) for f in stats_files]
            every = sorted(p for h in held for p in h)
            return every == list(range(partitions)) and all(len(h) <= share for h in held)

        _wait("the shards' partitions", balanced, 60, children)

        # The load: node i is in process i % procs's share (contiguous ranges, as scale_bench).
        t0v, lastv = ctx.Value("d", 0.0), ctx.Value("q", 0)
        published, newest = ctx.Array("q", procs), ctx.Array("q", procs, lock=False)
        ready, results = ctx.Queue(), ctx.Queue()
        per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)]
        first = 0
        # a node's share every this many iterations, as its agent holds it: the job's round at its size
        # (perfd.engine.shares.share_round_s, at its ranks' operations a second; 0 s: every iteration)
        every_s = SHARE_EVERY_S if share_every_s is None else share_every_s
        rate = OPS_PER_RANK_ITERATION / iteration_s if collectives else None
        round_s = share_round_s(nodes * RANKS_PER_NODE, rate, every_s) if every_s > 0 else 0.0
        share_every = max(1, round(round_s / iteration_s))
        for i, n in enumerate(per):
            la = LoadArgs(i, tuple(cluster.urls), token, str(tls_files[2]) if tls_files else None, partitions,
                          first, n, nodes * RANKS_PER_NODE, iteration_s, inflight, log, collectives,
                          fold_at_agents, share_every)
            p = ctx.Process(target=_load, args=(la, t0v, lastv, abort, published, newest, ready, results),
                            daemon=True)
            p.start()
            loaders.append(p)
            first += n
        deadline = time.monotonic() + 240  # a load process makes its nodes' templates first (~20 ms a node)
        got = 0
        while got < procs:
            try:
                ready.get(timeout=1.0)
                got += 1
            except Exception:
                if time.monotonic() > deadline or any(not p.is_alive() for p in loaders):
                    raise RuntimeError("the load processes did not start") from None
        t0 = time.time() + 0.5
        t0v.value = t0

        nats_proc = cluster.servers[0].process
        assert nats_proc is not None
        watched = [Watched("root", psutil.Process(root.pid)), Watched("nats", psutil.Process(nats_proc.pid))]
        watched += [Watched(f"shard-{i}", psutil.Process(p.pid)) for i, p in enumerate(shard_procs)]
        watched += [Watched(f"load-{i}", psutil.Process(p.pid)) for i, p in enumerate(loaders)]
        time.sleep(max(0.0, t0 + warmup_s - time.time()))

        def offered_newest() -> int:
            return min(newest[:]) if procs else 0

        for w in watched:
            w.start()
        m0 = psutil.cpu_times()
        e0, pub0, sh0 = engine_stats(), sum(published[:]), [_read_json(f) for f in stats_files]
        gc0 = gc_ms()
        it0 = offered_newest()
        w0 = time.perf_counter()
        polls: list[dict[str, Any]] = []
        answers = AnswerWatch(lambda row: tuple((_answer_of(row) or {}).get(k) for k in ANSWER))
        job_url = f"{base}/api/jobs/{urllib.parse.quote(JOB, safe='')}/iterations?sources=0"
        end = time.monotonic() + seconds
        next_poll = 0.0
        killed: dict[str, Any] | None = None
        while time.monotonic() < end:
            if kill_shard_at is not None and killed is None and time.perf_counter() - w0 >= kill_shard_at:
                shard_procs[0].kill()  # SIGKILL: what it held is the survivors' after the lease TTL
                killed = {"shard": "shard-0", "at_s": round(time.perf_counter() - w0, 2)}
            for w in watched:
                w.sample()
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + POLL_S
                offered = offered_newest()
                try:
                    doc, took = _get_json(job_url)
                    rows = [r for r in doc.get("iterations") or [] if "iteration" in r]
                    answers.note(time.time(), rows)
                    top = max(rows, key=lambda r: int(r["iteration"])) if rows else None
                    shown = int(top["iteration"]) if top else None
                    age = time.time() - float(top["end_time"]) if top and top.get("end_time") else None
                    answer = _answer_of(top)
                except OSError:  # 404 until the job's first record
                    shown, took, age, answer = None, float("nan"), None, None
                polls.append({"t": round(time.time() - t0, 2), "offered": offered, "shown": shown,
                              "newest_age_s": None if age is None else round(age, 3),
                              "took_s": round(took, 4), "answer": answer})
            time.sleep(SAMPLE_S)
        for w in watched:
            w.sample()
        m1 = psutil.cpu_times()
        wall = time.perf_counter() - w0
        e1, pub1, sh1 = engine_stats(), sum(published[:]), [_read_json(f) for f in stats_files]
        gc1 = gc_ms()
        it1 = offered_newest()
        load_avg = os.getloadavg()

        # Stop the load at one iteration, the same for every process, then drain.
        lastv.value = max(newest[:]) + 1
        t_stop = time.monotonic()
        res_loads: list[dict[str, Any]] = []
        while len(res_loads) < procs:
            try:
                res_loads.append(results.get(timeout=1.0))
            except Exception:
                if time.monotonic() - t_stop > drain_s:
                    abort.set()  # far behind: give up on the rest
                if time.monotonic() - t_stop > drain_s + 30:
                    break
        aborted = abort.is_set()
        total_pub = sum(published[:])
        iterations_offered = int(lastv.value) if not aborted else min(newest[:])
        countable = iterations_offered - (1 if log else 0)  # the --log job's first: not counted (docstring)
        t_drain = time.monotonic()
        ef = engine_stats()
        while time.monotonic() - t_drain < drain_s:
            ef = engine_stats()
            if ef.get("node_messages", 0) >= total_pub and ef.get("complete", 0) >= countable:
                break
            time.sleep(0.25)
        drained = ef.get("node_messages", 0) >= total_pub
        consumers = _consumers(cluster.servers[0])
        # The shards write their counters every 0.5 s: the last write after the drain, when there is one
        # (the job's info among them: waiting for the published messages alone, a CI run read the
        # shards' counters one short).
        settle = time.monotonic() + 3.0
        shf = [_read_json(f) for f in stats_files]
        while (drained and sum(x.get("node_messages", 0) for x in shf) < total_pub + START_NODE_MESSAGES
               and time.monotonic() < settle):
            time.sleep(0.2)
            shf = [_read_json(f) for f in stats_files]

        final_rows = _settled_rows(job_url)
        comm = ef.get("comm_answers") or {}
        coll_stats = dict(_get_json(f"{base}/api/stats")[0].get("collectives") or {})
        try:  # a run whose job the root never took: its other figures say so, this part is empty
            job_doc = _get_json(f"{base}/api/jobs/{urllib.parse.quote(JOB, safe='')}/summary")[0] or {}
        except urllib.error.URLError:
            job_doc = {}
        coll = job_doc.get("collectives") or {}
        figs = {w.name: w.figures() for w in watched}
        busy = _busy(m1) - _busy(m0)
        ours = sum(f["cpu_cores"] for f in figs.values())
        root_at, root_at0 = e1.get("node_messages", 0), e0.get("node_messages", 0)
        lags = [float(p["offered"]) - float(p["shown"]) for p in polls if p["shown"] is not None]
        ops_at_shards = (sum(int((b.get("windows") or {}).get("operations", 0)) for b in sh1)
                         - sum(int((a.get("windows") or {}).get("operations", 0)) for a in sh0))
        shard_msgs = sum(b.get("node_messages", 0) for b in sh1) - sum(a.get("node_messages", 0) for a in sh0)
        shards_cpu_s = sum(figs[f"shard-{i}"]["cpu_s"] for i in range(shards))
        spans = [x for r in res_loads for x in r["spans"]]
        out: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load_avg],
                        "python": sys.version.split()[0],
                        # every process of the machine over the window, and those not the bench's
                        "busy_cores": round(busy / wall, 3),
                        "others_cores": round(max(0.0, busy / wall - ours), 3)},
            "config": {"nodes": nodes, "ranks": nodes * RANKS_PER_NODE, "shards": shards, "procs": procs,
                       "log": log, "collectives": collectives, "fold_at_agents": fold_at_agents,
                       "comm_summaries": comm_summaries,
                       "share_every_iterations": share_every if collectives else None,
                       "partitions": partitions, "iteration_s": iteration_s, "seconds": seconds,
                       "warmup_s": warmup_s, "auth": auth, "tls": tls, "inflight": inflight,
                       "root_gil_switch_ms": root_switch_ms},
            "message_bytes": max((r["message_bytes"] for r in res_loads), default=0),
            "offered_msgs_per_s": round((pub1 - pub0) / wall, 1),
            "nominal_msgs_per_s": round(nodes / iteration_s, 1),
            "published": total_pub,
            "iterations_offered": iterations_offered,
            "window": {
                "seconds": round(wall, 2),
                "iterations_offered": it1 - it0,
                "iterations_complete": e1.get("complete", 0) - e0.get("complete", 0),
                "published": pub1 - pub0,
                "node_messages_at_root": root_at - root_at0,
                "node_messages_at_shards": shard_msgs,
                "folded_msgs_per_s": round((root_at - root_at0) / wall, 1),
                # --collectives: the operations the shards folded in the window, and the shards' CPU
                # (all of it: consuming, folding, publishing, acknowledging, leases) per operation
                "operations_at_shards": ops_at_shards,
                "shards_cpu_us_per_operation": round(1e6 * shards_cpu_s / ops_at_shards, 1)
                if ops_at_shards else None,
                "shards_cpu_us_per_node_message": round(1e6 * shards_cpu_s / shard_msgs, 1)
                if shard_msgs else None,
            },
            "root": {**figs["root"], **{k: ef.get(k) for k in ROOT_COUNTERS}, "lag_s": e1.get("lag_s"),
                     # of its CPU in the window, the garbage collector's (a core's share), of it the
                     # full collections', and how many ran in the window
                     **({"gc_cores": round((gc1[0] - gc0[0]) / 1000 / wall, 3),
                         "gc_full_cores": round((gc1[1] - gc0[1]) / 1000 / wall, 3),
                         "gc_full_collections": gc1[2] - gc0[2]} if gc0 is not None and gc1 is not None
                        else {"gc_cores": None}),
                     "lag_s_after_drain": ef.get("lag_s")},
            "shards": [{**{k: s.get(k) for k in SHARD_COUNTERS}, **figs[f"shard-{i}"]}
                       for i, s in enumerate(shf)],
            "killed": killed,
            "shards_cpu_cores": round(sum(figs[f"shard-{i}"]["cpu_cores"] for i in range(shards)), 3),
            "nats": figs["nats"],
            "load": {"cpu_cores": round(sum(figs[f"load-{i}"]["cpu_cores"] for i in range(procs)), 3),
                     "cpu_cores_peak": max(figs[f"load-{i}"]["cpu_cores_peak"] for i in range(procs)),
                     "publish_span_s": _quantiles(spans),
                     "behind_s": _quantiles([x for r in res_loads for x in r["behind"]]),
                     "publish_errors": sum(r["errors"] for r in res_loads),
                     "duplicates": sum(r["duplicates"] for r in res_loads),
                     "aborted": aborted},
            "iterations_check": {"polls": len(polls), "behind_iterations": _quantiles(lags),
                                 "newest_age_s": _quantiles([p["newest_age_s"] for p in polls
                                                             if p["newest_age_s"] is not None]),
                                 "api_iterations_s": _quantiles([p["took_s"] for p in polls
                                                                 if not math.isnan(p["took_s"])]),
                                 # what the newest row of each poll answered (absent: None)
                                 "answer_present": {k: sum(1 for p in polls if (p["answer"] or {}).get(k)
                                                           is not None) for k in ANSWER},
                                 "last": polls[-1] if polls else None,
                                 # the newest iteration's answer once the run drained and the analysis
                                 # caught up (a poll during the load may read an iteration mid-fold)
                                 "final": _answer_of(max(final_rows, key=lambda r: int(r["iteration"]),
                                                         default=None)),
                                 # from an iteration's end to the first poll whose row gave its final
                                 # answer (benchmarks/answer_lag.py: an upper bound, by up to poll_s)
                                 "poll_s": POLL_S,
                                 "answer_lag": answers.lags(final_rows, it0 + 1)},
            "final": {"drained": drained, "drain_s": round(time.monotonic() - t_drain, 2),
                      "all_complete": ef.get("complete", 0) >= countable,
                      "node_messages_equal_published": ef.get("node_messages") == total_pub},
            "engine_consumers": consumers,
            # the shards' communication-share summaries as the root merged them (perfd.engine.root_comm):
            # its counters, and per job the ranks, partitions and job-level shares (not the iterations)
            "comm_answers": {"counts": comm.get("counts"),
                             "jobs": {j: {k: v for k, v in a.items() if k != "iterations"}
                                      for j, a in (comm.get("jobs") or {}).items()}},
            # the job's collective analysis after the drain (its shares read from the summaries where the
            # shards summarise: method.summarised_ranks) and the root store's counts of what it read
            "collective_analysis": {
                "method": {k: v for k, v in (coll.get("method") or {}).items() if k != "detail"},
                "comm_total_share": (coll.get("summary") or {}).get("comm_total_share"),
                "iterations": len(coll.get("iterations") or []),
                "shares_answered": coll_stats.get("shares_answered"),
                "shares_mixed": coll_stats.get("shares_mixed"),
                "figure_rows_received": (coll_stats.get("window_fold") or {}).get("received")},
        }
        if keep:
            out["dir"] = str(tmp)
        ok = True
        return out
    finally:
        abort.set()
        for lp in loaders:
            lp.join(10)
            if lp.is_alive():
                lp.kill()
                lp.join(5)
        kids.close()
        cluster.stop()
        if ok and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"perfd bench engine: the processes' logs are kept in {tmp}", file=sys.stderr)


def _table(res: dict[str, Any]) -> str:
    c, w, r, m, ld = res["config"], res["window"], res["root"], res["machine"], res["load"]

    def proc(f: dict[str, Any]) -> str:
        return f"{f['cpu_cores']} cores (peak {f['cpu_cores_peak']}), RSS {f['rss_bytes'] / 2**20:.0f} MiB"

    rows = [("machine", f"{m['cpus']} CPUs, load average {m['loadavg']}; {m['busy_cores']} cores busy in "
                        f"the window, {m['others_cores']} of them not this bench's"),
            ("job", f"{c['nodes']} nodes x 8 = {c['ranks']} ranks, an iteration every {c['iteration_s']} s, "
                    f"{c['partitions']} partitions, auth {c['auth']}, TLS {c['tls']}; "
                    f"{res['message_bytes']} bytes a node message"),
            ("offered", f"{res['offered_msgs_per_s']} msg/s (nominal {res['nominal_msgs_per_s']}) by "
                        f"{c['procs']} load process(es), {ld['cpu_cores']} cores"),
            ("window", f"{w['seconds']} s: {w['iterations_complete']} of {w['iterations_offered']} "
                       f"iterations complete; {w['published']} published, "
                       f"{w['node_messages_at_shards']} at shards, {w['node_messages_at_root']} at the root"),
            ("root", f"{proc(r)}; lag_s {r['lag_s']}"),
            *((str(s["id"]), f"{proc(s)}, partitions {s['partitions']}, leases taken {s['leases_taken']} "
                             f"lost {s['leases_lost']}, consumer restarts {s['consumer_restarts']}")
              for s in res["shards"]),
            ("nats-server", proc(res["nats"])),
            ("load", f"behind_s {ld['behind_s']}, publish_span_s {ld['publish_span_s']}, "
                     f"errors {ld['publish_errors']}"),
            ("iterations check", str(res["iterations_check"])),
            ("final", f"{res['published']} published, {r['node_messages']} folded, {r['redelivered']} "
                      f"redelivered; {r['complete']} of {res['iterations_offered']} iterations complete; "
                      f"{res['final']}"),
            ("node stream", str(res["engine_consumers"]))]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100,
                    help="nodes of the job, 8 ranks each (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=2, help="perfd shard processes (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window (default: %(default)s)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds of load before the window (default: %(default)s)")
    ap.add_argument("--iteration-s", type=float, default=2.0,
                    help="seconds per iteration (default: %(default)s)")
    ap.add_argument("--procs", type=int, default=2, help="load processes (default: %(default)s)")
    ap.add_argument("--partitions", type=int, default=S.DEFAULT_PARTITIONS,
                    help="partitions of the node stream (default: %(default)s)")
    ap.add_argument("--inflight", type=int, default=1000,
                    help="publishes awaited together by a load process (default: %(default)s)")
    ap.add_argument("--drain", type=float, default=30.0,
                    help="seconds at most to wait, after the window, for the root to fold everything "
                         "published (default: %(default)s)")
    ap.add_argument("--no-auth", action="store_true", help="no token on the engine (default: a token)")
    ap.add_argument("--tls", action="store_true",
                    help="the engine's client port over TLS (a CA made for the run)")
    ap.add_argument("--keep", action="store_true", help="keep the processes' logs and the engine's store")
    ap.add_argument("--log", action="store_true",
                    help="a Megatron-LM job: node 0 also sends its last rank's log records (the recorded "
                         "H200 log's, replayed), which its iterations are then read from")
    ap.add_argument("--collectives", action="store_true",
                    help="each rank's collective operations too (6 an iteration: collectives_bench's job), "
                         "to its node's shard, which folds their windows, and their share to the root")
    ap.add_argument("--fold-at-agents", action="store_true",
                    help="with --collectives: each node's agent folds its ranks' windows and sends the "
                         "figures beside its partial, which the shard hands on (perfd agent's default; the "
                         "load sends a real fold's figures of its first node, moved to each node and "
                         "iteration); without it the operations go to the shard, which folds them")
    ap.add_argument("--comm-summaries", action="store_true",
                    help="with --fold-at-agents: the shards summarise the figures per partition for the root "
                         "(perfd shard --comm-summaries)")
    ap.add_argument("--share-every-s", type=float, metavar="S",
                    help="with --collectives: each node's agent sends the store's share of its operations "
                         "this often at the least, the nodes in turn, a large job's round longer as an agent "
                         "holds it (default: perfd.engine.shares.SHARE_EVERY_S; share_round_s says how much "
                         "longer; 0: every iteration, as an agent before it did)")
    ap.add_argument("--profile-root", type=Path, metavar="OUT.json",
                    help="run the root under benchmarks.frame_sampler: its threads' CPU and stacks to "
                         "OUT.json (python -m benchmarks.frame_sampler --show OUT.json)")
    ap.add_argument("--root-gil-switch-ms", type=float, metavar="MS",
                    help="the root's --gil-switch-ms (default: perfd aggregator's own)")
    ap.add_argument("--kill-shard-at", type=float, metavar="S",
                    help="SIGKILL the first shard S seconds into the measured window (its partitions go to "
                         "the others after the lease TTL; with --comm-summaries they read its rows back)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ns = ap.parse_args(argv)
    if min(ns.nodes, ns.shards, ns.procs, ns.partitions, ns.inflight) < 1 or ns.seconds <= 0 \
            or ns.iteration_s <= 0 or ns.warmup < 0 or ns.drain < 0 or (ns.share_every_s or 0) < 0:
        print("perfd bench engine: --nodes, --shards, --procs, --partitions, --inflight, --seconds and "
              "--iteration-s must be positive, --warmup, --drain and --share-every-s >= 0", file=sys.stderr)
        return 2
    res = run_engine(ns.nodes, ns.shards, ns.seconds, min(ns.procs, ns.nodes), iteration_s=ns.iteration_s,
                     warmup_s=ns.warmup, partitions=ns.partitions, auth=not ns.no_auth, tls=ns.tls,
                     inflight=ns.inflight, drain_s=ns.drain, keep=ns.keep, log=ns.log,
                     collectives=ns.collectives, fold_at_agents=ns.fold_at_agents,
                     profile_root=ns.profile_root.resolve() if ns.profile_root else None,
                     root_switch_ms=ns.root_gil_switch_ms, share_every_s=ns.share_every_s,
                     comm_summaries=ns.comm_summaries, kill_shard_at=ns.kill_shard_at)
    print(json.dumps(res) if ns.json else _table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
