"""The engine root's CPU per window-figure row: what ``perfd aggregator --engine`` spends merging the
shards' per-window figures (perfd.core.winfigures) of a big job into its store, as the job's iterations
accumulate. One process, no engine: the shards' messages as perfd's encoder makes them (rows of
``figures_codec.MAX_ROWS`` a message), each rank's window of each iteration handed on twice as a
shard does (provisional, then settled), folded by the root's own code (perfd.engine.root.Root.handle:
decode, the job's admission, the store's join); process CPU per iteration, per row; then the job's
collective analysis over what it holds, once (``analysis_cpu_s``, and a digest of the answer as
served). Before each
iteration's figures, its fold (the ``all`` record, every rank's end) comes in ``FOLD_VERSIONS`` steps
as the nodes' partials do, each followed by a node's records message whose collectives the shards
folded (``collectives_folded``): the root's CPU per such message (Root.handle_records: decode, the
store's merge) is timed too.

    perfd bench root-figures [--ranks 100000] [--iterations 16] [--timed 4] [--json]
    perfd bench root-figures --against CHECKOUT [--rounds 2]   # before (CHECKOUT's code) / after, in turn

``--against``: a fresh process per run, CHECKOUT's perfd and this one's alternating, on the same rows
(made the same way in each): the ratio of their CPU per row over the last ``--timed`` iterations.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

JOB = "bench-figures"
ITERATION_NS = 2_000_000_000
T0_NS = 1_700_000_000_000_000_000
CLASSES = ("dp", "pp", "tp")  # the group classes a rank's window has figures of
BATCH = 256  # the root's loop hands it the messages already there, this many at most
FOLD_VERSIONS = 4  # an iteration's fold as the root hands it to the store: its ranks in 4 steps
PER_NODE = 8


def _templates(ranks: int) -> list[Any]:
    """Every rank's figures of iteration 0, provisional then settled, as shards hand them on: cut into
    messages of figures_codec.MAX_ROWS rows (EngineBatch messages, made once: :func:`_messages`
    moves them to an iteration)."""
    from perfd.core.winfigures import RankWindow, WindowFigures
    from perfd.engine.figures_codec import chunks
    from perfd.engine.partial import encode
    from perfd.transport.gen import perfd_pb2 as pb

    out = []
    for settled in (False, True):
        figs = WindowFigures(JOB)
        for r in range(ranks):
            comm = 300_000_000 + (r * 7919) % 200_000_000
            by = tuple((c, comm // (k + 2)) for k, c in enumerate(CLASSES))
            start, end = T0_NS + r % 1000, T0_NS + ITERATION_NS - 1000 + r % 997
            figs.add(0, RankWindow(r, start, end, 1, None, comm, by, settled,
                                   T0_NS + (ITERATION_NS if settled else ITERATION_NS // 2)))
        for k, c in enumerate(chunks(figs)):
            out.append(pb.EngineBatch.FromString(encode(f"shard-{k}:{int(settled)}", f"shard-{k % 4}", 1, (),
                                                        figures=[c])))
    return out


def _messages(templates: list[Any], it: int) -> list[bytes]:
    """The templates moved to iteration ``it`` (its windows ``it`` iterations on; the comm figures
    varied by iteration), as the root reads them."""
    d = it * ITERATION_NS
    out = []
    for t in templates:
        b = type(t)()
        b.CopyFrom(t)
        b.id = f"{t.id}:{it}"
        m = b.window_figures[0]
        for col, add in ((m.iteration, it), (m.start_ns, d), (m.end_ns, d), (m.basis, d)):
            vals = [x + add for x in col]
            del col[:]
            col.extend(vals)
        vals = [x + it * 104729 for x in m.comm_ns]
        del m.comm_ns[:]
        m.comm_ns.extend(vals)
        out.append(b.SerializeToString())
    return out


def _records_message(node: int, it: int) -> bytes:
    """A node's records message of iteration ``it``: its ranks' collectives, reduced, folded at the
    shards (each rank 2 operations of its node's tensor-parallel group)."""
    from perfd.core.collfold import reduce
    from perfd.core.model import CollectiveRecord
    from perfd.engine.partial import encode

    tp = [node * PER_NODE + i for i in range(PER_NODE)]
    recs = [CollectiveRecord(job=JOB, source="flight_recorder", op="all_reduce", rank=r, pg_id=1 + node,
                             pg_name=str(1 + node), pg_desc="TENSOR_MODEL_PARALLEL_GROUP", pg_ranks=tp,
                             group_rank=r - tp[0], group_size=PER_NODE, collective_seq_id=2 * it + k,
                             bytes=16 << 20, state="completed",
                             time_created_ns=T0_NS + it * ITERATION_NS + (k + 1) * 50_000_000,
                             duration_ms=1.5, dtype="BFloat16", raw_op="nccl:all_reduce")
            for r in tp for k in range(2)]
    return encode(f"node-{node}:c:{it}", f"node-{node}", it, (), collectives=[reduce(JOB, recs)],
                  collectives_folded=True)


def _fold(ranks: int, it: int, part: int) -> Any:
    """Iteration ``it``'s fold as the root hands it to the store with the first ``part`` quarters of
    the ranks in (every rank's own end)."""
    from perfd.core.model import StepRecord

    end = (T0_NS + it * ITERATION_NS) / 1e9
    n = ranks * part // FOLD_VERSIONS
    return StepRecord(job=JOB, iteration=it, rank="all", end_time=end + 0.5,
                      rank_end_times={r: end + (r % 1000) * 1e-4 for r in range(n)})


def run(ranks: int, iterations: int, timed: int) -> dict[str, Any]:
    """The root folds every iteration's provisional, then settled, figures; CPU per iteration."""
    from perfd.aggregator.engine_sink import EngineSink
    from perfd.aggregator.guard import Guard
    from perfd.aggregator.state import AggregatorState
    from perfd.core.limits import Limits
    from perfd.core.refusals import Refusals
    from perfd.engine import subjects as S
    from perfd.engine.root import ENGINE_AGENT, Root
    from perfd.report.collective_text import collectives_json

    state = AggregatorState()
    root = Root(S.EngineConfig(("nats://unused",)), EngineSink(state, Guard(Limits(), Refusals())), "bench")
    per_it: list[dict[str, float]] = []
    templates = _templates(ranks)
    nodes = max(1, ranks // PER_NODE)
    for it in range(1, iterations + 1):
        rec_cpu = 0.0
        for part in range(1, FOLD_VERSIONS + 1):
            state.ingest_steps(ENGINE_AGENT, [_fold(ranks, it, part)])
            msg = _records_message((it * FOLD_VERSIONS + part) % nodes, it)
            t = time.process_time()
            root.handle_records([msg])
            rec_cpu += time.process_time() - t
        msgs = _messages(templates, it)
        rows0 = root.stats.figure_rows
        t = time.process_time()
        for i in range(0, len(msgs), BATCH):
            root.handle(msgs[i:i + BATCH])
        cpu = time.process_time() - t
        rows = root.stats.figure_rows - rows0
        per_it.append({"iteration": it, "cpu_s": round(cpu, 4), "rows": rows,
                       "us_per_row": round(1e6 * cpu / rows, 3),
                       "ms_per_records_message": round(1e3 * rec_cpu / FOLD_VERSIONS, 3)})
    jc = state._analyses.collectives.jobs.get(JOB)
    held = jc.fold.outside.rows if jc is not None and jc.fold is not None else {}
    # The job's collective analysis over what the root holds, once (its first: the step windows made
    # then too), as the root's worker makes it: CPU, and a digest of the answer as served
    t = time.process_time()
    analysis = state.collective_analysis(JOB, force=True)
    analysis_cpu = time.process_time() - t
    served = json.dumps(collectives_json(analysis), sort_keys=True) if analysis is not None else ""
    return {"ranks": ranks, "iterations": iterations, "timed": timed,
            "analysis_cpu_s": round(analysis_cpu, 3),
            "analysis_sha256": hashlib.sha256(served.encode()).hexdigest()[:16],
            "us_per_row_timed_median": round(statistics.median(p["us_per_row"] for p in per_it[-timed:]), 3),
            "us_per_row_first": per_it[0]["us_per_row"],
            "ms_per_records_message_timed_median": round(statistics.median(
                p["ms_per_records_message"] for p in per_it[-timed:]), 3),
            # what the store holds at the end (the same whichever code folded it)
            "held_rows": len(held), "held_settled": sum(1 for w in held.values() if w.settled),
            "held_comm_ns_sum": sum(w.comm_ns for w in held.values()),
            "per_iteration": per_it}


def compare(against: Path, rounds: int, ranks: int, iterations: int, timed: int) -> dict[str, Any]:
    """:func:`run` with ``against``'s perfd and this checkout's in turn, ``rounds`` times each."""
    here = Path(__file__).resolve().parents[1]
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for name, code in (("before", against), ("after", here)):
            env = {**os.environ, "PYTHONPATH": str(code)}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--ranks", str(ranks),
                                  "--iterations", str(iterations), "--timed", str(timed), "--json"],
                                  env=env, capture_output=True, text=True, check=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            runs.append({"code": name, "checkout": str(code), "round": r, **res})
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "per_iteration"}), file=sys.stderr)

    def med(code: str, what: str) -> float:
        return round(statistics.median(float(x[what]) for x in runs if x["code"] == code), 3)

    out: dict[str, Any] = {"ranks": ranks, "iterations": iterations, "timed": timed, "rounds": rounds}
    for what in ("us_per_row_timed_median", "ms_per_records_message_timed_median", "analysis_cpu_s"):
        before, after = med("before", what), med("after", what)
        out[what] = {"before": before, "after": after,
                     "ratio_before_over_after": round(before / after, 2) if after else None}
    same = {(x["held_rows"], x["held_settled"], x["held_comm_ns_sum"]) for x in runs}
    return {**out,
            "same_rows_held": len(same) == 1,
            "same_analysis": len({x["analysis_sha256"] for x in runs}) == 1, "runs": runs,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench root-figures", description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=100_000, help="the job's ranks (default %(default)s)")
    ap.add_argument("--iterations", type=int, default=16, help="iterations folded (default %(default)s)")
    ap.add_argument("--timed", type=int, default=4, help="the last iterations timed (default %(default)s)")
    ap.add_argument("--against", type=Path, metavar="CHECKOUT",
                    help="before (CHECKOUT's code) and after, in turn")
    ap.add_argument("--rounds", type=int, default=2,
                    help="with --against: runs of each (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.ranks < 1 or not 1 <= a.timed <= a.iterations:
        ap.error("--ranks >= 1 and 1 <= --timed <= --iterations")
    if a.against is not None:
        res = compare(a.against, a.rounds, a.ranks, a.iterations, a.timed)
    else:
        res = run(a.ranks, a.iterations, a.timed)
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
