"""`perfd bench decode`: what one batch costs the aggregator after gRPC hands it over.

    perfd bench decode [--agents 500] [--rounds 4] [--json]

Parse (``AgentMessage.FromString``), ``decode_batch`` and ``Aggregator.on_batch`` of the two kinds
of batch a node sends in ``perfd bench scale``: 200 node samples (8 GPUs × 25 series), and one
step record. ``--agents`` agents' batches interleave, so the per-agent state is not all in cache.
Each round measures both wire forms of the samples, in turn: the little-endian arrays agents send
now and the packed repeated fields of older agents (still read), so their ratio comes from one run.
Process CPU time, median over rounds, per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scale_bench import GPUS, SERIES_PER_GPU
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.core.model import StepRecord
from perfd.transport.codec import decode_batch, encode_batch, sample_columns
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import SeriesTable


def _packed(b: pb.Batch) -> pb.Batch:
    """The same batch with its samples in the older packed form."""
    ids, ts, vals = sample_columns(b)
    old = pb.Batch()
    old.CopyFrom(b)
    for f in ("series_ids_le", "timestamps_ns_le", "values_le"):
        old.ClearField(f)
    old.series_ids.extend(ids)
    old.timestamps_ns.extend(ts)
    old.values.extend(vals)
    return old


def _messages(agents: int, rounds: int, form: str) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Per round, every agent's samples batch and its step batch, serialized as AgentMessages."""
    tables = [SeriesTable() for _ in range(agents)]
    ids = [[t.id_for(f"perfd_gpu_metric_{k}", {"gpu": str(g), "node": f"node-{j:05d}"})
            for g in range(GPUS) for k in range(SERIES_PER_GPU)] for j, t in enumerate(tables)]
    samples: list[list[bytes]] = []
    steps: list[list[bytes]] = []
    for r in range(rounds + 1):  # round 0 defines the series and warms up
        now = time.time_ns() + r * 1_000_000_000
        s_round, t_round = [], []
        for j, t in enumerate(tables):
            vals = [float((r + k) % 100) for k in range(len(ids[j]))]
            b = encode_batch(f"node-{j:05d}", 2 * r + 1, [], [], [], t, created_ns=now,
                             columns=(ids[j], [now] * len(vals), vals))
            s_round.append(pb.AgentMessage(batch=_packed(b) if form == "packed" else b).SerializeToString())
            rec = StepRecord(job="bench-job", iteration=r, rank="last", end_time=now / 1e9,
                             step_time_ms=1000.0)
            t_round.append(pb.AgentMessage(batch=encode_batch(f"node-{j:05d}", 2 * r + 2, [], [rec], [], t,
                                                              created_ns=now)).SerializeToString())
        samples.append(s_round)
        steps.append(t_round)
    return samples, steps


def _ingest(agg: Aggregator, tables: list[dict[int, Any]], msgs: list[bytes]) -> float:
    t0 = time.process_time()
    for j, raw in enumerate(msgs):
        d = decode_batch(pb.AgentMessage.FromString(raw).batch, tables[j])
        agg.on_batch(d.agent_id, d)
    return (time.process_time() - t0) / len(msgs)


def run(agents: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"agents": agents, "rounds": rounds, "samples_per_batch": GPUS * SERIES_PER_GPU}
    per: dict[str, list[float]] = {"arrays": [], "packed": [], "step": []}
    built = {form: _messages(agents, rounds, form) for form in ("arrays", "packed")}
    aggs = {form: Aggregator(AggregatorConfig(rules_files=[], gpu="NVIDIA H100 80GB HBM3")) for form in built}
    streams: dict[str, list[dict[int, Any]]] = {form: [{} for _ in range(agents)] for form in built}
    for form, (samples, steps) in built.items():
        for j in range(agents):
            aggs[form].on_hello_jobs(f"node-{j:05d}", ["bench-job"])
        _ingest(aggs[form], streams[form], samples[0])
        _ingest(aggs[form], streams[form], steps[0])
    for r in range(1, rounds + 1):
        for form, (samples, steps) in built.items():
            per[form].append(_ingest(aggs[form], streams[form], samples[r]))
            if form == "arrays":
                per["step"].append(_ingest(aggs[form], streams[form], steps[r]))
    med = {k: statistics.median(v) * 1e6 for k, v in per.items()}
    out.update({"samples_batch_us": med["arrays"], "samples_batch_packed_us": med["packed"],
                "packed_over_arrays": med["packed"] / med["arrays"], "step_batch_us": med["step"],
                "machine": f"python {sys.version.split()[0]}"})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=500,
                    help="agents whose batches interleave (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="measured rounds (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ns = ap.parse_args(argv)
    if ns.agents < 1 or ns.rounds < 1:
        print("perfd bench decode: --agents and --rounds must be >= 1", file=sys.stderr)
        return 2
    res = run(ns.agents, ns.rounds)
    if ns.json:
        print(json.dumps(res))
    else:
        print(f"{res['agents']} agents, per batch (parse + decode + on_batch, median of {ns.rounds} "
              f"rounds): {res['samples_per_batch']} samples as arrays {res['samples_batch_us']:.1f} us, as "
              f"packed fields {res['samples_batch_packed_us']:.1f} us ({res['packed_over_arrays']:.1f}x); "
              f"one step record {res['step_batch_us']:.1f} us; {res['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
