"""A plain PyTorch DDP job watched by the step hook alone (no framework log): the whole path on CPU.

A real DDP loop (gloo, one rank, a small TransformerEncoder) with ``StepHook(tokens_per_step,
flops_per_step, warmup_steps=5, dtype="bf16")``, ``step_begin()``, ``data_ready()`` after the batch
and ``step_end()``, host timing;
its records go through a real socket to the agent's hook collector, into the aggregator's job store
and its analysis, as they do live. Steps 80-159 wait ten times longer for data. What the issue asked
of such a job: MFU from the hook's flops_per_step, data share from its data wait, the comm share
from the Flight Recorder over the hook's step windows, the slow-data stretch as one incident with
its cost, and a headline with no "None". The numbers are checked against the loop's own timing of
the same steps (two clocks over one interval, not a speed bound).

The analysis reads a recording of this loop (tests/data/hook/ddp_loop/run.json.gz: the records and job
record the collector read, the loop's own clock, on a quiet 2-core machine: tests/hook/loop_recording.py),
not the run the suite makes: on live data its verdicts read the machine's load too, and the test asked
less of them when loaded. The live run proves the path: every step in, the job record as the hook sent it.
Recorded by ``python -m tests.hook.test_any_pytorch_job OUT.json.gz``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.jobs import JobStore
from perfd.analytics.collectives.collective_analysis import analyze_collectives
from perfd.analytics.steps.provenance import Code
from perfd.analytics.steps.vocabulary import HOOK_VOCABULARY
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.core.model import CollectiveRecord, JobInfo, StepRecord
from perfd.hook import StepHook
from perfd.report import build_report
from perfd.report.incident_text import cause_line
from tests.hook import loop_recording
from tests.procs import load_per_cpu
from tests.torch_tests import needs_torch

JOB = "ddp"
STEPS = 200
SLOW = range(80, 160)  # the slow-data stretch
WAIT_S, SLOW_WAIT_S = 0.010, 0.080  # steps ~15 ms: room for a loaded CI machine's timer noise
PEAK_TFLOPS = 0.5  # the test's "GPU": a CPU has no row in the peak table
FLOPS_PER_STEP = 3.0e9
TOKENS_PER_STEP = 4 * 16


def _collect(c: HookCollector, n_steps: int, timeout: float = 20.0) -> Collected:
    out = Collected()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(out.steps) < n_steps:
        got = c.collect(time.time())
        out.steps += got.steps
        out.job_info.update(got.job_info)
        time.sleep(0.01)
    return out


# a real training loop of 200 steps (~5 s), the module fixture of every test: one xdist worker runs them
# all, so the loop runs once, not in each worker that takes one of them (four times, 9-10 s each under
# make test's six workers)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("any_pytorch_job"), needs_torch]


RECORDING = loop_recording.DATA / "ddp_loop" / "run.json.gz"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield _live_run(tmp_path_factory.mktemp("job"))


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return loop_recording.load(RECORDING)


def _live_run(tmp: Path) -> dict[str, Any]:
    """The loop run here under the hook: what the collector read, and what the loop timed itself."""
    import torch
    import torch.distributed as dist

    collector = HookCollector({"socket_path": str(tmp / "hook.sock"), "job": JOB})
    collector.start()
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared CI machine: one thread keeps the compute steady
    try:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.TransformerEncoder(layer, num_layers=2))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def loader() -> Iterator[Any]:
            for i in range(1, STEPS + 1):
                time.sleep(SLOW_WAIT_S if i in SLOW else WAIT_S)  # a slow input pipeline
                yield torch.randn(4, 16, 32)

        hook = StepHook(str(tmp / "hook.sock"), warmup_steps=5, tokens_per_step=TOKENS_PER_STEP,
                        flops_per_step=FLOPS_PER_STEP, cuda=False, dtype="bf16", flush_interval_s=0.05)
        it = loader()
        waits: dict[int, float] = {}
        steps: dict[int, float] = {}
        ended = 0.0
        for i in range(1, STEPS + 1):
            # The loop's own clock over the same work the hook times: a step's time is its period,
            # from the previous step's end to its own (the hook's own bookkeeping between the two, an
            # inline harvest and a send, is in both clocks).
            hook.step_begin(i)
            t0 = time.perf_counter()
            batch = next(it)
            waits[i] = (time.perf_counter() - t0) * 1e3
            hook.data_ready()
            loss = model(batch).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            now = time.perf_counter()
            steps[i] = (now - (ended or t0)) * 1e3
            ended = now
            hook.step_end()
        hook.close(timeout_s=2.0)
        load = load_per_cpu()  # the machine as the loop ran (the 1-minute average), not as a test reads it
        out = _collect(collector, STEPS)
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()
        collector.stop()
    return {"records": out.steps, "job_info": out.job_info, "waits": waits, "steps": steps,
            "errors": dict(collector.errors), "load": load}


@pytest.fixture(scope="module")
def analysed(recorded: dict[str, Any]) -> dict[str, Any]:
    run = recorded
    store = JobStore(min_recompute_s=0.0, peak_tflops=PEAK_TFLOPS)
    for job, info in run["job_info"].items():
        store.ingest_job_info("agent-0", job, info)
    store.ingest_steps("agent-0", run["records"])
    a = store.analysis(JOB, force=True)
    assert a is not None
    return {"analysis": a, "rows": {r.iteration: r for r in a.iterations}}


def test_every_step_arrives_with_the_hooks_job_record(run: dict[str, Any]) -> None:
    assert sorted(r.iteration for r in run["records"]) == list(range(1, STEPS + 1))
    assert run["errors"] == {}
    info: JobInfo = run["job_info"][JOB]
    assert info.framework == "pytorch"
    assert info.layout.world_size == 1  # torch.distributed's, sent by the hook
    assert info.layout.tp is None and info.layout.dp is None  # not named, not assumed
    assert info.spec.dtype == "bf16"


def test_mfu_is_the_hooks_flops_over_step_time_and_peak(recorded: dict[str, Any],
                                                        analysed: dict[str, Any]) -> None:
    a, rows = analysed["analysis"], analysed["rows"]
    steady = [r for r in rows.values() if r.steady_state]
    # Enough for a median: the calm steps outside incidents (~150 alone; 41 with two suites at once on
    # 2 CPUs, where many short slow blips become incidents of their own).
    assert len(steady) >= 20
    for r in steady:  # per iteration: exactly the definition
        per_gpu = FLOPS_PER_STEP / (r.step_time_ms / 1e3 * 1e12 * 1)  # world size 1
        assert r.mfu == pytest.approx(per_gpu / PEAK_TFLOPS, rel=1e-9)
        tput = r.sources["model_tflops_per_gpu"]  # perfd's count, from the FLOPs the hook was given
        assert tput.code is Code.THROUGHPUT and "flops_per_step" in str(tput.args[1])
    # Against the loop's own clock over the same steps: FLOPs summed over time summed, within 1%.
    own = statistics.fmean(recorded["steps"][r.iteration] for r in steady)
    expected = FLOPS_PER_STEP / (own / 1e3 * 1e12 * PEAK_TFLOPS)
    assert a.summary.median("mfu") == pytest.approx(expected, rel=0.01)
    assert a.job.framework == "pytorch" and a.job.layout.world_size == 1
    assert a.job.gpu.dtype == "bf16"


def test_data_share_is_the_hooks_data_wait(recorded: dict[str, Any], analysed: dict[str, Any]) -> None:
    rows = analysed["rows"]
    for span in (range(10, 80), SLOW, range(165, STEPS + 1)):
        perfd = statistics.median(rows[i].data_share for i in span)
        own = statistics.median(recorded["waits"][i] / recorded["steps"][i] for i in span)
        assert perfd == pytest.approx(own, abs=0.03), span
    # Per step, what a rule `data_share > 20%` reads is the loop's own share (its clock over the same
    # step); the stretch as a whole is data-bound. Not "every slow step above 20%": on a loaded
    # machine one step's compute can take four times its 80 ms data wait (seen with two CPU burners).
    # The two clocks read microseconds apart, unless the loop is preempted between them: with two suites
    # at once on 2 CPUs that put 2 ms into a 95 ms step (0.822 against 0.843), and once 5 ms (0.803
    # against 0.855). A quiet 1-minute load average does not rule that out: CI once saw one step of 80
    # off (step 81) with the load below the busy mark. So nine steps in ten within 2 points at any load,
    # and the medians above within 3.
    own_share = {i: recorded["waits"][i] / recorded["steps"][i] for i in SLOW}
    off = [i for i in SLOW if rows[i].data_share != pytest.approx(own_share[i], abs=0.02)]
    assert len(off) <= len(SLOW) // 10, off
    assert statistics.median(rows[i].data_share for i in SLOW) > 0.2
    assert rows[100].sources["data_share"].code is Code.TIMER_SHARE
    assert rows[100].sources["data_share"].args[:2] == ("hook", "data-wait")
    # The hook does not time communication: absent, saying where the share comes from.
    assert rows[100].comm_exposed_share is None
    assert rows[100].sources["comm_exposed_share"].code is HOOK_VOCABULARY.comm_absent is Code.HOOK_NO_COMM


def test_the_flight_recorder_share_over_the_hooks_step_windows(recorded: dict[str, Any]) -> None:
    """The Flight Recorder's records (what a DDP job's NCCL all-reduces leave in the ring; gloo has
    none, so they are placed here) are mapped onto the hook's real step windows: 20% of each
    window spent in one all-reduce gives a comm share of 20%."""
    recs: list[StepRecord] = sorted(recorded["records"], key=lambda r: r.iteration)
    coll = []
    for seq, r in enumerate(recs[1:], start=1):
        assert r.end_time is not None and r.step_time_ms is not None
        start_ns = round((r.end_time - r.step_time_ms / 1e3) * 1e9)
        coll.append(CollectiveRecord(
            job=JOB, source="flight_recorder", op="all_reduce", rank=0, pg_id=0, pg_name="0",
            pg_desc="default_pg", pg_ranks=[0], group_rank=0, group_size=1, collective_seq_id=seq,
            bytes=64 << 20, dtype="BFloat16", state="completed", busbw_gbs=108_000.0,  # as seen live: 241x
            time_created_ns=start_ns + round(r.step_time_ms * 0.1e6), duration_ms=r.step_time_ms * 0.2))
    a = analyze_collectives(JOB, coll, recs)
    assert a.method == "step_windows"
    assert a.comm_total_share == pytest.approx(0.2, abs=0.03)
    assert a.bandwidth == [] and a.bandwidth_rejected == {"single_rank_group": len(coll)}


def test_the_slow_data_stretch_is_one_incident_with_its_cost(recorded: dict[str, Any],
                                                             analysed: dict[str, Any]) -> None:
    a = analysed["analysis"]
    # A loaded CI machine may add short slow blips elsewhere (real slow steps); the stretch itself
    # must be one incident, not several short ones. Its last iteration is SLOW[-1]: an incident of the
    # machine's own slow steps that begins right after it (160-200 once, under a full suite) is not it.
    mine = [i for i in a.incidents if i.first_iteration <= SLOW[-1] and i.last_iteration >= SLOW.start]
    assert len(mine) == 1, [(i.first_iteration, i.last_iteration) for i in a.incidents]
    inc = mine[0]
    # It covers the stretch. A loaded machine's own slow steps next to it may join it (they were
    # slow: the loop's clock says so); the stretch must still be most of what the incident cost,
    # and the cost must be the loop's own clock over whatever range it took.
    assert inc.first_iteration <= SLOW.start + 2 and inc.last_iteration >= SLOW.stop - 3
    # The cost is Σ(step − steady median) over the incident's iterations, checked against the loop's
    # own clock over the same steps with the steady median the analysis measured them by (two clocks
    # over one interval agree to ~0.01 ms a step). That median is the analysis' own: the median of
    # the run's calm steps, all of them, below a cut it takes from the run; on a loaded machine the
    # steps spread (19-43 ms seen) and a median the test re-took its own way (iterations 10-79 alone)
    # missed by 10% (5.39 s against 4.89 s once). So the test asks of it only what it must be:
    # a central value of the loop's calm steps (between their first and ninth deciles: with two suites
    # at once its median stood 0.1 ms above the upper quartile of a calm set that held the blips too).
    ref = inc.steady_step_ms
    assert ref is not None
    calm = sorted(recorded["steps"][i] for i in range(10, STEPS + 1) if i not in SLOW)
    assert calm[len(calm) // 10] <= ref <= calm[9 * len(calm) // 10], (ref, calm[len(calm) // 10],
                                                                      calm[9 * len(calm) // 10])
    span = range(inc.first_iteration, inc.last_iteration + 1)
    lost_s = sum(recorded["steps"][i] - ref for i in span) / 1e3
    assert inc.cost_s == pytest.approx(lost_s, rel=0.03)
    in_stretch = sum(recorded["steps"][i] - ref for i in SLOW) / 1e3
    # Most of it (with two suites at once on 2 CPUs, live, the machine's own slow steps next to the
    # stretch once joined it for 28%: the recording is of a quiet machine)
    assert in_stretch >= 0.8 * lost_s
    # The cause is the data wait (typed), not a guess: it grew by most of the slowdown.
    assert inc.verdict is not None and inc.verdict.cause == "data_wait"
    assert "data loading took up to" in cause_line(inc)


def test_the_headline_names_only_what_is_known(analysed: dict[str, Any]) -> None:
    rep = build_report(analysed["analysis"])
    line = rep.summary.headline
    assert "None" not in line and "MFU n/a" not in line, line
    assert "world size 1" in line and "TP=" not in line, line
    assert "None" not in " ".join(str(v) for v in rep.to_json()["summary"].values() if isinstance(v, str))


def test_without_flops_or_dtype_mfu_says_why(recorded: dict[str, Any]) -> None:
    """The same records with neither the hook's FLOPs nor a dtype: MFU absent with the reason."""
    bare = [StepRecord(**{**r.__dict__, "flops_per_step": None, "tokens_per_step": None})
            for r in recorded["records"]]
    store = JobStore(min_recompute_s=0.0)
    store.ingest_steps("agent-0", bare)
    a = store.analysis(JOB, force=True)
    assert a is not None and a.summary.median("mfu") is None
    assert a.job.framework == "pytorch" and a.job.layout.world_size == 1  # from the ranks
    row = next(r for r in a.iterations if r.steady_state)
    assert row.sources["mfu"].absent
    assert "None" not in build_report(a).summary.headline


