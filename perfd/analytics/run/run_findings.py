"""Findings (observation + evidence) and recommendations (prioritised, each tied to a finding) of
one run: one small analyzer per question, registered in :data:`RUN_ANALYZERS`.

The analyzers encode docs/design.md §2's playbook with the job's own numbers, and read the step
budget (perfd.analytics.breakdown.budget) for what the timers cannot see; remedies come from the one catalogue
(perfd.analytics.advice.remedies). Pure: they read a RunAnalysis (and the JobInfo for arguments) and return
plain dataclasses; decisions read typed values (exclusion kinds, budget parts), never perfd's own
sentences. A finding's words — its title, observation and the source of its figures — are made from its
facts where it is shown (perfd.report.finding_text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perfd.analytics import thresholds as th
from perfd.analytics.advice import budget_findings
from perfd.analytics.advice.plan import Plan
from perfd.analytics.advice.remedies import Framework, JobConfig
from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.breakdown.advice_registry import GRADE, PARTS
from perfd.analytics.breakdown.budget import Source, StepBudget
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.finding_types import (
    DataAction,
    DataLoading,
    Finding,
    Recommendation,
    Severity,
    StepSpan,
    order_findings,
)
from perfd.analytics.run.run_facts import (
    BubbleFacts,
    CadenceFacts,
    DataShareFacts,
    Divider,
    ExposedFacts,
    GradSyncFacts,
    ImbalanceFacts,
    JitterFacts,
    NextStepFacts,
    OutlierFacts,
    OutsideFacts,
    PpWaitFacts,
    RebalanceFacts,
    RunFiguresFacts,
    RunFinding,
    RunRecommendation,
    SlowerRank,
    SpreadFacts,
    StageSpreadFacts,
    StragglerFacts,
    UntimedFacts,
)
from perfd.analytics.run.run_figures import MIN_GRADE_STEPS
from perfd.analytics.run.run_grade import (
    CrosscheckFacts,
    CrosscheckRecommendation,
    MfuFacts,
    MfuFinding,
    MfuSaid,
    budget_class,
    explain_grade,
    grade_mfu,
)
from perfd.analytics.run.runs import FiguresFrom
from perfd.analytics.steps.pipeline import microbatches_for_bubble, rebalance_estimate
from perfd.analytics.steps.provenance import Cited
from perfd.analytics.steps.steady import Exclusion
from perfd.analytics.steps.stragglers import rank_order
from perfd.analytics.steps.untimed import names, untimed_groups
from perfd.analytics.steps.vocabulary import FRAMEWORK_VOCABULARIES, MEGATRON_VOCABULARY
from perfd.core.model import CPU, JobInfo
from perfd.core.record_json import unwritten

if TYPE_CHECKING:
    from perfd.analytics.run.run_result import RunAnalysis

BUBBLE_TARGET = th.BUBBLE_TARGET.value
GRAD_SYNC_SHARE = th.GRAD_SYNC_SHARE.value
JITTER_CV = th.JITTER_CV.value


@dataclass
class QuotingFinding(RunFinding):
    """A finding whose observation ends with sentences kept as codes and numbers (``quotes``: each a
    lead and a code, as a metric's source or an iteration's exclusion): they are worded where the
    finding is shown (perfd.report.build_report appends them to ``observation``, "; " between)."""

    quotes: tuple[tuple[str, Cited], ...] = field(default=(), metadata=unwritten())


@dataclass(frozen=True)
class RunContext:
    """What every run analyzer reads: the analysis, the job, the steady medians, and the step budget
    (from the capture that informs the job, else from the timers)."""

    a: RunAnalysis
    job: JobInfo
    med: Mapping[str, float | None]  # the summary's steady medians (RunSummary.medians)
    span: StepSpan
    budget: StepBudget | None
    framework: Framework
    config: JobConfig
    live: bool = True  # the job may still run (a capture can be taken now); False: a finished log


Out = tuple[list[Finding], list[Recommendation]]


def figures_span(a: RunAnalysis) -> StepSpan:
    """The steps a run's figures are over, naming their run where the job has had more than one."""
    runs = a.summary.runs
    ref = runs.reference
    if ref is not None:
        return StepSpan(first=ref.first_iteration, last=ref.last_iteration, n=ref.n_steady, run=ref.run,
                        reference=True)
    return a.steady.span(runs.current if runs.current > 1 else None)


