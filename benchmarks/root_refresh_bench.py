"""The root's analysis refresh at scale, in one process, no engine: what the aggregator behind
``perfd aggregator --engine`` spends rebuilding a big job's analysis each 0.5 s tick, as the job grows
an iteration at a time. The root's own code folds each node's message (perfd.engine.root.Root.handle:
the message as perfd's encoder makes it, the bench engine's hook records), then the state's refresh
(perfd.aggregator.job_analyses.JobAnalyses.refresh) runs once per new iteration and is timed (process
CPU), split into the step analysis (the per-iteration answer: MFU, the slowest rank, the exposed
communication), the collective analysis and the rest of the tick; and a read of the job's snapshot
once the fold moved the state (``snapshot_cpu_s_median``: what an API read, a scrape or the stall
check pays first after a write). As the job starts, each node's agent sends what a real one does:
its GPUs' process lists and the job's first share of its collective operations (its windows folded
at the agent): the root holds every GPU and every node's agent of the job. ``--collectives``: each
node's agent also sends its ranks' collective records of every iteration, reduced, and the root
folds their windows (perfd bench collectives' job).

    perfd bench root-refresh [--nodes 1000] [--iterations 12] [--collectives] [--profile N] [--json]

``--profile N``: cProfile's N heaviest functions (cumulative) over the timed refreshes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import platform
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.collectives_bench import ITERATION_NS, T0, _node_records
from benchmarks.engine_bench import JOB, RANKS_PER_NODE, _rank_records, node_name, start_messages
from perfd.aggregator.engine_sink import EngineSink
from perfd.aggregator.guard import Guard
from perfd.aggregator.snapshot import Analysed
from perfd.aggregator.state import AggregatorState
from perfd.core.collfold import SENT_RETENTION, for_sending, reduce
from perfd.core.jobinfo_json import job_info_to_json
from perfd.core.limits import Limits
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, ModelSpec, ParallelLayout
from perfd.core.refusals import Refusals
from perfd.engine import subjects as S
from perfd.engine.partial import encode, partials_of
from perfd.engine.root import Root

GPU = "NVIDIA H100 80GB HBM3"
ITERATION_S = 2.0
WARM = 3  # iterations folded before the first timed refresh (the memo and the caches fill)
REFRESH_S = 0.5  # the aggregator's refresher (AggregatorConfig.refresh_interval_s)
POLL_S = 0.1  # live: how often the reader reads the job's snapshot
NEWEST_ROWS = 4  # live: the rows it reads (the newest)
DRAIN_S = 60.0  # live: at most this long for the last iteration's answer after the load stops


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

        a.jobs.analysis = self._clocked(jobs_analysis, "step_s")  # type: ignore[method-assign]
        a.collective_analysis = self._clocked(coll, "coll_s")  # type: ignore[method-assign]

    def _clocked(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        """``fn``, its CPU time added to this split's ``part``."""
        def clocked(*args: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                setattr(self, part, getattr(self, part) + time.process_time() - t)
        return clocked


def _messages(nodes: int, it: int, collectives: bool, rng: random.Random) -> tuple[list[bytes], list[bytes]]:
    """Every node's message of iteration ``it`` (its 8 ranks' hook records, ending 50 ms before the
    iteration's collectives begin: perfd bench collectives' clock) and, with ``collectives``, its
    collective records of the iteration, reduced (in the window of the step that ended before them)."""
    end = (T0 + it * ITERATION_NS - 50_000_000) / 1e9
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


def _root(nodes: int, folds: bool, rate_limited: bool = False) -> tuple[AggregatorState, Root]:
    """``rate_limited``: the aggregator's own; else every refresh analyses what changed (the 0.5 s
    rate limit is the refresher's tick, which :func:`run` plays back to back)."""
    if rate_limited:
        state = AggregatorState(gpu_override=GPU)
    else:
        state = AggregatorState(min_recompute_s=0.0, gpu_override=GPU)
        state._analyses.collectives.min_recompute_s = 0.0
    root = Root(S.EngineConfig(("nats://unused",)), EngineSink(state, Guard(Limits(), Refusals())), "bench")
    info = JobInfo(framework=HOOK_FRAMEWORK, spec=ModelSpec(dtype="bf16"),
                   layout=ParallelLayout(world_size=nodes * RANKS_PER_NODE))
    root.handle([encode("info", node_name(0), 1, (), {JOB: job_info_to_json(info)})])
    # What each node's agent sends as the job starts (perfd bench engine's load does the same): its
    # GPUs' process lists, on the records stream. The root then holds every GPU of the job, each
    # node's agent, and the ranks' placement, which every snapshot of the job reads.
    lists = [data for _subj, mid, data in start_messages(JOB, 0, nodes, nodes * RANKS_PER_NODE, "b", 16)
             if mid.endswith(":gpus")]
    # and its job's first share of its ranks' collective operations, which an agent sends at once
    # (perfd.engine.shares): the root then holds every node's agent as one of the job's. Folded below
    # the root (the agents' fold, perfd agent's default) unless ``folds`` (the root folds them).
    rng, world = random.Random(0), list(range(nodes * RANKS_PER_NODE))
    shares = [encode(f"{node_name(node)}:c:0", node_name(node), 1, (), collectives=[for_sending(
                  reduce(JOB, _node_records(node, RANKS_PER_NODE, nodes, 0, 2, world, rng)), SENT_RETENTION)],
                     collectives_folded=not folds)
              for node in range(nodes)]
    for batch in (lists, shares):
        for i in range(0, len(batch), 256):
            root.handle_records(batch[i:i + 256])
    return state, root


def run(nodes: int, iterations: int, collectives: bool, profile: int = 0) -> dict[str, Any]:
    state, root = _root(nodes, collectives)
    split = _Split(state)
    rng = random.Random(1)
    fold_s: list[float] = []
    snap_s: list[float] = []
    refresh: list[dict[str, float]] = []
    prof = cProfile.Profile() if profile else None
    for it in range(1, iterations + 1):
        msgs, coll = _messages(nodes, it, collectives, rng)
        fold_s.append(_timed(lambda m=msgs, c=coll: _fold(root, m, c)))  # type: ignore[misc]
        # A read of the job's snapshot once its state moved (what /iterations, /metrics and the stall
        # check pay first after a write), before the refresh analyses it: the snapshot's own build
        snap_s.append(_timed(lambda: state.snapshot(JOB)))
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
        "snapshot_cpu_s_median": round(statistics.median(snap_s[WARM:]), 4),
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


def _answers(state: AggregatorState) -> dict[int, tuple[object, ...]]:
    """iteration -> its answer as the job's snapshot serves it now (MFU; the slowest rank's step
    time and rank, which the fold's record names), for its newest rows."""
    snap = state.snapshot(JOB, Analysed.SERVED)
    its = snap.iterations if snap is not None else None
    if its is None:
        return {}
    n = len(its)
    return {int(its.get(i, "iteration")): (its.get(i, "mfu"), its.get(i, "step_time_ms"),
                                          its.get(i, "comm_exposed_share"))
            for i in range(max(0, n - NEWEST_ROWS), n)}


def live(nodes: int, built: list[tuple[list[bytes], list[bytes]]], iteration_s: float,
         poll_s: float = POLL_S) -> dict[str, Any]:
    """The root as it runs: its loop folds each iteration's messages as the iteration ends (every
    ``iteration_s``), the refresher thread refreshes every REFRESH_S with the aggregator's own rate
    limits, and a reader polls the job's snapshot (what /iterations serves) every ``poll_s``. Per
    iteration past WARM, its answer's lag: from its end to the first poll from which on its row gave
    the answer it gives at the end."""
    state, root = _root(nodes, any(c for _m, c in built), rate_limited=True)
    stop = threading.Event()
    refreshes: list[float] = []
    polls: list[tuple[float, dict[int, tuple[object, ...]]]] = []

    def refresher() -> None:
        while not stop.wait(REFRESH_S):
            t = time.monotonic()
            state.refresh()
            refreshes.append(time.monotonic() - t)

    def reader() -> None:
        while not stop.wait(poll_s):
            got = _answers(state)
            polls.append((time.monotonic(), got))

    threads = [threading.Thread(target=refresher, daemon=True), threading.Thread(target=reader, daemon=True)]
    for th in threads:
        th.start()
    ended: dict[int, float] = {}
    folds: list[float] = []
    behind: list[float] = []
    t0 = time.monotonic()
    for k, (msgs, coll) in enumerate(built, 1):
        due = t0 + k * iteration_s
        time.sleep(max(0.0, due - time.monotonic()))
        ended[k] = max(due, time.monotonic())  # the iteration ended: its nodes' messages are here
        behind.append(ended[k] - due)  # the loop was still folding earlier ones (not in the lag)
        folds.append(_timed(lambda m=msgs, c=coll: _fold(root, m, c)))  # type: ignore[misc]
    last = len(built)
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not (polls and last in polls[-1][1]):
        time.sleep(poll_s)
    time.sleep(2 * REFRESH_S + poll_s)  # what the last refreshes make is read
    stop.set()
    for th in threads:
        th.join(60)
    final: dict[int, tuple[object, ...]] = {}
    a = state.analysis(JOB, force=True)
    if a is not None:
        final = {int(a.iterations.get(i, "iteration")): (a.iterations.get(i, "mfu"),
                                                         a.iterations.get(i, "step_time_ms"),
                                                         a.iterations.get(i, "comm_exposed_share"))
                 for i in range(len(a.iterations))}
    lags: list[float] = []
    unsettled = 0
    for k in range(WARM + 1, last + 1):
        settled: float | None = None
        for at, got in polls:
            if at < ended[k] or k not in got:
                continue
            if got[k] == final.get(k):
                settled = at if settled is None else settled
            else:
                settled = None
        if settled is None:
            unsettled += 1
        else:
            lags.append(settled - ended[k])
    jc = state._analyses.collectives.jobs.get(JOB)
    return {"nodes": nodes, "ranks": nodes * RANKS_PER_NODE, "iterations": last, "iteration_s": iteration_s,
            "answer_lag_s": _quantiles(lags), "unsettled": unsettled, "polls": len(polls),
            "refresh_wall_s": _quantiles(refreshes), "fold_cpu_s": _quantiles(folds),
            "loop_behind_s": _quantiles(behind),
            "collective_analysis_cost_s": round(jc.analysis_cost, 3) if jc is not None else None}


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    return {"p50": round(xs[len(xs) // 2], 3), "p99": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
            "max": round(xs[-1], 3), "n": len(xs)}


def compare(against: Path, rounds: int, nodes: int, iterations: int, collectives: bool,
            iteration_s: float) -> dict[str, Any]:
    """:func:`live` with the code of ``against`` (a checkout of the code before) and of this
    checkout in turn, ``rounds`` times each, on the same messages (built once): each a fresh process."""
    here = Path(__file__).resolve().parents[1]
    rng = random.Random(1)
    built = [_messages(nodes, it, collectives, rng) for it in range(1, iterations + 1)]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "messages.pickle"
        path.write_bytes(pickle.dumps(built))
        del built
        for r in range(rounds):
            for name, code in (("before", against), ("after", here)):
                env = {**os.environ, "PYTHONPATH": str(code)}
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--live-from", str(path),
                                      "--nodes", str(nodes), "--iteration-s", str(iteration_s)],
                                     env=env, capture_output=True, text=True, check=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                runs.append({"code": name, "checkout": str(code), "round": r, **res})
                print(json.dumps(runs[-1]), file=sys.stderr)

    def med(code: str, q: str) -> float | None:
        xs = [r["answer_lag_s"][q] for r in runs if r["code"] == code and r["answer_lag_s"]]
        return round(statistics.median(xs), 3) if xs else None

    ratio = {q: (round(b / a, 1) if (b := med("before", q)) and (a := med("after", q)) else None)
             for q in ("p50", "p99", "max")}
    return {"nodes": nodes, "ranks": nodes * RANKS_PER_NODE, "iterations": iterations,
            "collectives": collectives, "iteration_s": iteration_s, "rounds": rounds,
            "answer_lag_s_median_of_runs": {c: {q: med(c, q) for q in ("p50", "p99", "max")}
                                            for c in ("before", "after")},
            "ratio_before_over_after": ratio, "runs": runs,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench root-refresh", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000, help="nodes of 8 ranks (default 1000)")
    ap.add_argument("--iterations", type=int, default=12, help="iterations (default 12)")
    ap.add_argument("--collectives", action="store_true", help="the nodes send collective records too")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's N heaviest functions")
    ap.add_argument("--against", type=Path, metavar="CHECKOUT",
                    help="live, before (CHECKOUT's code) and after (this one's) in turn: the answer's lag")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: runs of each (default 2)")
    ap.add_argument("--iteration-s", type=float, default=ITERATION_S, help="live: seconds per iteration")
    ap.add_argument("--live-from", type=Path, help=argparse.SUPPRESS)  # compare's child: the messages
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    if a.nodes < 1 or a.iterations <= WARM:
        ap.error(f"--nodes >= 1 and --iterations > {WARM}")
    if a.live_from is not None:
        print(json.dumps(live(a.nodes, pickle.loads(a.live_from.read_bytes()), a.iteration_s)))
        return 0
    if a.against is not None:
        res = compare(a.against, a.rounds, a.nodes, a.iterations, a.collectives, a.iteration_s)
        print(json.dumps(res) if a.json else json.dumps(res, indent=1))
        return 0
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