def test_a_model_spec_counts_the_flops_from_tokens(tmp_path: Path) -> None:
    """StepHook(model=...) with tokens_per_step: perfd's formula (the one for Megatron-LM), once."""
    spec = {"num_layers": 8, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_attention_heads": 16,
            "kv_channels": 128, "seq_length": 1024, "padded_vocab_size": 32000}
    h = StepHook(str(tmp_path / "none.sock"), tokens_per_step=8 * 1024, model=spec, cuda=False, enabled=False)
    from perfd.analytics.steps.flops import megatron_flops
    from perfd.core.model import ModelSpec
    assert h.flops_per_step == pytest.approx(megatron_flops(ModelSpec(**spec), 8).flops_per_iteration)  # type: ignore[arg-type]
    # What it cannot count is said once and left absent: nothing raises in the user's script.
    typo = StepHook(str(tmp_path / "none.sock"), tokens_per_step=1, model={"layers": 8}, enabled=False)
    assert typo.flops_per_step is None and "unknown field" in typo.argument_problems[0]
    short = StepHook(str(tmp_path / "none.sock"), tokens_per_step=1, model={"num_layers": 8}, enabled=False)
    assert short.flops_per_step is None and "missing" in short.argument_problems[0]
    bad = StepHook(str(tmp_path / "none.sock"), layout={"tp": 0, "pp": 2}, enabled=False)
    assert bad.layout == {"pp": 2}


def test_the_recording_is_the_loop_read_as_the_collector_reads_it(recorded: dict[str, Any]) -> None:
    """What the analysis above reads: the same loop, recorded on a quiet machine (its load kept)."""
    assert recorded["load"] < 1.0 and recorded["errors"] == {}
    assert sorted(r.iteration for r in recorded["records"]) == list(range(1, STEPS + 1))
    assert sorted(recorded["steps"]) == sorted(recorded["waits"]) == list(range(1, STEPS + 1))
    assert recorded["job_info"][JOB].spec.dtype == "bf16"


def _record(path: Path) -> None:
    """The loop run once here (a quiet machine: its load is kept with it), written to ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        got = _live_run(Path(tmp))
    loop_recording.save(path, got)
    print(f"{path}: {len(got['records'])} records, load {got['load']:.2f} per CPU as the loop ran")


if __name__ == "__main__":
    _record(Path(sys.argv[1]) if len(sys.argv) > 1 else RECORDING)