def mfu_grade(c: RunContext) -> Out:
    """The run's MFU: why there is none, that too few steps give no grade, or its grade explained with
    the job's own measurements. Its words are the report's (perfd.report.grade_text)."""
    a, med, span, peak = c.a, c.med, c.span, c.a.peak
    mfu = med.get("mfu")
    if mfu is None:
        runs = a.summary.runs
        facts = MfuFacts(said=MfuSaid.NO_ITERATIONS if not a.iterations else MfuSaid.UNKNOWN)
        # the first iteration's MFU source says why (a code, quoted where the finding is shown)
        quoted = a.iterations[0].sources.get("mfu") if a.iterations else None
        if runs.figures is FiguresFrom.NONE:
            facts = MfuFacts(said=MfuSaid.RUNS, runs=runs)
        elif runs.reference is not None:  # the figures are an earlier run's: its digest is why
            facts = MfuFacts(said=MfuSaid.EARLIER_RUN, runs=runs)
        elif quoted is not None:
            facts = MfuFacts(said=MfuSaid.QUOTED, quoted=quoted)
        return [MfuFinding("mfu-absent", Severity.INFO, "", "", {}, "", steps=span, facts=facts)], []
    n = a.summary.n_steady
    if n < MIN_GRADE_STEPS:  # one steady step is no grade
        return [MfuFinding("mfu-too-few-steps", Severity.INFO, "", "",
                           {"mfu": mfu, "n_steady": n, "min_steps": MIN_GRADE_STEPS}, "",
                           steps=span, facts=MfuFacts(said=MfuSaid.TOO_FEW_STEPS, mfu=mfu, n_steady=n))], []
    grade = grade_mfu(mfu)
    lay = c.job.layout
    untimed = untimed_groups(c.job.framework, lay.tp, lay.cp, lay.ep)
    said = explain_grade(mfu, med.get("data_share"), med.get("comm_exposed_share"),
                         budget_class(c.budget), untimed, lay.world_size)
    conv, logged = a.mfu_convention, med.get("logged_tflops_per_gpu")
    facts = MfuFacts(said=MfuSaid.GRADED, mfu=mfu, tflops=med["model_tflops_per_gpu"],
                     peak_tflops=peak.peak_tflops, gpu_model=peak.gpu_model, dtype=peak.dtype,
                     of_ceiling=med.get("mfu_vs_measured_ceiling"),
                     ceiling_tflops=peak.measured_ceiling_tflops, explanation=said, convention=conv,
                     logged_tflops=logged)
    return [MfuFinding("mfu-grade", GRADE[grade].severity, "", "",
                       {"mfu": mfu, "model_tflops_per_gpu": med["model_tflops_per_gpu"],
                        "peak_tflops": peak.peak_tflops, "grade": grade.value,
                        "convention": conv.value if conv is not None else None,
                        "logged_tflops_per_gpu": logged}, "",
                       a.summary.bottleneck.cls.value, steps=span, facts=facts)], []


