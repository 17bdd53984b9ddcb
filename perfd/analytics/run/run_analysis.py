"""Analysis of one training run, whatever its step source (Megatron-LM's log, the step hook,
torchtitan's log): per-iteration metrics, steady-state summary, findings. Each source's records
are read through its vocabulary (perfd.analytics.steps.vocabulary.Vocabulary), declared once there.

``analyze_run(job, records)`` is pure: it takes what the log parser produced (JobInfo and the
StepRecords) and returns a RunAnalysis. Every number carries its source; a number whose inputs
are missing is None (JSON null) with the reason, never 0.
"""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from perfd.analytics.breakdown import bottleneck as bn
from perfd.analytics.breakdown.capture_match import CAPTURE_COST_FINDING, CaptureMatch, finding, job_facts
from perfd.analytics.breakdown.capture_match import check as check_capture
from perfd.analytics.breakdown.diagnosis import StepShares, TimelineClass, classify_job
from perfd.analytics.breakdown.job_budget import job_budget
from perfd.analytics.common import finite, timer_max
from perfd.analytics.incidents.cadence import PauseSighting, name_part, part_seconds
from perfd.analytics.run.run_figures import arming_of, figures_of, goodput_costs, with_runs
from perfd.analytics.run.run_findings import derive_findings, job_config, job_plan
from perfd.analytics.run.run_incidents import mark_incidents, step_work, straggler_flags
from perfd.analytics.run.run_result import RunAnalysis, digest
from perfd.analytics.run.run_summary import (
    CaptureDisturbances,
    job_block,
    steady_medians,
    step_shares,
    summarize,
)
from perfd.analytics.run.runs import MAX_DIGESTS, RunDigest, split_runs
from perfd.analytics.steps.flops import (
    FORMULA_6N,
    FlopsResult,
    MfuConvention,
    flops_split,
    mfu_convention,
    model_flops,
    record_flops,
)
from perfd.analytics.steps.goodput import (
    PAUSE_BEFORE_TIMERS,
    SpanColumns,
    StepSpan,
    job_goodput,
    phase_seconds,
)
from perfd.analytics.steps.gpus import PeakResult, peak_tflops
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.metrics import (
    crosscheck_tflops,
    data_share,
    exposed_comm,
    logged_throughput_source,
    mfu,
    outside_share,
    throughput_per_gpu,
)
from perfd.analytics.steps.pipeline import analytic_bubble, stage_idle
from perfd.analytics.steps.provenance import Cited, Code, Measured, cite
from perfd.analytics.steps.steady import steady_state_of
from perfd.analytics.steps.stragglers import (
    RankOrder,
    StragglerResult,
    detect,
    persistent,
    rank_order,
)
from perfd.analytics.steps.untimed import untimed_groups
from perfd.analytics.steps.vocabulary import FRAMEWORK_VOCABULARIES, MEGATRON_VOCABULARY, vocabulary_of
from perfd.analytics.steps.windows import robust_sd
from perfd.core import catalog
from perfd.core.dtypes import normalize_dtype
from perfd.core.model import CPU, HOOK_IN_STEP_FIELD, JobInfo, ParallelLayout, StepRecord

# The values of Megatron-LM's memory report (``[Rank r] (after N iterations) memory (MB) | ...``) the
# analysis keeps the largest of: what a remedy that costs memory (a larger micro-batch) is read against
# ("allocated" between steps is the state the step keeps: weights, gradients, optimizer state).
MEMORY_KEYS: tuple[str, ...] = ("allocated", "max allocated", "max reserved")


# Per-iteration metrics summarised as medians over the steady state: the catalog's summary metrics
# and the internal fields the findings need.
SUMMARY_METRICS: tuple[str, ...] = (
    *(m.attr for m in catalog.job_metrics(catalog.SUMMARY) if m.attr),
    *(f.name for f in dataclasses.fields(IterationResult) if f.metadata.get("summary")),
)


def _world_size(lay: ParallelLayout) -> int | None:
    if lay.world_size is not None:
        return lay.world_size
    if None not in (lay.tp, lay.pp, lay.dp, lay.cp):
        assert lay.tp and lay.pp and lay.dp and lay.cp
        return lay.tp * lay.pp * lay.dp * lay.cp
    return None


