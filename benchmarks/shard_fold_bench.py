"""What one engine shard would spend folding every collective operation of its nodes' ranks into
per-window figures (perfd.analytics.collectives.shardfold), in one process, no engine: each node's
operations of an iteration reduced, encoded and decoded as a node's message is (perfd.engine.partial),
folded, then the iteration's step folds of its nodes, then the figures taken. The job is
``perfd bench collectives``'s (``--ops`` tensor-parallel all-reduces, one data-parallel all-reduce and
a world barrier a rank an iteration); ``--shard-nodes`` of its ``--nodes`` are this shard's.

``--compare``: the same messages folded twice in turn, by the fold as it is (each rank's provisional
windows kept from its settling, handed on when they change) and with them computed again at every
take (``ShardCollectives(cache=False)``, the fold before), ``--rounds`` times each; the CPU ratio and
the figures each handed on (the settled ones must be equal).

The collector set as ``perfd shard`` sets it (perfd.aggregator.runtime.tune_gc; ``--default-gc``:
Python's).

``--per-message``: each node's step ends folded right after its message's operations, as ``perfd
shard`` gets them (a node message carries both: perfd.engine.shard_windows); without it, each share of
the iteration's step ends after that share's operations.

``--profile N``: the timed part under cProfile, its N costliest functions (by own time) beside the
figures (cProfile slows the small calls most: read the shares, not the seconds).

``--at-agents``: the same job with each node's agent folding its own ranks' windows (``perfd agent``'s
default, perfd.engine.publisher's ``window_fold``), in turn with the shard's fold (``--per-message``'s
order) over the same messages, ``--rounds`` times each: each node's fold (its operations, its step
ends, a take: what an agent spends an iteration, each node's CPU summed) and what the shard then does
with the figures it is sent (decode them, join them by job, hand them on at each take), against the
shard folding every operation itself; the settled rows each way (must be equal).

    python -m benchmarks.shard_fold_bench [--nodes 12500] [--shard-nodes 3125] [--iterations 3]
        [--takes 8] [--per-message] [--compare] [--at-agents] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import time

from benchmarks.collectives_bench import ITERATION_NS, T0, _node_records
from perfd.aggregator.runtime import tune_gc
from perfd.analytics.collectives.shardfold import ShardCollectives
from perfd.core.collfold import reduce
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.engine.partial import Partial, decode, encode

PER_NODE = 8


Inputs = list[tuple[list[bytes], list[StepRecord]]]


def _inputs(nodes: int, shard_nodes: int, iterations: int, ops: int) -> Inputs:
    """Each iteration's node messages (encoded) and its step folds, made once (outside the timing)."""
    world = list(range(nodes * PER_NODE))
    rng = random.Random(1)
    out = []
    for it in range(iterations):
        msgs = [encode(f"node-{n}:e:{it}", f"node-{n}", 1, (),
                       collectives=[reduce("bench", _node_records(n, PER_NODE, nodes, it, ops, world, rng))])
                for n in range(shard_nodes)]
        end = (T0 + (it + 1) * ITERATION_NS - 50_000_000) / 1e9
        folds = []
        for n in range(shard_nodes):
            p = Partial("bench", it + 1)
            p.add_records([StepRecord(job="bench", iteration=it + 1, rank=n * PER_NODE + i, end_time=end,
                                      step_time_ms=2000.0) for i in range(PER_NODE)])
            fold = p.fold
            if fold is not None:
                folds.append(fold)
        out.append((msgs, folds))
    return out