def tflops_crosscheck(c: RunContext) -> Out:
    a, med = c.a, c.med
    n_chk, n_bad = a.summary.tflops_check_n, a.summary.tflops_check_n_disagree
    if not n_chk:
        return [], []
    gap = a.summary.tflops_check_max_abs_gap
    facts = CrosscheckFacts(n_checked=n_chk, n_disagree=n_bad, max_gap=gap,
                            tflops=med.get("model_tflops_per_gpu"),
                            logged_tflops=med.get("logged_tflops_per_gpu"), formula=a.flops.formula,
                            framework=c.framework)
    # its words are the report's (perfd.report.grade_text)
    f = MfuFinding("tflops-crosscheck", Severity.INFO if facts.agrees else Severity.WARNING, "", "",
                   {"n_checked": n_chk, "n_disagree": n_bad, "max_abs_gap": gap}, "",
                   str(a.flops.source) if a.flops.source else "", steps=c.span, facts=facts)
    if facts.agrees:
        return [f], []
    return [f], [CrosscheckRecommendation("", "tflops-crosscheck", 0, "", "", None, facts=facts)]


def pipeline(c: RunContext) -> Out:
    a, job, med, span = c.a, c.job, c.med, c.span
    lay = job.layout
    pp = lay.pp
    idle_max, idle_min = med.get("pp_idle_max"), med.get("pp_idle_min")
    bubble, imb = med.get("pp_bubble_analytic"), med.get("pp_imbalance")
    m = lay.microbatches()
    if not (pp and pp > 1 and idle_max is not None and bubble is not None and imb is not None):
        return [], []
    f: list[Finding] = []
    r: list[Recommendation] = []
    light, heavy = med.get("pp_lighter_compute_ms"), med.get("pp_heavier_compute_ms")
    ev = {"pp": pp, "microbatches": m, "vpp": lay.vpp, "bubble_analytic": bubble,
          "idle_lighter_stage": idle_max, "idle_heavier_stage": idle_min, "imbalance": imb,
          "lighter_compute_ms": light, "heavier_compute_ms": heavy}
    if imb > th.PP_IMBALANCE_MIN.value and imb > bubble and light and heavy:
        minmax = bool(a.iterations) and a.iterations[-1].pp_idle_method == "minmax-pairing"
        f.append(RunFinding("pp-imbalance", Severity.WARNING, "", "", ev, "", steps=span,
                            facts=ImbalanceFacts(idle_lighter=idle_max, idle_heavier=idle_min, bubble=bubble,
                                                 pp=pp, microbatches=m, vpp=lay.vpp, imbalance=imb,
                                                 lighter_ms=light, heavier_ms=heavy, minmax=minmax)))
        r.append(RunRecommendation("", "pp-imbalance", 0, "", "", imb,
                                   facts=_rebalance(a, job, light, heavy)))
    if bubble > th.PP_BUBBLE_HIGH.value or (idle_max > th.PP_IDLE_HIGH.value and imb <= bubble):
        need = microbatches_for_bubble(pp, BUBBLE_TARGET, lay.vpp)
        v2 = (pp - 1) / (2 * m + pp - 1) if m else None
        said = BubbleFacts(bubble=bubble, idle_lighter=idle_max, pp=pp, microbatches=m, need=need, v2=v2)
        f.append(RunFinding("pp-bubble", Severity.WARNING, "", "", ev, "", steps=span, facts=said))
        r.append(RunRecommendation("", "pp-bubble", 0, "", "", bubble, facts=said))
    return f, r


