"""The root's analysis refresh at scale, in one process, no engine: what the aggregator behind
``perfd aggregator --engine`` spends rebuilding a big job's analysis each 0.5 s tick, as the job grows
an iteration at a time. The root's own code folds each node's message (perfd.engine.root.Root.handle:
the message as perfd's encoder makes it, the bench engine's hook records), then the state's refresh
(perfd.aggregator.job_analyses.JobAnalyses.refresh) runs once per new iteration and is timed (process
CPU), split into the step analysis (the per-iteration answer: MFU, the slowest rank, the exposed
communication), the collective analysis and the rest of the tick. ``--collectives``: each node's agent
also sends its ranks' collective records of the iteration, reduced (perfd bench collectives' job).

    perfd bench root-refresh [--nodes 1000] [--iterations 12] [--collectives] [--profile N] [--json]

``--profile N``: cProfile's N heaviest functions (cumulative) over the timed refreshes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.collectives_bench import _node_records
from benchmarks.engine_bench import JOB, RANKS_PER_NODE, _rank_records, node_name
from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.state import AggregatorState
from perfd.collfold import SENT_RETENTION, for_sending, reduce
from perfd.engine import subjects as S
from perfd.engine.partial import encode, partials_of
from perfd.engine.root import Root
from perfd.jobinfo_json import job_info_to_json
from perfd.limits import Limits
from perfd.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout
from perfd.refusals import Refusals

GPU = "NVIDIA H100 80GB HBM3"
ITERATION_S = 2.0
WARM = 3  # iterations folded before the first timed refresh (the memo and the caches fill)


def _timed(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


class _Split:
    """The state's refresh with its parts' CPU summed (their calls wrapped for the run)."""

    def __init__(self, state: AggregatorState) -> None:
        self.step_s = self.coll_s = 0.0
        a = state._analyses
        jobs_analysis, coll = a.jobs.analysis, a.collective_analysis

        def step(*args: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return jobs_analysis(*args, **kw)
            finally:
                self.step_s += time.process_time() - t

        def collective(*args: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return coll(*args, **kw)
            finally:
                self.coll_s += time.process_time() - t

        a.jobs.analysis = step  # type: ignore[method-assign]
        a.collective_analysis = collective  # type: ignore[method-assign]


def _messages(nodes: int, it: int, end: float, collectives: bool, rng: random.Random
              ) -> tuple[list[bytes], list[bytes]]:
    """Every node's message of iteration ``it`` (its 8 ranks' hook records) and, with ``collectives``,
    its collective records of the iteration, reduced (the window of the step that ended before it)."""
    world = nodes * RANKS_PER_NODE
    ranks = list(range(world))
    msgs, coll = [], []
    for node in range(nodes):
        mid = f"{node_name(node)}:b:{it}"
        recs = _rank_records(JOB, node, world, it, end)
        msgs.append(encode(mid, node_name(node), 1, partials_of(recs, mid)))
        if collectives:
            part = for_sending(reduce(JOB, _node_records(node, RANKS_PER_NODE, nodes, it, 4, ranks, rng)),
                               SENT_RETENTION)
            coll.append(encode(f"{node_name(node)}:c:{it}", node_name(node), 1, (), collectives=[part]))
    return msgs, coll


def _fold(root: Root, msgs: list[bytes], coll: list[bytes]) -> None:
    """What the root's loop does with them: batches of 256, then what it held back."""
    for i in range(0, len(msgs), 256):
        root.handle(msgs[i:i + 256])
    root.flush(every=True)
    if coll:
        root.handle_records(coll)


def _root(nodes: int) -> tuple[AggregatorState, Root]:
    # Every refresh analyses what changed (the 0.5 s rate limit is the refresher's tick here)
    state = AggregatorState(min_recompute_s=0.0, gpu_override=GPU)
    state._analyses.collectives.min_recompute_s = 0.0
    root = Root(S.EngineConfig(("nats://unused",)), EngineSink(state, Guard(Limits(), Refusals())), "bench")
    info = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                   layout=ParallelLayout(world_size=nodes * RANKS_PER_NODE))
    root.handle([encode("info", node_name(0), 1, (), {JOB: job_info_to_json(info)})])
    return state, root


def run(nodes: int, iterations: int, collectives: bool, profile: int = 0) -> dict[str, Any]:
    state, root = _root(nodes)
    split = _Split(state)
    rng = random.Random(1)
    t0 = time.time() - (iterations + 1) * ITERATION_S
    fold_s: list[float] = []
    refresh: list[dict[str, float]] = []
    prof = cProfile.Profile() if profile else None
    for it in range(1, iterations + 1):
        msgs, coll = _messages(nodes, it, t0 + it * ITERATION_S, collectives, rng)
        fold_s.append(_timed(lambda m=msgs, c=coll: _fold(root, m, c)))  # type: ignore[misc]
        split.step_s = split.coll_s = 0.0
        if prof is not None and it > WARM:
            prof.enable()
        total = _timed(state.refresh)
        if prof is not None:
            prof.disable()
        refresh.append({"iteration": it, "total_s": round(total, 4),
                        "step_analysis_s": round(split.step_s, 4),
                        "collective_analysis_s": round(split.coll_s, 4),
                        "rest_s": round(total - split.step_s - split.coll_s, 4)})
    timed = refresh[WARM:]
    a = state.analysis(JOB)
    last = a.iterations[-1] if a is not None and a.iterations else None
    out: dict[str, Any] = {
        "nodes": nodes, "ranks": nodes * RANKS_PER_NODE, "iterations": iterations, "collectives": collectives,
        "fold_cpu_s_per_iteration_median": round(statistics.median(fold_s), 4),
        "refresh_cpu_s_median": {k: round(statistics.median(r[k] for r in timed), 4)
                                 for k in ("total_s", "step_analysis_s", "collective_analysis_s", "rest_s")},
        "refreshes": refresh,
        "answer": None if last is None else {"iteration": last.iteration, "mfu": last.mfu,
                                             "comm_exposed_share": last.comm_exposed_share},
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
    }
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(profile)
        out["profile"] = s.getvalue()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench root-refresh", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="nodes of 8 ranks (default 1000)")
    ap.add_argument("--iterations", type=int, default=12, help="iterations (default 12)")
    ap.add_argument("--collectives", action="store_true", help="the nodes send collective records too")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's N heaviest functions")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    if a.nodes < 1 or a.iterations <= WARM:
        ap.error(f"--nodes >= 1 and --iterations > {WARM}")
    res = run(a.nodes, a.iterations, a.collectives, a.profile)
    if a.json:
        print(json.dumps(res))
    else:
        prof = res.pop("profile", None)
        print(json.dumps({k: v for k, v in res.items() if k != "refreshes"}, indent=1))
        for r in res["refreshes"]:
            print(r)
        if prof:
            print(prof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