def run(nodes: int, shard_nodes: int, iterations: int, ops: int, cache: bool = True,
        inputs: Inputs | None = None, takes: int = 1, per_message: bool = False) -> dict[str, object]:
    """``takes``: the figures taken that many times an iteration, each after a share of its nodes'
    messages (a shard flushes every FLUSH_S: 8 times in a 2 s iteration). ``per_message``: a node's
    step ends right after its operations (the module's ``--per-message``)."""
    sh = ShardCollectives(cache=cache)
    sh.set_layout("bench", ParallelLayout(world_size=nodes * PER_NODE, tp=PER_NODE, pp=1, dp=nodes))
    fold_s = take_s = decode_s = 0.0
    rows = figures = settled = 0
    for msgs, folds in inputs or _inputs(nodes, shard_nodes, iterations, ops):
        for k in range(takes):  # the nodes' messages as they come between two of the shard's flushes
            t = time.process_time()
            for m, fold in zip(msgs[k::takes], folds[k::takes], strict=True):
                t0 = time.process_time()
                parts = decode(m).collectives
                decode_s += time.process_time() - t0
                for part in parts:
                    rows += len(part)
                    sh.add(part)
                if per_message:
                    sh.add_steps([fold])
            if not per_message:
                sh.add_steps(folds[k::takes])
            fold_s += time.process_time() - t
            t = time.process_time()
            taken = sh.take()
            take_s += time.process_time() - t
            figures += sum(len(f) for f in taken)
            settled += sum(w.settled for f in taken for w in f.rows.values())
    return {"ranks": shard_nodes * PER_NODE, "job_ranks": nodes * PER_NODE, "iterations": iterations,
            "rows": rows,
            "decode_and_fold_cpu_s": round(fold_s, 2), "decode_cpu_s": round(decode_s, 2),
            "take_cpu_s": round(take_s, 2),
            "cpu_us_per_row": round(1e6 * (fold_s + take_s) / max(1, rows), 1),
            "cpu_s_per_iteration": round((fold_s + take_s) / iterations, 2), "figures": figures,
            "settled_figures": settled, "cache": cache, "takes_per_iteration": takes,
            "per_message": per_message,
            "window_fold": sh.jobs["bench"].fold.counts.to_json()}


def run_at_agents(nodes: int, shard_nodes: int, inputs: Inputs, takes: int = 8) -> dict[str, object]:
    """Each node's agent folds its ranks' operations (a ShardCollectives a node, fed its message's
    operations then its step ends, then taken, as EngineClient.submit does) and sends the figures in
    its node message; the shard decodes them and joins them by job, handed on ``takes`` times an
    iteration. CPU (process time) of the agents' folds summed, and of the shard's part."""
    layout = ParallelLayout(world_size=nodes * PER_NODE, tp=PER_NODE, pp=1, dp=nodes)
    agents = [ShardCollectives() for _ in range(shard_nodes)]
    for a in agents:
        a.set_layout("bench", layout)
    agent_s = shard_s = first_s = 0.0
    rows = first_rows = sent = forwarded = settled = 0
    for it, (msgs, folds) in enumerate(inputs):
        if it == 1:  # the first iteration classifies each group once a node (a world group: ~0.1 s)
            first_s, first_rows = agent_s, rows
        parts = [decode(m).collectives for m in msgs]  # the agent has its ranks' records: no decode
        rows += sum(len(p) for ps in parts for p in ps)
        out: list[bytes] = []
        for n, (ps, fold) in enumerate(zip(parts, folds, strict=True)):
            t0 = time.process_time()
            for part in ps:
                agents[n].add(part)
            agents[n].add_steps([fold])
            figs = agents[n].take()
            out.append(encode(f"node-{n}", f"node-{n}", 0, (), figures=figs, to_partition=True))
            agent_s += time.process_time() - t0
            sent += sum(len(f) for f in figs)
        for k in range(takes):
            t0 = time.process_time()
            held: dict[str, WindowFigures] = {}
            for m in out[k::takes]:
                for f in decode(m).figures:
                    if f.job in held:
                        held[f.job].absorb(f)
                    else:
                        held[f.job] = f
            shard_s += time.process_time() - t0
            forwarded += sum(len(f) for f in held.values())
            settled += sum(w.settled for f in held.values() for w in f.rows.values())
    return {"rows": rows, "agents_cpu_s": round(agent_s, 3), "shard_cpu_s": round(shard_s, 3),
            "agent_cpu_us_per_row": round(1e6 * agent_s / max(1, rows), 1),
            "agent_first_iteration_cpu_s": round(first_s, 3),
            "agent_cpu_us_per_row_after_first":
                round(1e6 * (agent_s - first_s) / max(1, rows - first_rows), 1),
            "shard_cpu_us_per_row": round(1e6 * shard_s / max(1, rows), 2),
            "figures_sent": sent, "figures_handed_on": forwarded, "settled_figures": settled}