def communication(c: RunContext) -> Out:
    a, job, med, span = c.a, c.job, c.med, c.span
    lay, args = job.layout, job.arguments
    total, dp_part, pp_part = (med.get("comm_exposed_share"), med.get("comm_exposed_dp_share"),
                               med.get("comm_exposed_pp_share"))
    if total is None:
        return [], []
    f: list[Finding] = []
    r: list[Recommendation] = []
    ev_c = {"exposed_total": total, "exposed_grad_sync": dp_part, "exposed_pp_p2p": pp_part,
            "method": a.iterations[-1].comm_method if a.iterations else None}
    if dp_part is not None and dp_part > GRAD_SYNC_SHARE:
        overlap = (c.framework is Framework.MEGATRON and args.get("overlap_grad_reduce") != "True")
        sync = GradSyncFacts(dp_share=dp_part, dp=lay.dp, overlap=overlap)
        f.append(RunFinding("comm-grad-sync", Severity.WARNING, "", "", ev_c, "", steps=span, facts=sync))
        r.append(RunRecommendation("", "comm-grad-sync", 0, "", "", dp_part, facts=sync))
    idle_max = med.get("pp_idle_max")
    if pp_part is not None and lay.pp and lay.pp > 1 and pp_part > th.PP_WAIT_SHARE.value:
        f.append(RunFinding("comm-pp-wait", Severity.INFO, "", "", ev_c, "",
                            steps=span, facts=PpWaitFacts(total=total, pp_share=pp_part, dp_share=dp_part,
                                              idle_lighter=idle_max)))
    elif total > bn.COMM_BOUND_SHARE and (dp_part is None or dp_part <= GRAD_SYNC_SHARE):
        f.append(RunFinding("comm-exposed", Severity.WARNING, "", "", ev_c, "",
                            steps=span, facts=ExposedFacts(total=total)))
    untimed = untimed_groups(c.job.framework, lay.tp, lay.cp, lay.ep)
    if untimed:  # what the exposed share leaves out, said once: never read as "communication is small"
        f.append(RunFinding("comm-untimed", Severity.INFO, "", "", {**ev_c, "untimed": names(untimed)}, "",
                            steps=span, facts=UntimedFacts(total=total, untimed=untimed)))
    return f, r


# The run's data-share finding (the report fits its action to the ranks' CPUs: training_report._with_cpu)
DATA_LOADING_FINDING = "data-loading"


def data_loading(c: RunContext) -> Out:
    ds = c.med.get("data_share")
    if ds is None:
        return [], []
    sev = (Severity.CRITICAL if ds > bn.DATA_BOUND_SHARE else Severity.WARNING if ds > bn.DATA_HEALTHY_SHARE
           else Severity.INFO)
    # The timer the job's step source names its data wait by (a hook job has no batch-generator).
    vocab = FRAMEWORK_VOCABULARIES.get(c.job.framework or "", MEGATRON_VOCABULARY)
    timer = vocab.data_wait[0] if vocab.data_wait else "data wait"
    said = DataShareFacts(share=ds, state=sev, timer=timer, across_ranks=vocab.across_ranks,
                          source=vocab.source)
    f = RunFinding(DATA_LOADING_FINDING, sev, "", "", {"data_share": ds}, "", steps=c.span, facts=said)
    if sev is Severity.INFO:
        return [f], []
    cpu_only = c.job.device == CPU
    cv = c.a.summary.step_time_cv
    # jitter with slow data loading: one action covers both; the loader's knobs are the framework's (a
    # CPU-only job's without pinned memory), named where the recommendation is worded
    said = dataclasses.replace(said, knobs_of=c.framework, cpu_only=cpu_only,
                               jitter_cv=cv if cv is not None and cv > JITTER_CV else None)
    dl = DataLoading(DataAction.LOAD_FASTER, cpu_only)  # CPUs unknown here: training_report._with_cpu
    # its action is the typed one's words (perfd.report.data_text.DATA_ACTIONS, where it is worded)
    return [f], [RunRecommendation("", DATA_LOADING_FINDING, 0, "", "", ds, data_loading=dl, facts=said)]


OUTSIDE_STEP_FINDING = "outside-step"


def outside_step(c: RunContext) -> Out:
    """Host time between the step hook's steps that is neither a stamped fetch nor an announced pause:
    the job's time, outside any step. perfd cannot name it; the user can, in one line."""
    share = c.med.get("outside_share")
    if share is None or share <= th.OUTSIDE_STEP_SHARE.value:
        return [], []
    said = OutsideFacts(share=share)
    f = RunFinding(OUTSIDE_STEP_FINDING, Severity.WARNING, "", "", {"outside_share": share}, "",
                   steps=c.span, facts=said)
    return [f], [RunRecommendation("", OUTSIDE_STEP_FINDING, 0, "", "", share, facts=said)]


