"""What the aggregator's /metrics scrape costs with ``--jobs`` running jobs, and the text it serves.

Each job is a recorded 2-GPU Megatron-LM run, in turn the demo's (perfd/app/demo/data, 2×H200, pipeline
parallel) and tests/data/megatron/dp2_all_timers.log (data parallel, with per-rank compute ratios),
its step records through the wire form (protobuf bytes) into one ``AggregatorState`` with its two
ranks placed on two GPUs, analysed once (``refresh``). Then a scrape, as /metrics makes it
(``_StateCollector`` in a registry, ``generate_latest``), is timed ``--rounds`` times (process CPU
time: the median and the least), and the job families alone (``job_families`` of the running jobs' latest
iterations) as often. The clock is held
still, so two runs on two commits serve the same text: ``--out FILE`` writes one scrape, to ``diff``.

    PYTHONPATH=$PWD python benchmarks/scrape_bench.py [--jobs 64] [--rounds 200] [--out FILE]
                                                      [--no-rank-series]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

NOW = 1_900_000_000.0  # the still clock: every job's last step arrived now, so every job runs
time.time = lambda: NOW  # before perfd is imported: every reader of the clock sees it

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from perfd.aggregator.http import _StateCollector  # noqa: E402
from perfd.aggregator.snapshot import latest_of_running  # noqa: E402
from perfd.aggregator.state import AggregatorState  # noqa: E402
from perfd.collectors.megatron import parse_file  # noqa: E402
from perfd.exporters.prometheus import job_families  # noqa: E402
from perfd.transport.gen import perfd_pb2 as pb  # noqa: E402
from perfd.transport.record_codec import step_from_pb, step_to_pb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOGS = (ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log",
        ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log")
GPU = "NVIDIA H200"


def _state(jobs: int) -> AggregatorState:
    st = AggregatorState(gpu_override=GPU, min_recompute_s=0.0)
    for j in range(jobs):
        job, node = f"job-{j:03d}", f"node-{j:03d}"
        parsed = parse_file(LOGS[j % len(LOGS)], job=job)
        agent = f"agent-{j:03d}"
        st.hello(agent, [job])
        st.ingest_job_info(agent, job, parsed.job_info)
        steps = []
        for rec in parsed.records:
            m = pb.StepRecord()
            step_to_pb(rec, m)
            steps.append(step_from_pb(pb.StepRecord.FromString(m.SerializeToString())))
        st.ingest_steps(agent, steps)
        st.ingest_events(agent, [
            {"kind": "gpu_processes", "labels": {"node": node, "gpu": str(r)},
             "payload": [{"pid": 100 + r, "rank": r, "world_size": 2, "cmdline": "python pretrain_gpt.py"}]}
            for r in (0, 1)])
    st.refresh()
    return st


def _cpu_ms(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    """The median and the least process CPU time of ``fn()``, in ms: CPU, not wall time, and the least
    beside the median, so that other programs on a shared machine move the figures less."""
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, help="write one scrape's text here")
    ap.add_argument("--no-rank-series", action="store_true", help="as the aggregator's flag")
    args = ap.parse_args()
    st = _state(args.jobs)
    reg = CollectorRegistry()
    reg.register(_StateCollector(st, per_rank_series=not args.no_rank_series))
    text = generate_latest(reg)
    if args.out is not None:
        args.out.write_bytes(text)

    def families() -> None:
        snaps = [s for j in st.job_names() if (s := st.snapshot(j)) is not None]
        for _ in job_families(latest_of_running(snaps, NOW), per_rank=not args.no_rank_series):
            pass

    scrape = _cpu_ms(lambda: generate_latest(reg), args.rounds)
    fams = _cpu_ms(families, args.rounds)
    print(f"jobs {args.jobs}: scrape {scrape[0]:.3f} ms (least {scrape[1]:.3f}), job families "
          f"{fams[0]:.3f} ms (least {fams[1]:.3f}) of CPU, median of {args.rounds}; {len(text):,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
