"""ncu CSV exports → typed per-kernel rows, on the recorded H100 exports in tests/data/ncu (README
there says how each was made): ncu's own per-kernel summary of the same report is the reference;
missing sections stay absent; truncated and foreign input is refused or marked, never guessed."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from pathlib import Path

import pytest

from perfd.analytics.breakdown.ncu_kernels import KernelBound, NcuKernel, classify
from perfd.analytics.ncu.join import function_name
from perfd.capture import ncu_report as ncu
from perfd.capture.ncu_report import NcuParseError, parse_csv, parse_exports

DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"
FULL = (DATA / "h100_full_4gemm_details.csv").read_text()
MLP = (DATA / "h100_mlp_sol_details_5.csv").read_text()


def summary_averages(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """ncu --print-summary per-kernel: (kernel name, grid x block) -> {"section/metric": Average}, each
    table's columns cut where its dashed rule line puts them."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    kernel: tuple[str, str] | None = None
    section = ""
    lines = text.splitlines()
    head = re.compile(r"^  (\S+) (\(.*?\)x\(.*?\)), Device \d+, CC [\d.]+, Invocations (\d+)$")
    i = 0
    while i < len(lines):
        m = head.match(lines[i])
        if m:
            kernel = (m.group(1), m.group(2))
            out[kernel] = {"invocations": float(m.group(3))}
        elif lines[i].strip().startswith("Section: "):
            section = lines[i].strip()[len("Section: "):]
        elif kernel and re.match(r"^\s+-+( -+){4}$", lines[i]) and i + 2 < len(lines) \
                and "Metric Name" in lines[i + 1]:
            spans = [(mm.start(), mm.end()) for mm in re.finditer(r"-+", lines[i])]
            i += 3
            while i < len(lines) and not lines[i].strip().startswith("---"):
                cells = [lines[i][a:b + 1].strip() for a, b in spans]
                try:
                    out[kernel][f"{section}/{cells[0]}"] = float(cells[4].replace(",", ""))
                except (ValueError, IndexError):
                    pass
                i += 1
        i += 1
    return out