def cadence_pauses(c: RunContext) -> Out:
    """The loop's own pauses at a cadence (an evaluation, a checkpoint save it does not announce): said as
    such, with the line that announces them (their time is then timed as what it is, live)."""
    fs: list[Finding] = []
    rs: list[Recommendation] = []
    run_s = c.a.run_seconds() or None
    for cad in c.a.summary.pauses:
        said = CadenceFacts(cadence=cad, run_s=run_s)
        fid = f"{cad.id}-pause"
        fs.append(RunFinding(fid, Severity.INFO, "", "", cad.to_json(), "", facts=said))
        rs.append(RunRecommendation("", fid, 0, "", "", cad.total_s / run_s if run_s else None, facts=said))
    return fs, rs


def jitter(c: RunContext) -> Out:
    cv = c.a.summary.step_time_cv
    if cv is None or cv <= JITTER_CV:
        return [], []
    slow = c.a.summary.slow_steps
    # Slow steps on a period are something on a timer; the time the slow steps take over their work's
    # is what removing their cause gives back (H100: a GPU timer's 4.4% against the loop's own +4.8%
    # without it; tests/gpu/varlen_jitter_live.py).
    said = JitterFacts(cv=cv, slow=slow, beat=slow is not None and slow.period_s is not None)
    f = RunFinding("step-jitter", Severity.WARNING, "", "",
                   {"step_time_cv": cv, "median_step_ms": c.med.get("step_time_ms"),
                    "slow_steps": slow.to_json() if slow else None}, "", steps=c.span, facts=said)
    ds = c.med.get("data_share")
    if ds is not None and ds > bn.DATA_HEALTHY_SHARE:
        return [f], []  # the data-loading recommendation covers it (data_loading)
    impact = slow.excess_share if slow is not None and slow.count else None
    return [f], [RunRecommendation("", "step-jitter", 0, "", "", impact, facts=said)]


def stragglers(c: RunContext) -> Out:
    a, med, span = c.a, c.med, c.span
    f: list[Finding] = []
    r: list[Recommendation] = []
    ratio = th.STRAGGLER_RATIO.value
    for rank in a.summary.straggler_persistent_ranks:
        frac = a.summary.straggler_flag_fraction.get(rank)
        fid = f"straggler-rank-{rank}"
        said = StragglerFacts(rank=rank, fraction=frac)
        f.append(RunFinding(fid, Severity.WARNING, "", "",
                            {"rank": rank, "flag_fraction": frac,
                             "rtt_ratio": med.get("straggler_rtt_ratio")}, "", steps=span, facts=said))
        r.append(RunRecommendation("", fid, 0, "", "", (med.get("straggler_rtt_ratio") or ratio) - 1,
                                   facts=said))
    anon = a.summary.straggler_compute_spread_fraction
    if anon is not None and anon >= th.STRAGGLER_PERSISTENT_FRACTION.value:
        spread = SpreadFacts(fraction=anon, framework=c.framework)
        f.append(RunFinding("straggler-spread", Severity.WARNING, "", "",
                            {"compute_spread": med.get("straggler_compute_spread"), "fraction": anon}, "",
                            steps=span, facts=spread))
        r.append(RunRecommendation("", "straggler-spread", 0, "", "", None, facts=spread))
    between = a.summary.straggler_between_stages_fraction
    if between:
        f.append(RunFinding("straggler-between-stages", Severity.INFO, "", "",
                            {"rtt_ratio": med.get("straggler_rtt_ratio"), "fraction": between}, "",
                            steps=span, facts=StageSpreadFacts(rtt_ratio=med.get("straggler_rtt_ratio"),
                                                   fraction=between)))
    return f, r