def _microbatches(lay: ParallelLayout, gbs: int | None) -> int | None:
    """Micro-batches per iteration per DP replica for a given global batch."""
    if gbs is None or gbs == lay.global_batch_size:
        return lay.microbatches()
    if lay.micro_batch_size and lay.dp and gbs % (lay.micro_batch_size * lay.dp) == 0:
        return gbs // (lay.micro_batch_size * lay.dp)
    return None


def resolve_dtype(job: JobInfo, dtype: str | None) -> tuple[str | None, Cited]:
    """Training dtype and where it comes from: the argument, else the model spec, else Megatron's
    --bf16/--fp16/--fp8."""
    if dtype is not None:
        return normalize_dtype(dtype), cite(Code.DTYPE_ARGUMENT)
    if job.spec.dtype is not None:
        return normalize_dtype(job.spec.dtype), cite(Code.DTYPE_MODEL_SPEC)
    args = job.arguments
    fp8 = args.get("fp8")
    if fp8 is not None and fp8.strip() not in ("None", "False", ""):
        return "fp8", cite(Code.DTYPE_FLAG, "fp8")
    if args.get("bf16") == "True":
        return "bf16", cite(Code.DTYPE_FLAG, "bf16")
    if args.get("fp16") == "True":
        return "fp16", cite(Code.DTYPE_FLAG, "fp16")
    if args.get("bf16") == "False" and args.get("fp16") == "False":
        return "fp32", cite(Code.DTYPE_NO_FLAG)
    return None, cite(Code.UNKNOWN)