def test_details_page_grouped_as_ncus_own_summary():
    """The 4 launches group into ncu's 2 kernels (name, grid, block), and each field's mean is the
    'Average' ncu prints for it (to the summary's two decimals)."""
    rep = parse_csv(FULL)
    ref = summary_averages((DATA / "h100_full_4gemm_summary.txt").read_text())
    assert rep.pages == ("details",) and rep.launches == 4 and not rep.problems and not rep.truncated
    assert [(k.name, k.ids) for k in rep.kernels] == [
        ("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN", (0, 2)),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", (1, 3))]
    sol, occ, launch = "GPU Speed Of Light Throughput/", "Occupancy/", "Launch Statistics/"
    fields = {"compute_throughput": (sol + "Compute (SM) Throughput", 0.01),
              "memory_throughput": (sol + "Memory Throughput", 0.01),
              "dram_throughput": (sol + "DRAM Throughput", 0.01),
              "achieved_occupancy": (occ + "Achieved Occupancy", 0.01),
              "duration_ms": (sol + "Duration", 1.0),
              "sm_clock_hz": (sol + "SM Frequency", 1e9),
              "registers_per_thread": (launch + "Registers Per Thread", 1.0),
              "threads_per_block": (launch + "Block Size", 1.0),
              "warp_cycles_per_issue": ("Warp State Statistics/Warp Cycles Per Issued Instruction", 1.0)}
    assert len(ref) == 2
    for k in rep.kernels:
        avg = ref[(k.name, f"{k.grid}x{k.block}")]
        assert k.invocations == avg["invocations"] == 2
        for attr, (label, scale) in fields.items():
            assert getattr(k, attr) == pytest.approx(avg[label] * scale, abs=0.006 * scale), (k.name, attr)
    # the clocks ncu locked (its default clock control): base, where the job ran at up to 1.98 GHz
    assert rep.sm_clock_hz == pytest.approx(1.43e9, abs=0.01e9)
    # the sections that page has not (the stall chart and the pipe chart are raw-page only): absent
    assert all(k.tensor_pipe is None and k.stalls == () for k in rep.kernels)


@pytest.mark.parametrize(("compute", "memory", "bound"), [
    (0.59, 0.59, KernelBound.LATENCY),  # both under ncu's 60% latency bar
    (0.65, 0.70, KernelBound.BALANCED),  # over the bar, under 80%, within 10 points
    (0.61, 0.72, KernelBound.MEMORY),  # 11 points apart
    (0.85, 0.79, KernelBound.COMPUTE),  # a unit past 80% bounds the kernel
    (0.75, 0.81, KernelBound.MEMORY),
    (0.9, None, None), (None, 0.9, None),  # a missing input: no class, not a guess
])
def test_class_is_nvidias_solbottleneck_rule(compute, memory, bound):
    assert classify(compute, memory) is bound


def test_recorded_kernels_get_the_class_their_sol_says():
    rep = parse_csv(MLP)
    got = {function_name(k.name) + ("/add" if "add" in k.name else ""): k.bound for k in rep.kernels}
    assert got == {"vectorized_layer_norm_kernel": KernelBound.COMPUTE,  # SM 72.7%, memory 54.1%
                   "nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_bias_TNN": KernelBound.COMPUTE,
                   "vectorized_elementwise_kernel": KernelBound.BALANCED,  # GELU: 72.1% vs 73.7%
                   "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT": KernelBound.COMPUTE,
                   "vectorized_elementwise_kernel/add": KernelBound.MEMORY}  # the add: 15.0% vs 89.0%
    add = rep.kernels[-1]
    assert add.dram_throughput == pytest.approx(0.8902) and add.duration_ms == pytest.approx(0.06166)
    assert add.registers_per_thread == 34 and add.threads_per_block == 128 and add.grid == "(32768, 1, 1)"


def test_missing_sections_are_absent_not_zero():
    """The probe's first lines: SpeedOfLight's DRAM and SM frequency and memory throughput only."""
    rep = parse_csv((DATA / "h100_probe_sol_head.csv").read_text())
    (k,) = rep.kernels
    assert k.memory_throughput == pytest.approx(0.6109) and k.sm_clock_hz == pytest.approx(1.72e9)
    assert k.dram_clock_hz == pytest.approx(2.62e9)
    for attr in ("compute_throughput", "dram_throughput", "duration_ms", "achieved_occupancy",
                 "registers_per_thread", "tensor_pipe", "warp_cycles_per_issue"):
        assert getattr(k, attr) is None, attr
    assert k.bound is None and k.profiled_ms is None
    assert k.to_json()["compute_throughput"] is None


def test_truncated_export_keeps_the_whole_launches_and_says_so():
    rep = parse_csv((DATA / "h100_full_4gemm_details_truncated.csv").read_text())
    whole = {lid: k for k in parse_csv(FULL).kernels for lid in k.ids}
    assert rep.truncated
    assert any("ends inside a row" in p for p in rep.problems)
    assert any("launch 2 dropped" in p for p in rep.problems)
    assert [k.ids for k in rep.kernels] == [(0,), (1,)]
    # the launches it kept are read as in the whole file (launch 0's values are kernel 0's first)
    assert rep.kernels[1].registers_per_thread == whole[1].registers_per_thread
    assert rep.kernels[0].sm_clock_hz == whole[0].sm_clock_hz


@pytest.mark.parametrize(("text", "why"), [
    ((DATA / "h100_probe_console.txt").read_text(), "no ncu CSV header"),
    ("", "empty input"),
    ("a,b,c\n1,2,3\n", "no ncu CSV header"),
    ('"ID","Process ID","Kernel Name","Metric Name","Metric Value"\n', "no profiled kernel"),
    ('"ID","Process ID","Kernel Name","Metric Name","Metric Value"', "ends inside its header"),
    ('"ID","Process","Name"\n"0","1","k"\n', "no 'Kernel Name' column"),
])
def test_foreign_input_is_refused_with_the_reason(text, why):
    with pytest.raises(NcuParseError, match=why):
        parse_csv(text)


def test_console_lines_before_the_csv_are_skipped():
    """ncu prints ==PROF==/==WARNING== lines on the same stream when run with --csv while profiling."""
    rep = parse_csv("==PROF== Connected to process 1\n==WARNING== clocks\n" + MLP)
    assert rep.launches == 5


def test_unknown_units_and_bad_values_are_absent_and_said():
    text = MLP.replace("Duration,us,66.78", "Duration,furlong,66.78", 1)
    text = text.replace("Achieved Occupancy,%,88.36", "Achieved Occupancy,%,n/a", 1)
    assert text != MLP
    rep = parse_csv(text)
    k = rep.kernels[0]
    assert k.duration_ms is None and k.achieved_occupancy is None
    assert any("duration_ms in unit 'furlong'" in p for p in rep.problems)
    assert rep.kernels[1].duration_ms is not None  # one bad cell spoils nothing else
    bad_id = MLP.replace("\n0,", "\nzero,", 1)
    rep = parse_csv(bad_id)
    assert any("launch ID 'zero'" in p for p in rep.problems) and rep.launches == 5  # its other rows keep it


# --- the raw page (one column per metric) -----------------------------------------------------------
def raw_page(details: str, extra: dict[int, dict[str, tuple[str, str]]]) -> str:
    """The recorded details values laid out as ``ncu --import --csv --page raw`` lays them out (the
    metric names of perfd.capture.ncu_report.FIELDS, a units row under the header), plus ``extra``
    columns per launch."""
    rows = list(csv.DictReader(io.StringIO(details)))
    by_label = {(f.details[0][0], f.details[0][1]): f.raw[0] for f in ncu.FIELDS if f.details}
    launches: dict[int, dict[str, tuple[str, str]]] = {}
    ident: dict[int, dict[str, str]] = {}
    for r in rows:
        lid = int(r["ID"])
        ident.setdefault(lid, {k: r[k] for k in ncu._IDENTITY})
        raw = by_label.get((r["Section Name"], r["Metric Name"]))
        if raw:
            launches.setdefault(lid, {})[raw] = (r["Metric Unit"], r["Metric Value"])
    for lid, cols in extra.items():
        for name, unit_value in cols.items():
            launches.setdefault(lid, {})[name] = unit_value
    names = sorted({n for cols in launches.values() for n in cols})
    units = {n: next(cols[n][0] for cols in launches.values() if n in cols) for n in names}
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow([*ncu._IDENTITY, *names])
    w.writerow(["" for _ in ncu._IDENTITY] + [units[n] for n in names])
    for lid in sorted(launches):
        values = [launches[lid].get(n, ("", ""))[1] for n in names]
        w.writerow([ident[lid][k] for k in ncu._IDENTITY] + values)
    return out.getvalue()


STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
# What ncu's own rules say of these launches in the recorded details (CPIStall, HighPipeUtilization).
EXTRA = {0: {TENSOR: ("%", "93.8")}, 1: {TENSOR: ("%", "95.2"), STALL.format("barrier"): ("", "6.5")},
         3: {STALL.format("barrier"): ("", "6.5")}}


def test_raw_page_reads_as_the_details_page():
    raw = raw_page(FULL, EXTRA)
    a, b = parse_csv(FULL), parse_csv(raw)
    assert b.pages == ("raw",) and not b.problems
    assert [k.ids for k in a.kernels] == [k.ids for k in b.kernels]
    for ka, kb in zip(a.kernels, b.kernels, strict=True):
        for f in ncu.FIELDS:
            if f.details:
                assert getattr(kb, f.attr) == pytest.approx(getattr(ka, f.attr)), f.attr
    gemm0, gemm1 = b.kernels
    assert gemm0.tensor_pipe == pytest.approx(0.938) and gemm1.tensor_pipe == pytest.approx(0.952)
    # barrier: 6.5 of the 20.4 cycles between two issued instructions, "about 32.0%" as ncu says
    assert [(s.reason, s.cycles) for s in gemm1.stalls] == [("barrier", 6.5)]
    assert gemm1.stalls[0].share == pytest.approx(0.32, abs=0.002)
    both = parse_exports([FULL, raw])  # the two pages of one report merge by launch ID
    assert both.pages == ("details", "raw") and both.launches == 4
    assert both.kernels[1].stalls == gemm1.stalls and both.kernels[0].compute_throughput == \
        a.kernels[0].compute_throughput


def test_stalls_rank_by_cycles_and_leave_out_issuing():
    extra = {1: {STALL.format("barrier"): ("", "6.5"), STALL.format("long_scoreboard"): ("", "2.0"),
                 STALL.format("selected"): ("", "1.0"),  # the warp issuing: not a stall
                 STALL.format("barrier_not_issued"): ("", "9.0"),  # the same stall counted again
                 STALL.format("math_pipe_throttle"): ("", "4.1"), STALL.format("wait"): ("", "0.5"),
                 "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "88.0")}}
    b = parse_csv(raw_page(FULL, extra))
    k = next(k for k in b.kernels if 1 in k.ids)
    assert [s.reason for s in k.stalls] == ["barrier", "math_pipe_throttle", "long_scoreboard"]
    # launch 3 has no stall columns: the mean is over the launches that report them
    assert k.stalls[0].cycles == pytest.approx(6.5)
    # without the aggregate tensor column, the busiest tensor sub-pipe
    assert k.tensor_pipe == pytest.approx(0.88)


def test_since_keeps_the_launches_after_an_id():
    rep = parse_csv(FULL)
    assert [k.ids for k in rep.since(1).kernels] == [(0, 2), (1, 3)]
    assert [k.ids for k in rep.since(2).kernels] == [(1, 3)]
    assert rep.since(3).kernels == ()


def test_a_raw_page_without_its_units_row_keeps_the_percentages():
    """A percentage is one by its raw name; a duration without its unit cannot be scaled: absent."""
    lines = raw_page(FULL, EXTRA).splitlines(keepends=True)
    b = parse_csv(lines[0] + "".join(lines[2:]))
    k = b.kernels[0]
    assert k.compute_throughput == pytest.approx(parse_csv(FULL).kernels[0].compute_throughput)
    assert k.tensor_pipe == pytest.approx(0.938)
    assert k.duration_ms is None and any("duration_ms in unit ''" in p for p in b.problems)


def test_pages_spelling_a_launch_differently_still_merge_by_id():
    """The two pages of one report name a launch their own way (here: the raw page by its function
    only); the launch is the same, the fuller name is kept."""
    rows = list(csv.reader(io.StringIO(raw_page(MLP, {}))))
    kn = rows[0].index("Kernel Name")
    for r in rows[2:]:
        r[kn] = function_name(r[kn])
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    both = parse_exports([out.getvalue(), MLP])
    assert both.launches == 5 and not both.problems
    assert [k.name for k in both.kernels] == [k.name for k in parse_csv(MLP).kernels]


def test_the_real_megatron_range_parses_with_every_field_from_both_pages() -> None:
    """The range ncu took by rule on real Megatron-LM on the H100 (tests/gpu/ncu_megatron_rule.py,
    docs/evidence/ncu_h100): 40 launches profiled in one step, 12 kernels; the raw page's metric names
    (tensor pipe, warp stalls) are the ones ncu 2025.3.1 writes: every kernel has them."""
    data = Path(__file__).resolve().parents[1] / "data" / "ncu"
    both = parse_exports([(data / "h100_megatron_rank0_details.csv").read_text(),
                          (data / "h100_megatron_rank0_raw.csv").read_text()])
    assert both.launches == 40 and len(both.kernels) == 12
    for k in both.kernels:
        assert k.tensor_pipe is not None and len(k.stalls) == 3 and k.bound is not None
        # --clock-control none: the clocks the job ran at, not locked to base (1.43 GHz)
        assert k.sm_clock_hz is not None and k.sm_clock_hz > 1.7e9
    gemms = [k for k in both.kernels if k.name.startswith("nvjet")]
    assert gemms and max(k.tensor_pipe or 0.0 for k in gemms) > 0.5
    raw_only = parse_exports([(data / "h100_megatron_rank0_raw.csv").read_text()])
    assert [k.tensor_pipe for k in raw_only.kernels] == [k.tensor_pipe for k in both.kernels]


def test_the_parser_fills_exactly_the_kernels_measured_fields() -> None:
    measured = [f.name for f in dataclasses.fields(NcuKernel) if f.metadata.get("measured")]
    assert measured == [f.attr for f in ncu.FIELDS]  # to_json writes them in this order