def step_budget(c: RunContext) -> Out:
    """The budget's own analyzers (perfd.analytics.advice.budget_findings) for what the timers cannot see:
    the kernels of a capture. The parts the timers measure (data, exposed communication, pipeline)
    are the timers' analyzers' above."""
    b = c.budget
    if b is not None and not b.has_kernels and Source.NCU in b.sources:
        # No timeline, an Nsight Compute capture's rows on the undivided compute: what they say to do
        ncu = budget_findings.BudgetContext(b, c.framework, b.basis, config=c.config)
        return budget_findings.analyze(ncu, (budget_findings.ncu_verdicts,))
    ctx = budget_context(c)
    return budget_findings.analyze(ctx) if ctx is not None else ([], [])


def budget_context(c: RunContext) -> budget_findings.BudgetContext | None:
    """What the budget's analyzers read for a run with a capture (None without one): the parts the
    timers' analyzers speak for (data, communication, the pipeline) are left to them."""
    b = c.budget
    if b is None or not b.has_kernels:
        return None
    staged = bool(c.job.layout.pp and c.job.layout.pp > 1)
    covered = {e.part for e in PARTS if e.timers_key is not None and c.med.get(e.timers_key) is not None
               and (staged or not e.stages)}
    ref = c.a.summary.runs.reference  # every step of the current run armed: the budget is that run's
    return budget_findings.BudgetContext(b, c.framework, b.basis, frozenset(covered), c.config,
                                         ref.run if ref is not None else None)


def next_step(c: RunContext) -> Out:
    """Where the timers leave the step undivided (no capture yet) and MFU is low: what would divide it.
    Never a check of something the run measured as fine: each candidate the timers ruled out is left
    out, and one they cannot see is named."""
    mfu, b = c.med.get("mfu"), c.budget
    if mfu is None or mfu >= th.MFU_GOOD.value or (b is not None and b.has_kernels):
        return [], []
    compute = b.get(Part.COMPUTE) if b is not None else None
    lay, h = c.job.layout, c.job.spec.hidden_size
    if c.live and b is not None and Source.NCU in b.sources:
        # A rank under ncu refuses a Kineto capture (one CUPTI client per process): the timeline has to
        # come from a rank that is not armed, or from the job before it was.
        divider = Divider.UNARMED_TIMELINE
    else:  # live: a capture now; a finished log: how to have a capture next time, and how to pass it
        divider = Divider.TIMELINE if c.live else Divider.NEXT_RUN
    said = NextStepFacts(divider=divider, job=c.a.job.name or "JOB",
                         hook_loop=c.framework.hooked,
                         compute_ms=compute.ms if compute is not None else None,
                         compute_share=compute.share if compute is not None else 0.0,
                         ideal_ms=b.ideal_ms if b is not None else None,
                         tp=lay.tp if lay.tp is not None and lay.tp > 1 else None,
                         hidden_size=h if h is not None and h <= 2048 else None)
    # No impact: the time is not yet divided, so no loss is measured; a remedy for a measured part
    # (the pipeline, data, communication) comes first.
    return [], [RunRecommendation("", "mfu-grade", 0, "", "", None, facts=said)]


def runs(c: RunContext) -> Out:
    """Where the job's figures come from when its current run cannot give them (every step armed)."""
    r = c.a.summary.runs
    if not r.elsewhere:
        return [], []
    return [RunFinding("run-figures", Severity.INFO, "", "", r.to_json(), "", steps=c.span,
                       facts=RunFiguresFacts(runs=r))], []


def outliers(c: RunContext) -> Out:
    slow = {k: c.a.steady.excluded[k] for k, kind in sorted(c.a.steady.kinds.items())
            if kind is Exclusion.OUTLIER}
    if not slow:
        return [], []
    return [QuotingFinding("steady-state-outliers", Severity.INFO, "", "", {}, "",
                           steps=c.span, facts=OutlierFacts(count=len(slow)),
                           quotes=tuple((f"iteration {k}: ", v) for k, v in slow.items()))], []


Analyzer = Callable[[RunContext], Out]
# The one registry of the run's questions, in the order their findings are listed before ordering.
RUN_ANALYZERS: tuple[Analyzer, ...] = (runs, mfu_grade, tflops_crosscheck, pipeline, communication,
                                       data_loading, outside_step, cadence_pauses, jitter, stragglers,
                                       step_budget, next_step, outliers)


