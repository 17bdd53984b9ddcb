"""ncu rows by launch on the same run, on the H100 recording of the ncu workflow
(tests/analytics/ncu_workflow_data.py; the files in tests/data/ncu/README.md): run 2's range (72
launches, ncu 2025.3.1, the details and raw pages) and the Kineto trace of run 1 that chose its kernels
and its launch window, both of the same job.

- ``perfd analyze ncu details.csv --csv raw.csv --capture trace --kernel-filter F --launch-skip S --json``
  (the real CLI, in the test's process with the trace read once a session: tests/trace_cache.py) gives
  the coverage the agent recorded with the capture: 72 launches, 72 matched, exact,
  the forward of layer 12 and the backward of layers 11-12.
- Every ncu verdict agrees with the budget the same trace gives run 1's log: the linear GEMMs (the budget
  measures them at 84% of the matmul ceiling) read "fewer FLOPs", never "shape"; attention's batched
  matmuls (the same nvjet kernel as the linear GEMMs) are attention's by their launches, memory-bound,
  and get no GEMM verdict.
- Latency-bound is read as docs/diagnosis.md says: NVIDIA's rule (both speeds of light under its latency
  bar), or a kernel without matrix math whose own registers or shared memory cap its occupancy at half
  the SM's warps or less where the rule reads compute or balanced.
- A launch window chosen on the timeline fits its time budget: the 72-launch window took a 60 s budget
  and overran it on both ranges (held 78.0 and 79.0 s).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics import thresholds as th
from perfd.analytics.breakdown.kernel_rows import RowVerdict
from perfd.analytics.breakdown.ncu_kernels import KernelBound
from perfd.analytics.breakdown.ncu_rows import JoinedKernel, NcuCategory
from perfd.analytics.ncu.ncu_verdicts import NcuFinding
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.collectors.megatron import parse_lines
from perfd.report.grade_text import worded
from perfd.report.remedy_text import worded_remedies
from tests.analytics.ncu_workflow_data import GPU, JOB, KINETO, NCU, RANGE2, RANGE3, log_text, manifests
from tests.trace_cache import cached, perfd_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ncu_workflow")]

TRACE = NCU / "h100_workflow_run1_rank0_trace.json.gz"
TNT = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"


def range_analysis(capture: str = RANGE2) -> dict[str, Any]:
    a = manifests()[capture]["analysis"]["0"]
    assert isinstance(a, dict)
    return a


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The CLI's JSON of run 2's range joined launch by launch to run 1's trace, as the range ran: once
    per session, whichever xdist worker asks first (a function of the files read and the code)."""
    pages = [NCU / f"h100_workflow_run2_rank0_{page}.csv.gz" for page in ("details", "raw")]
    a = range_analysis()
    flags = ("--kernel-filter", a["kernel_filter"], "--launch-skip", a["kernel_choice"]["launch_skip"])

    def run() -> dict[str, Any]:
        d = tmp_path_factory.mktemp("ncu")
        for page, gz in zip(("details", "raw"), pages, strict=True):
            (d / f"{page}.csv").write_bytes(gzip.decompress(gz.read_bytes()))
        r = perfd_cli("analyze", "ncu", d / "details.csv", "--csv", d / "raw.csv", "--capture", TRACE, *flags,
                  "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert isinstance(out, dict)
        return out

    return cached("ncu-workflow-rows", [*pages, TRACE], flags, run)


def test_analyze_ncu_reproduces_the_coverage_the_agent_recorded(rows: dict[str, Any]) -> None:
    recorded = range_analysis()["coverage"]
    assert rows["coverage"] == recorded  # every key: launches, matched, how, phases, layers, parts, ...
    assert (recorded["launches"], recorded["matched"], recorded["how"]) == (72, 72, "exact")
    assert recorded["layers"] == {"forward": [12], "backward": [11, 12]} and recorded["layers_total"] == 12
    assert range_analysis()["kernel_choice"]["launch_skip"] == 94
    # run 3's range, the same window of the resumed run, recorded the same coverage
    assert range_analysis(RANGE3)["coverage"] == recorded
    assert all(k["match"] == "launch" for k in rows["kernels"])
    # the same nvjet kernel ran the linear GEMMs and attention's batched matmul: two rows, by op
    tnt = {(k["part"], k["op"]) for k in rows["kernels"] if k["name"] == TNT}
    assert ("attention", "aten::bmm (backward)") in tnt and any(p == "linear" for p, _ in tnt)


@cache
def run1_with_rows(rows_json: str) -> RunAnalysis:
    """Run 1's log read with its Kineto trace (the step budget) and run 2's ncu rows on its parts, as the
    live aggregator joins them (perfd.aggregator.capture_records.ncu_of)."""
    from tests.trace_cache import timeline_class

    out = json.loads(rows_json)
    a = range_analysis()
    extra = {"kernel_choice": a["kernel_choice"], "coverage": out["coverage"], "capture": RANGE2}
    cats = tuple(NcuCategory.from_json({**c, **extra}) for c in out["categories"])
    kernels = tuple(JoinedKernel.from_json(k) for k in out["kernels"])
    assert all(cats) and all(kernels)
    tl = dataclasses.replace(timeline_class(str(TRACE)), ncu=tuple(c for c in cats if c), ncu_id=RANGE2,
                             ncu_kernels=tuple(k for k in kernels if k), ncu_joined_to=KINETO)
    p = parse_lines(log_text(1).splitlines(keepends=True), job=JOB)
    return analyze_run(p.job_info, list(p.records), gpu_name=GPU, timeline=tl, job_name=JOB)


def test_no_ncu_verdict_contradicts_the_budget(rows: dict[str, Any]) -> None:
    a = run1_with_rows(json.dumps(rows, sort_keys=True))
    b = a.summary.step_budget
    assert b is not None
    found = {f.id: f for f in a.findings}
    of = found["budget-gemm"].evidence["of_ceiling"]
    assert of == pytest.approx(0.84, abs=0.01) and of >= th.GEMM_EFFICIENT.value  # "84% of the ceiling"
    verdicts = [f.evidence["ncu_verdict"] for f in a.findings if "ncu_verdict" in f.evidence]
    pairs = {(v["part"], v["category"]) for v in verdicts}
    assert pairs >= {("linear", "gemm"), ("attention", "elementwise")}
    for v in verdicts:
        if v["category"] == "gemm":
            assert v["part"] != "attention"  # attention's remedy is the budget's (fusing it), never a GEMM's
            assert v["verdict"] == "fewer_flops"  # at 84% of the ceiling: fewer FLOPs, not another shape
    lin_gemm = found["ncu-linear-gemm"]  # the verdict, typed; the report words it
    assert isinstance(lin_gemm, NcuFinding) and lin_gemm.facts is not None
    assert lin_gemm.facts.verdict is RowVerdict.FEWER_FLOPS and "fewer flops" in worded(lin_gemm).title
    # attention's batched matmuls, by their launches: memory-bound on the tensor pipes' fifth, attention's
    attn = [c for c in rows["categories"] if c["part"] == "attention" and c["category"] == "gemm"]
    assert len(attn) == 1 and attn[0]["bound"] == "memory-bound" and attn[0]["tensor_pipe"] < 0.25
    lin = next(c for c in rows["categories"] if c["part"] == "linear" and c["category"] == "gemm")
    assert lin["bound"] == "compute-bound" and lin["tensor_pipe"] > 0.8


def nvidia_rule(compute: float, memory: float) -> str:
    """NVIDIA's SOLBottleneck rule, by hand: both under the latency bar, latency; both under the high bar
    and within the margin, balanced; else the busier unit."""
    if compute < th.SOL_LATENCY.value and memory < th.SOL_LATENCY.value:
        return "latency-bound"
    if compute < th.SOL_HIGH.value and memory < th.SOL_HIGH.value \
            and abs(compute - memory) < th.SOL_BALANCED_MARGIN.value:
        return "balanced"
    return "compute-bound" if compute >= memory else "memory-bound"


def test_latency_bound_is_read_as_the_docs_say(rows: dict[str, Any]) -> None:
    latency = 0
    for k in rows["kernels"]:
        rule = nvidia_rule(k["compute_throughput"], k["memory_throughput"])
        # its own registers or shared memory cap its occupancy at half the warps or less, no matrix math
        capped = (k["category"] != "gemm" and k["occupancy_limiter"] is not None
                  and k["theoretical_occupancy"] <= th.NCU_OCCUPANCY_CAP.value
                  and (k["tensor_pipe"] or 0.0) < th.NCU_TENSOR_IDLE.value)
        want = "latency-bound" if capped and rule in ("compute-bound", "balanced") else rule
        assert k["bound"] == want, (k["name"][:80], k["compute_throughput"], k["memory_throughput"])
        latency += k["bound"] == KernelBound.LATENCY.value
    assert latency > 0
    softmax = next(k for k in rows["kernels"] if "softmax_warp_forward" in k["name"])
    assert softmax["bound"] == "latency-bound" and softmax["theoretical_occupancy"] == pytest.approx(0.375)
    assert softmax["occupancy_limiter"] == "registers"


@pytest.fixture(scope="module")
def prefix_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An agent's capture directory holding run 1's Kineto capture with its trace (as the H100 agent's
    did when ncu-prefix ran), and a stand-in ncu binary: (capture dir, ncu)."""
    import shutil

    from perfd.capture.store import CaptureStore
    from tests.capture.test_ncu_capture import make_fake_ncu
    from tests.trace_cache import analyze_chrome_trace

    d = tmp_path_factory.mktemp("prefix")
    exe, _ = make_fake_ncu(d)
    caps = d / "caps"
    store = CaptureStore(caps, 10**9)
    m = store.new_capture(JOB, (0,), "kineto")
    trace = store.capture_dir(m["id"]) / "rank0_511.json.gz"
    shutil.copyfile(TRACE, trace)
    store.add_artifact(m, trace, "kineto_trace", 0, 511)
    m["analysis"] = {"0": analyze_chrome_trace(trace).to_json()}
    m["steps"] = {"start": None, "count": 3}
    store.finish(m, "ok")
    return caps, exe


def test_a_launch_window_fits_its_time_budget(prefix_store: tuple[Path, Path]) -> None:
    """ncu-prefix on run 1's capture (its trace on disk) chooses the recorded window (skip 94, count 72)
    and, with no --time-budget, a budget that holds the ranges the H100 recorded with it (78.0 and 79.0 s:
    a 60 s budget was overrun on both). Given a budget the window does not fit, it says what it needs and
    profiles no window it cannot finish."""
    caps, exe = prefix_store
    held = [manifests()[c]["range_held_s"] for c in (RANGE2, RANGE3)]
    assert held == pytest.approx([78.0, 79.0], abs=0.01)
    r = perfd_cli("ncu-prefix", "--job", JOB, "--ranks", "0", "--capture-dir", caps, PERFD_NCU=str(exe))
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    skip, count = int(words[words.index("--launch-skip") + 1]), int(words[words.index("--launch-count") + 1])
    assert (skip, count) == (94, 72)  # the window the H100 ran
    budget = float(words[words.index("--time-budget") + 1])
    assert budget >= max(held) * 1.1  # the recorded ranges fit, with room
    assert "s to profile" in r.stderr
    said = float(r.stderr.split("s to profile")[0].rsplit("~", 1)[1])
    assert said == pytest.approx(sum(held) / 2, rel=0.1)  # ncu's time as the H100 took it (was ~44 s)
    tight = perfd_cli("ncu-prefix", "--job", JOB, "--ranks", "0", "--capture-dir", caps, "--time-budget",
                      "60", "--launch-count", "20", PERFD_NCU=str(exe))
    assert tight.returncode == 0, tight.stderr
    assert "no launch window" in tight.stderr and f"--time-budget {budget:g}" in tight.stderr
    assert "--launch-skip" not in tight.stdout.split()  # no window it cannot finish in 60 s


def test_the_arming_estimate_holds_what_arming_cost(prefix_store: tuple[Path, Path]) -> None:
    """ncu-prefix said "expect up to +486 ms of host time per step"; run 2's armed steps ran ~1,250 ms
    over run 1's steady step (its log, by hand): the estimate it prints now brackets what it cost."""
    import re
    import statistics

    from tests.analytics.ncu_workflow_data import WARMUP, run1_steady_median_s, run_of, touched

    caps, exe = prefix_store
    armed = statistics.median(s.step_s for s in run_of(2).steps[WARMUP:] if not touched(s))
    extra_ms = (armed - run1_steady_median_s()) * 1e3
    assert 1000 < extra_ms < 1400
    r = perfd_cli("ncu-prefix", "--job", JOB, "--ranks", "0", "--capture-dir", caps, PERFD_NCU=str(exe))
    m = re.search(r"expect \+(\d+) to \+(\d+) ms of host time per step", r.stderr)
    assert m is not None, r.stderr
    low, high = float(m.group(1)), float(m.group(2))
    assert low < extra_ms <= high


def test_the_budget_holds_one_data_wait_and_names_whose_capture_it_is() -> None:
    """Read as the engineer reads run 2's report: the budget listed "data wait 9 ms (1%); data wait 9 ms
    (1%)" (the timers' 2.5% taken from two idle parts, two rows: the part's own figure half of it), and
    "The capture slowed its steps by +23%" beside run 2's ncu arming, with no word of whose capture:
    it is run 1's Kineto capture against run 1's steady steps, like with like."""
    from perfd.analytics.breakdown.step_parts import Part
    from tests.trace_cache import timeline_class

    p = parse_lines((log_text(1) + log_text(2)).splitlines(keepends=True), job=JOB)
    a = analyze_run(p.job_info, list(p.records), gpu_name=GPU, timeline=timeline_class(str(TRACE)),
                    job_name=JOB)
    assert (a.summary.runs.current, a.summary.runs.figures_run) == (2, 1)
    b = a.summary.step_budget
    assert b is not None
    data = [x for x in b.parts if x.part is Part.DATA]
    share = a.summary.median("data_share")
    assert len(data) == 1 and share is not None and data[0].ms == pytest.approx(share * b.step_ms, rel=0.01)
    shown = [worded_remedies(f) for f in a.findings]  # as the report words them
    cls = next(f for f in shown if f.id == "budget-class")
    assert cls.observation.count("data wait") == 1
    cost = next(f for f in shown if f.id == "budget-capture-cost")
    assert cost.title == "Run 1's capture slowed its steps by +23%"
    assert "of the same run (run 1" in cost.observation
