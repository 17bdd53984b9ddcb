"""`perfd bench ...`: the measurements in benchmarks/ (needs a source checkout)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

BENCHES = {
    "ingest": ("benchmarks.ingest_bench", "samples/s one aggregator ingests from agents on loopback"),
    "parse": ("benchmarks.parse_bench", "Megatron log parse rate"),
    "tail": ("benchmarks.tail_bench", "Megatron log tail (read + parse), per-rank timers"),
    "hook": ("benchmarks.hook_overhead", "host cost of the step hook per step (--gpu: paired loop)"),
    "decode": ("benchmarks.decode_bench", "one batch's parse, decode and ingest: array vs packed samples"),
    "analysis": ("benchmarks.analysis_bench", "re-analysis of a growing run: from scratch vs incremental"),
    "baseline": ("benchmarks.baseline_bench", "a steady GPU sighting of an N-node job (all ranks placed)"),
    "scale": ("benchmarks.scale_bench", "one aggregator under N simulated agents (separate processes)"),
    "admission": ("benchmarks.admission_storm",
                  "a connect storm on an ingest server with no time left: refusals, hints, agents in"),
    "engine": ("benchmarks.engine_bench", "the distributed path: nats-server, shards, a root, N nodes"),
    "engine-storm": ("benchmarks.engine_storm",
                     "N agents on the engine lose it under CPU contention and come back"),
    "soak": ("benchmarks.soak_bench", "an aggregator's long life: 5,000 short jobs, 100 agents, restarts"),
    "overhead": ("benchmarks.overhead_bench", "a Megatron-LM job with and without perfd (2 GPUs)"),
    "ranks": ("benchmarks.ranks_bench", "the agent's ranks collector per rank and per node (real processes)"),
    "collectives": ("benchmarks.collectives_bench",
                    "an N-node job's collective records reduced: bytes, agent and root CPU, analysis"),
    "root-refresh": ("benchmarks.root_refresh_bench",
                     "the engine root's analysis refresh of an N-node job, per iteration (in process)"),
    "root-figures": ("benchmarks.root_figures_bench",
                     "the engine root's CPU per window-figure row of an N-rank job's shards (in process)"),
    "root-summaries": ("benchmarks.root_summary_bench",
                       "the engine root's CPU and bytes an iteration: shards' partials vs step summaries"),
    "inbox": ("benchmarks.inbox_bench",
              "a stream's messages read beside a busy event loop: a message a turn vs an inbox"),
    "redact": ("benchmarks.redact_bench",
               "the command-line redaction's scan on words made to backtrack: a scale against 4x it"),
    "switch": ("benchmarks.switch_bench",
               "an event loop's reads beside a CPU-bound thread, per interpreter switch interval"),
    "memory": ("benchmarks.memory_bench",
               "a real aggregator's RSS and allocator bytes under the fault and security tests' floods"),
    "stall": ("benchmarks.stall_bench",
              "seconds from a SIGSTOP to a real aggregator's stall, and to the rank's state read"),
    "shutdown": ("benchmarks.shutdown_bench",
                 "an aggregator's stop while its rules tick is in housekeeping, against its budget"),
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (" + ", ".join(BENCHES) + ")")
    p.add_argument("which", choices=sorted(BENCHES),
                   help="; ".join(f"{k}: {v[1]}" for k, v in BENCHES.items()))
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark (see its --help)")
    p.set_defaults(handler=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    module = BENCHES[args.which][0]
    root = Path(__file__).resolve().parents[3]  # the checkout perfd runs from (editable install)
    if (root / "benchmarks").is_dir() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        print(f"perfd bench: {module} not found ({exc}); run from a perfd source checkout",
              file=sys.stderr)
        return 2
    argv = [a for a in args.args if a != "--"]
    if inspect.signature(mod.main).parameters:
        return int(mod.main(argv) or 0)
    sys.argv = [module, *argv]  # a benchmark that reads sys.argv itself
    return int(mod.main() or 0)