def job_config(a: RunAnalysis, job: JobInfo) -> JobConfig:
    """What the job runs with, for the remedies: its framework and version, argument dump, missing
    packages, layout and batch sizes, the log's memory report and the GPU's memory."""
    lay = job.layout
    gpu_mib = a.job.gpu.memory_mib
    return budget_findings.config_of(job.framework, job.framework_version, job.arguments, job.packages,
                                     (lay.dp, lay.pp),
                                     (lay.micro_batch_size or _int_arg(job, "micro_batch_size"),
                                      lay.global_batch_size or _int_arg(job, "global_batch_size")),
                                     a.summary.memory_mib,
                                     float(gpu_mib) if gpu_mib is not None else None)


def _int_arg(job: JobInfo, dest: str) -> int | None:
    v = job.arguments.get(dest)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def job_plan(a: RunAnalysis, job: JobInfo, budget: StepBudget | None = None) -> Plan | None:
    """The remedies of a run with a capture as a plan (perfd.analytics.advice.plan); None without one."""
    ctx = budget_context(RunContext(a, job, a.summary.medians, a.steady.span(), budget,
                                    Framework.of(job.framework), a.config or job_config(a, job), False))
    return budget_findings.plan_of(ctx) if ctx is not None else None


def derive_findings(a: RunAnalysis, job: JobInfo, budget: StepBudget | None = None, live: bool = True
                    ) -> tuple[list[Finding], list[Recommendation]]:
    """All findings and recommendations for one run, recommendations ordered by impact."""
    ctx = RunContext(a, job, a.summary.medians, figures_span(a), budget, Framework.of(job.framework),
                     a.config or job_config(a, job), live)
    f: list[Finding] = []
    r: list[Recommendation] = []
    for analyzer in RUN_ANALYZERS:
        fs, rs = analyzer(ctx)
        f += fs
        r += rs
    return order_findings(f, r)


def _rebalance(a: RunAnalysis, job: JobInfo, light: float, heavy: float) -> RebalanceFacts:
    """What backs rebalancing the stages: the detector's slower rank, the logit GEMM in layers, and what
    moving layers would give (none where an uneven split is configured already)."""
    spec, lay = job.spec, job.layout
    slower: SlowerRank | None = None
    slow = [r for r in a.steady_values("straggler_rtt_max_rank") if r is not None]
    if slow and lay.pp:
        rank = max(set(slow), key=slow.count)
        stage = rank_order(lay, job.arguments).stage(rank)
        if stage is not None:
            slower = SlowerRank(rank=rank, stage=stage, pp=lay.pp, count=slow.count(rank), of=len(slow))
    logit_layers = None
    b = a.flops.breakdown
    if b and spec.num_layers:
        layers = spec.num_layers + (spec.mtp_num_layers or 0)
        per_layer = (b["mlp"] + b["attention_projections"] + b["core_attention"]) / layers
        if per_layer > 0:
            logit_layers = b["logits"] / per_layer
    facts = RebalanceFacts(slower=slower, padded_vocab=spec.padded_vocab_size, logit_layers=logit_layers)
    if job.arguments.get("decoder_last_pipeline_num_layers", "None") not in ("None", "") or \
            job.arguments.get("decoder_first_pipeline_num_layers", "None") not in ("None", ""):
        return dataclasses.replace(facts, uneven=True)
    est = rebalance_estimate(spec.num_layers, lay.pp, light, heavy)
    if est is None:
        return facts
    return dataclasses.replace(facts, per_layer_ms=est.per_layer_ms, layers_per_stage=est.layers_per_stage,
                               gap_ms=est.gap_ms, best_move=est.best_move,
                               new_heavier_ms=est.new_heavier_ms, lighter_ms=light, heavier_ms=heavy,
                               num_layers=spec.num_layers, pp=lay.pp or 0)
