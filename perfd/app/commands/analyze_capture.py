"""`perfd analyze nsys FILE` and `perfd analyze trace FILE`: per-device breakdown of a capture."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from perfd.core import finite_json
from perfd.core.typed import obj, objs

# Framework's values (perfd.analytics.advice.remedies), named here so the parser loads no analytics.
FRAMEWORKS = ("pytorch", "hf_trainer", "lightning", "torchtitan", "megatron")

if TYPE_CHECKING:  # the analytics load where a capture is read, not where `perfd` builds its parser
    from perfd.analytics.breakdown.device_breakdown import CaptureAnalysis
    from perfd.analytics.breakdown.diagnosis import TimelineClass


def add_arguments(asub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    n = asub.add_parser("nsys", help="breakdown of an nsys capture (.nsys-rep or exported .sqlite)")
    n.add_argument("file")
    n.add_argument("--json", action="store_true", help="print JSON")
    n.add_argument("--check-sql", action="store_true",
                   help="also compute busy/NCCL with plain SQL over the export (the accuracy check)")
    t = asub.add_parser("trace", help="breakdown of a Kineto / Chrome trace (.json, .json.gz or .json.xz)")
    t.add_argument("file")
    t.add_argument("--json", action="store_true", help="print JSON")
    for p in (n, t):
        # What a live capture's analysis has from the job and a file alone does not: whose words the
        # remedies speak, and the unprofiled step the profiler's slowdown is brought back to.
        p.add_argument("--framework", choices=FRAMEWORKS, default="pytorch",
                       help="the job's framework, for the remedies' words (default: pytorch, a plain loop)")
        p.add_argument("--job-step-ms", type=float, metavar="MS",
                       help="the job's steady step time without the profiler (its own clock): a "
                            "budget the profiler slowed is brought back to it before any gain is modelled")
        p.add_argument("--job-step-sd-ms", type=float, metavar="MS",
                       help="the robust deviation of the job's steady steps on its own clock (1.4826 x "
                            "their median absolute deviation, as the aggregator reads it live): each "
                            "range is widened by how far a rerun of such a job moves")


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    step_ms = getattr(args, "job_step_ms", None)
    if step_ms is not None and not 0 < step_ms < 3_600_000:
        print(f"perfd: --job-step-ms {step_ms}: a step time in milliseconds, above 0", file=sys.stderr)
        return 2
    sd_ms = getattr(args, "job_step_sd_ms", None)
    if sd_ms is not None and not 0 <= sd_ms < 3_600_000:
        print(f"perfd: --job-step-sd-ms {sd_ms}: a deviation in milliseconds, 0 or above", file=sys.stderr)
        return 2
    if not path.is_file():
        print(f"perfd: no such file: {path}", file=sys.stderr)
        return 2
    try:
        if args.what == "nsys":
            from perfd.capture.nsys_sqlite import analyze_nsys, direct_sql_check

            analysis = analyze_nsys(path)
            out = analysis.to_json()
            if args.check_sql:
                sqlite = path if path.suffix == ".sqlite" else path.with_suffix(".sqlite")
                out["sql_check"] = direct_sql_check(sqlite)
        else:
            from perfd.capture.chrome_trace import analyze_chrome_trace

            analysis = analyze_chrome_trace(path)
            out = analysis.to_json()
    except Exception as exc:  # unreadable input: say what and where, no traceback
        print(f"perfd: cannot analyse {path}: {exc}", file=sys.stderr)
        return 1
    from perfd.analytics.advice.capture_findings import diagnose_capture
    from perfd.analytics.advice.remedies import Framework
    from perfd.analytics.breakdown.budget import TimerShares
    from perfd.report.capture_text import class_reason, diagnosis_json
    from perfd.report.grade_text import worded, worded_recommendation
    from perfd.report.job_facts_text import facts_text

    diag = diagnose_capture(analysis.devices, label=path.name, framework=Framework.of(args.framework),
                            timers=TimerShares(step_ms=step_ms, step_sd_ms=sd_ms))
    diag.findings = [worded(f) for f in diag.findings]  # as they read, printed and in the JSON
    diag.recommendations = [worded_recommendation(r) for r in diag.recommendations]
    out.update(diagnosis_json(diag))  # findings, recommendations, bottleneck, bottleneck_reason
    if args.json:
        sys.stdout.write(finite_json.dumps(out, indent=2))
        sys.stdout.write("\n")
        return 0
    for d in objs(out.get("devices")):
        print(f"device {d['device']}: span {d['span_ms']:.1f} ms, busy {d['busy_ms']:.1f}, idle "
              f"{d['idle_ms']:.1f}, compute {d['compute_ms']:.1f}, NCCL {d['comm_ms']:.1f} "
              f"(exposed {d['comm_exposed_ms']:.1f}), memcpy {d['memcpy_ms']:.1f}, "
              f"SendRecv {d['sendrecv_ms']:.1f} ms")
        cats = obj(d.get("categories"))
        if cats:
            shown = ", ".join(f"{c} {v:.0%}" for c, v in cats.items()
                              if isinstance(v, float | int) and v >= 0.01)
            print(f"    kernel time by category: {shown}")
        for k in objs(d.get("top_kernels"))[:5]:
            print(f"    {k['total_ms']:9.2f} ms  {k['count']:6d}x  {str(k['name'])[:90]}")
        facts = next((x.facts for x in analysis.devices if x.device == d["device"]), None)
        if facts is not None and facts_text(facts):
            print(f"    the job, by its trace: {facts_text(facts)}")
    print(f"\nbottleneck: {diag.bottleneck} — {class_reason(diag.basis)}")
    for f in diag.findings:
        print(f"  [{f.severity}] {f.title}\n      {f.observation}")
    for r in diag.recommendations:
        print(f"  {r.priority}. {r.action}" + (f" ({r.detail})" if r.detail else ""))
    return 0


def timeline_class(path: str, steps: int | None = None, forced: bool = False) -> TimelineClass:
    """The class a capture file's timeline supports and the breakdown of the device that decided it
    (what a live capture gives the job's analysis). ``steps``: the iterations it holds (None: the
    run's analysis infers them from its steady step time); ``forced``: read against the job even where
    it is another job's (perfd.analytics.breakdown.capture_match)."""
    p = Path(path)
    if p.suffix in (".nsys-rep", ".sqlite"):
        from perfd.capture.nsys_sqlite import analyze_nsys

        return timeline_of(p.name, analyze_nsys(p), steps, forced)
    from perfd.capture.chrome_trace import analyze_chrome_trace

    return timeline_of(p.name, analyze_chrome_trace(p), steps, forced)


def timeline_of(name: str, analysis: CaptureAnalysis, steps: int | None = None,
                forced: bool = False) -> TimelineClass:
    """timeline_class of a capture already analysed (``name``: its file's): the analysis is most of the
    cost (seconds for a Megatron-LM step), the class a few milliseconds more."""
    from perfd.analytics.advice.capture_findings import diagnose_capture
    from perfd.analytics.breakdown.diagnosis import TimelineClass

    d = diagnose_capture(analysis.devices, label=name, iterations=steps)
    decided = (max(d.budgets, key=lambda k: d.budgets[k].step_ms) if d.budgets else None)
    device = next((x for x in analysis.devices if x.device == decided), None)
    return TimelineClass(d.bottleneck, d.basis, f"capture {name}", device, steps, name,
                         devices=analysis.devices, forced=forced)