@dataclass
class AnalysisMemo:
    """Per-iteration work kept from one analysis of a growing run to the next (the aggregator keeps
    one per job): an iteration whose record is the *same object* as last time (or an equal one: a
    copy sent again), under the same job context, is not computed again, so a new iteration costs
    its own work — the per-rank straggler detection, exposed communication and stage idle — not a
    re-run over the history. What depends
    on the whole run (steady state, incidents, the class with GPM and the timeline, the summary) is
    still derived from every iteration, from these results. Plain data owned by the caller; the
    analysis stays a function of its inputs (the same result with or without a memo: tested)."""

    key: tuple[object, ...] | None = None  # the job context the entries were computed under
    entries: dict[int, tuple[StepRecord, IterationResult, StragglerResult]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    # The last analysis' rows, to start the next one from: rows whose records are still held, in
    # the same order, are taken over as a block rather than appended again one field at a time
    # (at 5,000 held iterations that rebuild was ~0.5 s per refresh).
    run: _KeptRun | None = None


@dataclass
class _KeptRun:
    classify: tuple[object, ...]  # what each row's class also depends on (GPM, the timeline)
    records: list[StepRecord]  # the records of the table's rows, in row order
    table: Table[IterationResult]  # shared with the analysis returned: never changed, only sliced
    disturbed: array[int]
    marked: list[int]  # rows given an incident_lost_ms by that analysis


@dataclass
class _Context:
    """What every iteration's metrics depend on besides its record."""

    job: JobInfo
    world: int | None
    peak: PeakResult
    ranks: RankOrder
    flops_cache: dict[int | None, FlopsResult]


def _field_ms(rec: StepRecord, key: str) -> float | None:
    """A record's field in ms (fields are text as the source gave them), None when absent or not a
    finite number."""
    text = rec.fields.get(key)
    if text is None:
        return None
    try:
        return finite(float(text))
    except ValueError:
        return None


def _iteration(rec: StepRecord, ctx: _Context) -> tuple[IterationResult, StragglerResult]:
    """The metrics of one record that need only the record and the job (see AnalysisMemo)."""
    job, lay, world, peak, ranks, flops_cache = (ctx.job, ctx.job.layout, ctx.world, ctx.peak, ctx.ranks,
                                                 ctx.flops_cache)
    it = IterationResult(rec.iteration, end_time=finite(rec.end_time),
                         step_time_ms=finite(rec.step_time_ms),
                         logged_tflops_per_gpu=finite(rec.logged_tflops_per_gpu),
                         lm_loss=finite(rec.lm_loss))
    srcs = it.sources
    vocab = vocabulary_of(rec)
    srcs["step_time_ms"] = cite(Code.RECORD, rec.source) if rec.source else cite(Code.STEP_TIME, vocab.source)
    srcs["lm_loss"] = cite(Code.LOSS, vocab.source) if it.lm_loss is not None else cite(Code.NO_LOSS)
    srcs["logged_tflops_per_gpu"] = (cite(Code.QUOTED, logged_throughput_source(job.framework))
                                     if it.logged_tflops_per_gpu is not None
                                     else cite(vocab.throughput_absent))

    # Throughput, MFU, cross-check. FLOPs: what the record states (the step hook's flops_per_step
    # or tokens_per_step), else the job's formula for the iteration's global batch.
    gbs = rec.global_batch_size if rec.global_batch_size is not None else lay.global_batch_size
    stated = record_flops(rec.tokens_per_step, rec.flops_per_step, job.spec, job.framework_version,
                          job.framework)
    if stated is not None:
        fl = stated
    else:
        if gbs not in flops_cache:
            flops_cache[gbs] = model_flops(job.spec, gbs, job.framework_version, job.framework)
        fl = flops_cache[gbs]
    why = fl.why()
    tput = Measured.absent_as(why) if why is not None else Measured.absent(Code.FLOPS_UNKNOWN)
    if fl.available and fl.formula != FORMULA_6N:
        tput = throughput_per_gpu(fl.flops_per_iteration, it.step_time_ms, world, fl.source)
    if tput.value is None and it.logged_tflops_per_gpu is not None:
        tput = Measured(it.logged_tflops_per_gpu, cite(Code.THROUGHPUT_LOGGED, job.framework, tput.cite))
    if tput.value is None and fl.available and fl.formula == FORMULA_6N:
        tput = throughput_per_gpu(fl.flops_per_iteration, it.step_time_ms, world, fl.source)
    it.model_tflops_per_gpu = tput.value
    srcs["model_tflops_per_gpu"] = srcs["tflops_rel_gap"] = tput.cite
    if tput.cite.code is Code.THROUGHPUT:  # perfd's own count: checked against the logged figure
        chk = crosscheck_tflops(tput.value, it.logged_tflops_per_gpu, job.framework)
        it.tflops_rel_gap, it.tflops_check_ok = chk.rel_gap, chk.agrees
    m = mfu(tput, peak)
    it.mfu = m.value
    srcs["mfu"] = m.cite
    if tput.value is not None and peak.measured_ceiling_tflops:
        it.mfu_vs_measured_ceiling = tput.value / peak.measured_ceiling_tflops

    d = data_share(rec)
    it.data_share = d.value
    srcs["data_share"] = d.cite
    o = outside_share(rec)
    it.outside_share = o.value
    srcs["outside_share"] = o.cite
    it.in_step_ms = _field_ms(rec, HOOK_IN_STEP_FIELD)
    if vocab.optimizer:
        it.optimizer_ms = timer_max(rec.timers.get(vocab.optimizer[0]))

    comm = exposed_comm(rec)
    it.comm_exposed_share = comm.total.value
    it.comm_exposed_dp_share = comm.grad_sync.value
    it.comm_exposed_pp_share = comm.pp.value
    it.comm_method = comm.method
    srcs["comm_exposed_share"] = comm.total.cite
    srcs["comm_exposed_dp_share"] = comm.grad_sync.cite
    srcs["comm_exposed_pp_share"] = comm.pp.cite

    bubble = analytic_bubble(lay.pp, _microbatches(lay, gbs), lay.vpp)
    idle = stage_idle(rec, lay.pp, bubble)
    it.pp_bubble_analytic = bubble.value
    it.pp_idle_max, it.pp_idle_min = idle.idle_max.value, idle.idle_min.value
    it.pp_imbalance = idle.imbalance.value
    it.pp_lighter_compute_ms, it.pp_heavier_compute_ms = idle.lighter_compute_ms, idle.heavier_compute_ms
    it.pp_idle_method = idle.method
    srcs["pp_bubble_analytic"] = bubble.cite
    srcs["pp_idle_max"] = idle.idle_max.cite
    srcs["pp_idle_min"] = idle.idle_min.cite
    srcs["pp_imbalance"] = idle.imbalance.cite

    st = detect(rec, ranks)
    it.straggler_rtt_ratio = st.rtt_ratio
    it.straggler_rtt_max_rank, it.straggler_rtt_min_rank = st.rtt_max_rank, st.rtt_min_rank
    it.straggler_between_stages = st.line_between_stages
    it.straggler_compute_spread = st.compute_spread
    it.straggler_compute_spread_flagged = st.compute_spread_flagged
    it.straggler_candidate_ranks = st.flagged_ranks
    it.straggler_rank_compute_ratio = dict(st.per_rank_ratio)
    it.straggler_notes = list(st.notes)
    srcs["straggler"] = (cite(Code.STRAGGLER_LINE) if rec.straggler
                         else cite(Code.NO_STRAGGLER_LINE, vocab.source, cite(vocab.straggler_absent)))
    srcs["straggler_rtt_ratio"] = srcs["straggler"]
    return it, st



def analyze_run(
    job: JobInfo,
    records: list[StepRecord],
    gpu_name: str | None = None,
    peak_tflops: float | None = None,
    dtype: str | None = None,
    *,
    job_name: str | None = None,
    gpm: bn.GpmReading | None = None,
    timeline: TimelineClass | None = None,
    memo: AnalysisMemo | None = None,
    gpm_when: bn.GpmWhen = bn.GpmWhen.STEPPING,
    new_normal_at: int | None = None,
    live: bool = True,
    earlier: Sequence[RunDigest] = (),
    run: int | None = None,
    pause_sightings: Sequence[PauseSighting] = (),
) -> RunAnalysis:
    """Analyse a run's step records (any order within a run; one record per logged iteration).
    Records holding several runs (a record marked ``first_of_run`` after others begins one: a log
    with a restart appended) are split there: the analysis is of the last run, each earlier one
    digested (perfd.analytics.run.runs), as the live aggregator does when a new run replaces its
    records. ``earlier``: the digests of runs before these records (the aggregator keeps them).
    ``memo``: keep per-iteration work for the next analysis of the same, grown run.
    ``new_normal_at``: the iteration from which a lasting shift's level is the new normal
    (perfd.analytics.steps.changepoint). ``live=False``: a finished log (its advice is for the next run).
    ``pause_sightings``: what the aggregator saw of the ranks between steps (which work the loop's own
    pauses at a cadence were: perfd.analytics.incidents.cadence)."""
    done = list(earlier)
    segments = split_runs(records)
    for seg in segments[:-1]:  # earlier runs in the records given: each digested, in order
        past = RunBuilder(job, gpu_name, peak_tflops, dtype, gpm=gpm, timeline=None, gpm_when=gpm_when,
                          live=live, earlier=done)
        for rec in sorted(seg, key=lambda r: r.iteration):
            past.add(rec)
        done.append(digest(past.finish(job_name), past.run))
    builder = RunBuilder(job, gpu_name, peak_tflops, dtype, gpm=gpm, timeline=timeline, memo=memo,
                         gpm_when=gpm_when, new_normal_at=new_normal_at, live=live, earlier=done,
                         run=run if len(segments) == 1 else None, pause_sightings=pause_sightings)
    ordered = sorted(segments[-1], key=lambda r: r.iteration)
    for rec in ordered[builder.resume(ordered):]:
        builder.add(rec)
    return builder.finish(job_name)


class RunBuilder:
    """analyze_run in two steps, for a run too long to hold as records: ``add`` each record as it
    is parsed (its per-iteration metrics are computed then, in compact columns, and the record can
    go), ``finish`` for what needs the whole run (steady state, incidents, summary, findings).
    Records may come in any order; the result is analyze_run's over the same records."""

    def __init__(self, job: JobInfo, gpu_name: str | None = None, peak_override: float | None = None,
                 dtype: str | None = None, *, gpm: bn.GpmReading | None = None,
                 timeline: TimelineClass | None = None, memo: AnalysisMemo | None = None,
                 gpm_when: bn.GpmWhen = bn.GpmWhen.STEPPING, new_normal_at: int | None = None,
                 live: bool = True, earlier: Sequence[RunDigest] = (), run: int | None = None,
                 pause_sightings: Sequence[PauseSighting] = ()) -> None:
        lay = job.layout
        # What the aggregator saw of the ranks while the job was between steps: which work the loop's
        # own pauses at a cadence were (perfd.analytics.incidents.cadence.name_part)
        self.pause_sightings = tuple(pause_sightings)
        self.earlier = tuple(earlier)[-MAX_DIGESTS:]  # the job's runs before this one
        # this run's number in the job (the aggregator counts them: the digests it keeps are bounded)
        self.run = run if run is not None else (earlier[-1].run + 1) if earlier else 1
        self.job, self.gpu_name, self.gpm, self.timeline, self.memo = job, gpu_name, gpm, timeline, memo
        self.live = live
        self.new_normal_at = new_normal_at
        self.gpm_when = gpm_when
        self.canon_dtype, self.dtype_src = resolve_dtype(job, dtype)
        peak = peak_tflops(gpu_name, self.canon_dtype, peak_override)
        if job.device == CPU and peak_override is None:  # the GPU is not a missing input: there is none
            peak = dataclasses.replace(peak, peak_tflops=None, source=None, gpu_model=None,
                                       measured_ceiling_tflops=None,
                                       reason=cite(Code.PEAK_CPU_ONLY))  # said instead of "GPU name unknown"
        self.flops_job = model_flops(job.spec, lay.global_batch_size, job.framework_version, job.framework)
        # the GEMMs' and core attention's shares of the count, for the budget's math parts
        self.flops_split = flops_split(self.flops_job, job.spec, job.framework_version, job.framework)
        self.ctx = _Context(job, _world_size(lay), peak, rank_order(lay, job.arguments),
                            {lay.global_batch_size: self.flops_job})
        # What the class' step shares say beside the numbers: the collectives the timers cannot see,
        # and the job's own name for its data wait (a hook job has no batch-generator).
        vocab = FRAMEWORK_VOCABULARIES.get(job.framework or "", MEGATRON_VOCABULARY)
        self.shares_of = StepShares(untimed=untimed_groups(job.framework, lay.tp, lay.cp, lay.ep),
                                    data_timer=vocab.data_wait[0] if vocab.data_wait else "data wait",
                                    cpu_only=job.device == CPU)
        key = (job, gpu_name, peak_override, dtype)
        if memo is not None and memo.key != key:
            memo.key, memo.entries, memo.run = key, {}, None
        # With a memo the rows' objects are held by it anyway: no compression, it only costs time.
        self.table: Table[IterationResult] = Table(IterationResult, key="iteration", pack=memo is None)
        self.disturbed = array("b")  # per row: a perfd capture touched the iteration
        self.armed = array("b")  # per row: its rank ran armed for a capture (perfd.core.armed)
        self.first: tuple[int, str] | None = None  # (iteration, job) of the earliest record
        self.in_order = True
        self.present: set[int] = set()  # iterations seen, kept only to evict a memo's stale entries
        self.records: list[StepRecord] | None = [] if memo is not None else None  # row order
        self.spans = SpanColumns()  # what goodput reads of each record
        self.memory_mib: dict[str, float] = {}  # the largest of each memory report value, any rank
        # (tokens, FLOPs) per step the last record stated: how the job's model FLOPs were counted
        self.work: tuple[float | None, float | None] = (None, None)

    def resume(self, ordered: Sequence[StepRecord]) -> int:
        """Take over the memo's last rows that ``ordered`` (sorted by iteration) starts with — the
        same record objects in the same order, under the same context — and say how many of
        ``ordered`` they cover; ``add`` the rest. 0 on a fresh builder or when nothing matches."""
        memo = self.memo
        kept = memo.run if memo is not None else None
        classify = (self.gpm, self.timeline, self.gpm_when)
        if kept is None or len(self.table) or not ordered or kept.classify != classify:
            return 0
        prev = kept.records
        k = bisect_left([r.iteration for r in prev], ordered[0].iteration)  # evicted rows lead
        m = 0
        while k + m < len(prev) and m < len(ordered) and prev[k + m] is ordered[m]:
            m += 1
        if m == 0:
            return 0
        self.table = kept.table.slice(k, k + m)
        self.disturbed = kept.disturbed[k:k + m]
        self.armed = array("b", (r.armed for r in ordered[:m]))
        for i in kept.marked:  # finish marks the incidents anew
            if k <= i < k + m:
                self.table.put(i - k, incident_lost_ms=None)
        self.first = (ordered[0].iteration, ordered[0].job)
        self.present.update(r.iteration for r in ordered[:m])
        self.records = list(ordered[:m])
        for rec in ordered[:m]:
            self._span(rec)
        memo.hits += m  # type: ignore[union-attr]
        return m

    def _span(self, rec: StepRecord) -> None:
        self.work = (rec.tokens_per_step, rec.flops_per_step)
        for report in rec.memory_mb.values():
            for key in MEMORY_KEYS:
                v = finite(report.get(key))
                if v is not None and v >= 0 and v > self.memory_mib.get(key, -1.0):
                    self.memory_mib[key] = v
        end, step = finite(rec.end_time), finite(rec.step_time_ms)
        if end is not None and step is not None and step >= 0:
            self.spans.add(StepSpan(rec.iteration, end, step / 1e3, max(1, rec.interval or 1),
                                    phase_seconds(rec.timers), rec.first_of_run,
                                    phase_seconds(rec.timers, PAUSE_BEFORE_TIMERS), rec.armed))

    def add(self, rec: StepRecord) -> None:
        memo, lay = self.memo, self.job.layout
        self._span(rec)
        kept = memo.entries.get(rec.iteration) if memo is not None else None
        # The same record, or an equal one: a copy sent again (an engine root hands an iteration's
        # fold on anew when a shard's partial is redelivered), whose metrics are the same
        if kept is not None and (kept[0] is rec or kept[0] == rec):
            if kept[0] is not rec:  # held from now on: the next analysis resumes over it
                memo.entries[rec.iteration] = (rec, kept[1], kept[2])  # type: ignore[union-attr]
            it = dataclasses.replace(kept[1])  # a copy: the lines below set its fields
            memo.hits += 1  # type: ignore[union-attr]
        else:
            base, st = _iteration(rec, self.ctx)
            if memo is not None:
                memo.entries[rec.iteration] = (rec, base, st)
                memo.misses += 1
            it = dataclasses.replace(base)
        if memo is not None:
            self.present.add(rec.iteration)
        shares = step_shares(it.data_share, it.comm_exposed_share, it.comm_exposed_dp_share, lay.pp,
                             it.pp_idle_max, it.pp_bubble_analytic, it.mfu, self.shares_of)
        it.bottleneck = classify_job(shares, self.gpm, self.timeline, self.gpm_when).cls.value
        if self.first is None or rec.iteration < self.first[0]:
            self.first = (rec.iteration, rec.job)
        n = len(self.table)
        if n and rec.iteration < self.table.get(n - 1, "iteration"):
            self.in_order = False
        it.armed = rec.armed
        self.table.append(it)
        self.disturbed.append(rec.disturbed_by_capture)
        self.armed.append(rec.armed)
        if self.records is not None:
            self.records.append(rec)

    def _convention(self, med: Mapping[str, object]) -> MfuConvention | None:
        """How the job's model FLOPs were counted, the MFU's typed provenance: the count the records
        state or imply (the step hook's), else the job's formula, else the framework's logged throughput
        (what the MFU then divides: perfd.analytics.steps.mfu)."""
        job = self.job
        fl = record_flops(*self.work, job.spec, job.framework_version, job.framework) or self.flops_job
        conv = mfu_convention(fl.formula if fl.available else None, job.spec)
        if conv is None and med.get("logged_tflops_per_gpu") is not None \
                and med.get("model_tflops_per_gpu") is not None:
            return MfuConvention.LOGGED
        return conv

    def _match(self, med: Mapping[str, object]) -> CaptureMatch | None:
        """Whether the timeline's capture is of this job (perfd.analytics.breakdown.capture_match)."""
        tl = self.timeline
        if tl is None or tl.device is None:
            return None
        facts = job_facts(self.job, med, self.ctx.peak.peak_tflops, self.ctx.world)
        devices = tl.devices or (tl.device,)
        return check_capture(tl.capture_id or tl.source, devices, facts,
                             float(tl.iterations) if tl.iterations else None)

    def finish(self, job_name: str | None = None) -> RunAnalysis:
        memo, lay, ctx = self.memo, self.job.layout, self.ctx
        if memo is not None and len(memo.entries) > len(self.present):  # evicted iterations leave
            for i in [i for i in memo.entries if i not in self.present]:
                del memo.entries[i]
        table, disturbed, armed = self.table, self.disturbed, self.armed
        if not self.in_order:  # a stable sort, as sorting the records was
            order = sorted(range(len(table)), key=lambda i: table.get(i, "iteration"))
            table, disturbed = table.take(order), array("b", (disturbed[i] for i in order))
            armed = array("b", (armed[i] for i in order))
        steps_col = list(table.column("step_time_ms"))
        work = step_work(steps_col, list(table.column("model_tflops_per_gpu")))
        steady = steady_state_of(array("q", table.column("iteration")), steps_col, disturbed, work, armed)
        for i, iteration in enumerate(table.column("iteration")):
            table.put(i, steady_state=steady.steady.get(iteration, False),
                      excluded_reason=steady.excluded.get(iteration))
        detection = mark_incidents(table, disturbed, steady, ctx.world, self.new_normal_at, work,
                                   self.job.device == CPU)
        incidents = detection.incidents
        pauses = tuple(name_part(c, self.pause_sightings) for c in detection.pauses)
        steady_rows = array("q", (i for i, s in enumerate(table.column("steady_state")) if s))
        pers = persistent(straggler_flags(table, i) for i in steady_rows)
        med = steady_medians(table, steady_rows, SUMMARY_METRICS)
        runs = figures_of(self.run, self.earlier, sum(armed), len(steady_rows))
        ref = runs.reference
        if ref is not None:  # every step armed: the job's figures are its last unarmed run's
            med = {k: ref.medians.get(k) for k in SUMMARY_METRICS}
            steady_rows = array("q")
        name = job_name or (self.first[1] if self.first else None)
        block = job_block(self.job, name, ctx.world, self.gpu_name, ctx.peak, self.canon_dtype,
                          self.dtype_src, self.flops_job)
        disturbances = CaptureDisturbances.of(detection.disturbances)
        med_ms = med.get("step_time_ms")
        arming = arming_of(table, steady, runs, self.run)
        incident_s, armed_incident_s, profiling_s = goodput_costs(
            table.column("iteration"), armed, arming, incidents, detection.disturbances)
        gp = job_goodput(self.spans.by_end_time(), started_at=self.job.started_at,
                         incident_cost_s=incident_s, armed_incident_cost_s=armed_incident_s,
                         profiling_s=profiling_s,
                         log_interval=self.job.log_interval, by_end_time=True,
                         median_step_s=med_ms / 1e3 if med_ms is not None else None,
                         prior=self.earlier[-1].goodput if self.earlier else None,
                         armed_step_s=arming.reference_ms / 1e3 if arming is not None else None,
                         pause_s=part_seconds(pauses))
        match = self._match(med)
        # a capture of another job is read only when the caller insists (the CLI's --capture-force)
        refused = match is not None and match.refused and not (self.timeline and self.timeline.forced)
        timeline = None if refused else self.timeline
        budget = job_budget(med, ctx.peak, lay.pp, timeline, self.flops_job, self.flops_split,
                            rescale=match is None or match.matches)
        if budget is not None:  # how far a rerun of this job moves: its own steady steps' spread
            budget = dataclasses.replace(budget, step_sd_ms=robust_sd([steps_col[i] for i in steady_rows]))
        if budget is not None and timeline is not None and match is not None and not match.matches:
            # its steps are not the job's steady ones: their excess is not "what the capture added"
            budget = dataclasses.replace(budget, steady_step_ms=None)
        summary = summarize(table, steady_rows, steady, pers, lay, self.gpm, timeline, self.gpm_when,
                            med, incidents=incidents, jitter=detection.jitter, disturbances=disturbances,
                            goodput=gp, memory_mib=dict(self.memory_mib) or None, step_budget=budget,
                            shares_of=self.shares_of)
        summary = dataclasses.replace(with_runs(summary, runs, arming), pauses=pauses)
        analysis = RunAnalysis(block, table, summary, [], [], steady, pers, self.flops_job, ctx.peak,
                               incidents)
        analysis.config = job_config(analysis, self.job)
        analysis.capture_match = match
        analysis.mfu_convention = self._convention(med)
        fs, rs = derive_findings(analysis, self.job, budget, self.live)
        analysis.plan = job_plan(analysis, self.job, budget)
        mismatch = finding(match, bool(self.timeline and self.timeline.forced)) if match is not None else None
        if mismatch is not None:  # its steps are not the job's: their excess is not the profiler's cost
            fs = [f for f in fs if f.id != CAPTURE_COST_FINDING] + [mismatch]
        # the run's own: build_report adds the incidents' (perfd.report.incident_findings) and orders all
        analysis.findings, analysis.recommendations = fs, rs
        if memo is not None:
            memo.run = (_KeptRun((self.gpm, self.timeline, self.gpm_when), self.records, table, disturbed,
                                 [i for i, v in enumerate(table.column("incident_lost_ms")) if v is not None])
                        if self.in_order and self.records is not None else None)
        return analysis