def _top(prof: cProfile.Profile, n: int) -> list[dict[str, object]]:
    """The ``n`` functions of most own time: each's calls, own and cumulative seconds, share of all."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]  # type: ignore[attr-defined]
    return [{"function": f"{path.rsplit('/', 1)[-1]}:{line}({name})", "calls": nc, "own_s": round(tt, 3),
             "cum_s": round(ct, 3), "own_share": round(tt / max(total, 1e-9), 3)}
            for (path, line, name), (_cc, nc, tt, ct, _callers) in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--shard-nodes", type=int, default=3_125)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--ops", type=int, default=4)
    ap.add_argument("--compare", action="store_true",
                    help="the fold as it is against the one before, in turn")
    ap.add_argument("--rounds", type=int, default=2, help="with --compare: runs of each, alternating")
    ap.add_argument("--takes", type=int, default=1,
                    help="figures taken this many times an iteration (a shard: every 0.25 s, 8 in 2 s)")
    ap.add_argument("--per-message", action="store_true",
                    help="each node's step ends right after its operations, as perfd shard folds them")
    ap.add_argument("--at-agents", action="store_true",
                    help="the agents' fold and the shard handing on their figures, against the shard's fold")
    ap.add_argument("--default-gc", action="store_true",
                    help="Python's collector settings, not the shard's (perfd.aggregator.runtime.tune_gc)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="the timed part under cProfile: its N costliest functions by own time")
    a = ap.parse_args(argv)
    if not a.default_gc:  # as `perfd shard` runs
        tune_gc()
    if a.profile:
        inputs = _inputs(a.nodes, a.shard_nodes, a.iterations, a.ops)
        prof = cProfile.Profile()
        got = prof.runcall(run, a.nodes, a.shard_nodes, a.iterations, a.ops, True, inputs, a.takes,
                           a.per_message)
        print(json.dumps({"run": got, "profile": _top(prof, a.profile)}, indent=1))
        return 0
    if a.at_agents:
        inputs = _inputs(a.nodes, a.shard_nodes, a.iterations, a.ops)
        pairs: dict[str, list[dict[str, object]]] = {"shard_fold": [], "at_agents": []}
        for _ in range(a.rounds):
            pairs["shard_fold"].append(run(a.nodes, a.shard_nodes, a.iterations, a.ops, True, inputs, a.takes,
                                           per_message=True))
            pairs["at_agents"].append(run_at_agents(a.nodes, a.shard_nodes, inputs, a.takes))
        fold_us = min(float(str(r["cpu_us_per_row"])) for r in pairs["shard_fold"])
        fwd_us = min(float(str(r["shard_cpu_us_per_row"])) for r in pairs["at_agents"])
        settled = {r["settled_figures"] for v in pairs.values() for r in v}
        print(json.dumps({"runs": pairs, "shard_us_per_row": {"shard_fold": fold_us, "at_agents": fwd_us},
                          "shard_at_agents_over_shard_fold": round(fwd_us / fold_us, 3),
                          "settled_equal": len(settled) == 1}, indent=1))
        return 0
    if not a.compare:
        print(json.dumps(run(a.nodes, a.shard_nodes, a.iterations, a.ops, takes=a.takes,
                             per_message=a.per_message), indent=1))
        return 0
    inputs = _inputs(a.nodes, a.shard_nodes, a.iterations, a.ops)
    runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
    for _ in range(a.rounds):
        for name, cache in (("before", False), ("after", True)):
            runs[name].append(run(a.nodes, a.shard_nodes, a.iterations, a.ops, cache, inputs, a.takes,
                                  a.per_message))
    cpu = {k: [float(str(r["decode_and_fold_cpu_s"])) + float(str(r["take_cpu_s"])) for r in v]
           for k, v in runs.items()}
    print(json.dumps({"runs": runs, "cpu_s": cpu,
                      "after_over_before": round(min(cpu["after"]) / min(cpu["before"]), 3),
                      "settled_equal": len({r["settled_figures"] for v in runs.values() for r in v}) == 1},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
