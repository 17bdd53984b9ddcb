"""A job as the job store holds it (:class:`JobState`: its records, their owners, its runs, its
analysis), a run a new one replaced (:class:`ClosedRun`), what an ingest kept out
(:class:`StepConflicts`) and the store's counters (:class:`JobStats`). Apart from the store
(perfd/aggregator/jobs.py) so that the functions over a job's runs (perfd/aggregator/job_runs.py) take
it without importing the store that calls them."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from perfd.aggregator.step_histogram import StepHistogram
from perfd.analytics.run.run_analysis import AnalysisMemo
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.runs import RunDigest
from perfd.core.model import JobInfo, StepRecord
from perfd.core.record_json import JsonWritten, unwritten


@dataclass
class ClosedRun:
    """A run whose records a new run replaced, held until the next analysis digests it."""

    run: int
    records: list[StepRecord]
    info: JobInfo | None
    ranks: frozenset[int] = frozenset()  # the ranks its folds held (perfd.engine's root), not its records


@dataclass
class JobState:
    name: str
    job_info: JobInfo | None = None
    job_info_agent: str | None = None
    # (iteration, rank scope) -> record. Re-delivery of a batch replaces, never duplicates; only the
    # agent that sent a record may replace it (``owner``), and never with a worse copy.
    records: dict[tuple[int, str], StepRecord] = field(default_factory=dict)
    owner: dict[tuple[int, str], str] = field(default_factory=dict)  # record key -> agent that sent it
    iterations: list[int] = field(default_factory=list)  # the iterations held, sorted (for _outranks)
    agents: set[str] = field(default_factory=set)  # only ever added to (the job's state goes whole)
    # ``agents`` sorted, as the overview lists them, made again when their number changed (exact:
    # they only grow): every snapshot of a job reads its overview, and a 100,000-GPU job's 12,500
    # node agents sorted at each was 6% of its root's CPU (py-spy, docs/evidence/entries/48-scale-history.md)
    agents_sorted: tuple[str, ...] = ()
    gpu_name: str | None = None  # from the NVML samples of the job's agents ("model" label)
    analysis: RunAnalysis | None = None
    analysis_time: float = 0.0
    # Analyses run outside the store lock, several at once (the refresher, the API, the rules, W&B):
    # each is numbered when it reads the records, and one is kept only if none read later was kept
    # before it ends (an older one ending last once put back an analysis without the newest iteration,
    # served until the next record: a finished job's last step lost for good).
    analyses_begun: int = 0
    analysis_seq: int = 0  # the number of the newest that ended: the analysis held, or one that failed
    class_key: tuple[object, ...] = ()  # what the last analysis's class read (GPM, capture, GPM window)
    dirty: bool = False
    last_step_time: float = 0.0  # wall time the last step record arrived
    touched_at: float = field(default_factory=time.time)  # the last Hello, job info or step of the job
    step_hist: StepHistogram = field(default_factory=StepHistogram)
    hist_pending: int | None = None  # the newest iteration of rank records or folds, not yet counted
    # A log reports the job (a record of another scope than a rank's or a fold's): its records are the
    # histogram's, the ranks' (the step hook beside it) are not counted again.
    logged: bool = False
    # Megatron's per-log-interval counts of skipped and NaN iterations, summed over the job-level
    # records (each once: a re-sent record is not counted again), for the catalog's counters;
    # None until a record carries the field (absent, not 0, when the log never prints it).
    skipped_total: int | None = None
    nan_total: int | None = None
    # Retention is by iteration, whatever the number of ranks reporting: iteration -> its records'
    # rank scopes, oldest first, so the oldest iteration goes in O(1) (its own records only).
    by_iteration: OrderedDict[int, list[str]] = field(default_factory=OrderedDict)
    evicted_any: bool = False  # some of its first iterations left the window
    train_iters: int | None = None  # the current run's, as its records state it
    run_marks: dict[str, str] = field(default_factory=dict)  # rank scope -> its hook's pid (a new run)
    # rank -> (its hook's pid, when its latest hook record arrived): whether a capture through the hook
    # can reach the rank now (perfd.aggregator.captures waits for it before sending one)
    hook_seen: dict[int, tuple[str, float]] = field(default_factory=dict)
    # Retention drops since the job's last log line: (iterations evicted, records evicted, records
    # that arrived older than the window), and when that line was written.
    drops: list[int] = field(default_factory=lambda: [0, 0, 0])
    drops_logged_at: float = 0.0
    held_bytes: int = 0  # record_bytes of every record held
    iteration_bytes: dict[int, int] = field(default_factory=dict)
    # Incremental analysis: the per-iteration work of the last analysis (AnalysisMemo), and the
    # record objects it was keyed on kept stable from one analysis to the next — per-rank records
    # folded per iteration, capture-disturbed copies — so only changed iterations are recomputed.
    memo: AnalysisMemo = field(default_factory=AnalysisMemo)
    folded: dict[int, tuple[tuple[StepRecord, ...], StepRecord]] = field(default_factory=dict)
    disturbed: dict[int, tuple[StepRecord, StepRecord]] = field(default_factory=dict)
    analysis_lock: threading.Lock = field(default_factory=threading.Lock)  # one analysis at a time
    # One digest of replaced runs at a time, taken by every analysis before it reads the runs: one that
    # found none pending while another digested them read the runs without that digest (and, the newer
    # by its records, was kept), and two digests each stored their own list, the later losing the other's.
    digest_lock: threading.Lock = field(default_factory=threading.Lock)
    # The iteration from which the user took a lasting shift's level as the new normal
    # (perfd.analytics.steps.changepoint; POST /api/jobs/<job>/new-normal): its cost stops there.
    new_normal_at: int | None = None
    # Runs (perfd.analytics.run.runs): the current run's number, the digests of the earlier ones
    # (newest last), the runs replaced and not yet digested (at the next analysis, outside the lock),
    # the hook pids of ended runs (a record of one arriving late is theirs, not the current run's).
    run: int = 1
    runs: list[RunDigest] = field(default_factory=list)
    closed: list[ClosedRun] = field(default_factory=list)
    ended_pids: set[str] = field(default_factory=set)
    # The rank scopes with records in the current run: a start-up marked record of another scope (the
    # log's, where the hook's new pid began the run) is the same restart, not one more.
    run_scopes: set[str] = field(default_factory=set)
    run_start: float | None = None  # the current run's first step's start (epoch s)
    run_info: JobInfo | None = None  # the job as the current run's start-up stated it (a digest's)
    # Ranks whose records arrived already folded (perfd.engine's root): the world they make up.
    folded_ranks: set[int] = field(default_factory=set)
    # Why its last analysis failed (None: it did not), since when (epoch s), how many failed in all and
    # since the last log line, and when that line was written: a failing analysis is said in what the
    # job serves (its overview's analysis_error), never a silent empty answer.
    analysis_failure: str | None = None
    analysis_failed_since: float | None = None
    analysis_failures: int = 0
    failures_unlogged: int = 0
    # agent -> [records of the current run it holds, its newest iteration held]: who writes the job,
    # and how far (progress_of). Bounded by the job's hosts (the guard lets no other agent write).
    writers: dict[str, list[int]] = field(default_factory=dict)
    failure_logged_at: float | None = None

    def hold(self, agent: str, iteration: int) -> None:
        """A record of ``agent`` at ``iteration`` is held now where none of its was."""
        w = self.writers.setdefault(agent, [0, iteration])
        w[0] += 1
        w[1] = max(w[1], iteration)

    def unhold(self, agent: str | None) -> None:
        """A record of ``agent`` is held no more (retention takes the lowest iteration first, so its
        newest goes with its last record)."""
        w = self.writers.get(agent) if agent is not None else None
        if w is not None and agent is not None:
            w[0] -= 1
            if w[0] <= 0:
                del self.writers[agent]

    def progress_of(self, agent: str) -> tuple[int, str] | None:
        """The iteration ``agent``'s records are judged against (MAX_ITERATION_LEAP), and what it is:
        the newest held while ``agent`` is a main writer of the job (none holds more of its records),
        else the newest of the writer holding the most — the job's real progress, so a sender whose
        records no other corroborates cannot anchor its own next leap (a ladder of one far-future record
        per batch climbed past every real iteration). None: nothing held."""
        if not self.iterations or not self.writers:
            return None
        main = max(self.writers, key=lambda a: self.writers[a][0])
        mine = self.writers.get(agent)
        if mine is not None and mine[0] >= self.writers[main][0]:
            return self.iterations[-1], "the newest held before its batch"
        n, newest = self.writers[main]
        return newest, f"the newest held before its batch of the job's main writer ({main[:64]}, {n} records)"

    def begin_analysis(self) -> int:
        """Number an analysis that has just read the records (under the store's lock)."""
        self.analyses_begun += 1
        return self.analyses_begun

    def keep_analysis(self, seq: int, run: int, result: RunAnalysis, now: float, class_key: tuple[object, ...]
                      ) -> RunAnalysis | None:
        """Hold the analysis numbered ``seq``, of run ``run``, unless one that read later records is held
        already, or the job's run changed since it read them (a restart retired that run's incidents:
        tracked again, they came back open); then the one held is returned, and stays."""
        if run != self.run:
            return self.analysis
        if seq < self.analysis_seq:
            if self.analysis is not None:
                return self.analysis
            # The first to succeed, older than one that failed: held (nothing else is), the failure
            # still said and still the newest
            self.analysis = result
            return result
        self.analysis, self.analysis_seq, self.analysis_time, self.class_key = result, seq, now, class_key
        self.analysis_failure = self.analysis_failed_since = None
        return result

    def analysis_failed(self, seq: int, run: int, exc: BaseException, now: float,
                        class_key: tuple[object, ...], log_interval_s: float) -> int:
        """Note that the analysis numbered ``seq``, of run ``run``, failed (counted; said in what the job
        serves unless one that read later records is held, or the run changed); returns how many failed since
        the last log line when one is due now (the first failure, then at most one every
        ``log_interval_s``), else 0."""
        # The newest that ended (an older success after it changes nothing); a failure of a run since
        # replaced says nothing of the job now
        if seq >= self.analysis_seq and run == self.run:
            self.analysis_seq, self.analysis_time, self.class_key = seq, now, class_key
            if self.analysis_failure is None:
                self.analysis_failed_since = now
            self.analysis_failure = f"{type(exc).__name__}: {exc}"[:300]
        self.analysis_failures += 1
        self.failures_unlogged += 1
        if self.failure_logged_at is not None and now - self.failure_logged_at < log_interval_s:
            return 0
        n, self.failures_unlogged, self.failure_logged_at = self.failures_unlogged, 0, now
        return n

    def held_records(self) -> list[StepRecord]:
        """The records held, in the order of their iterations (not the order they came: the run's
        first record, come late through the engine, is still its first, and the analysis, which cuts
        a run where a ``first_of_run`` record follows others, reads one run)."""
        return [self.records[(it, sc)] for it in self.iterations for sc in self.by_iteration.get(it, ())
                if (it, sc) in self.records]


@dataclass
class StepConflicts:
    """What :meth:`JobStore.ingest_steps` kept out: records of another agent for an (iteration,
    rank) already held, by (job, the agent whose record is held); copies worse than the held
    record, by job; and the held records another agent's replaced (JobStore._outranks)."""

    other_agent: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    worse: dict[str, list[int]] = field(default_factory=dict)
    # Held records of another agent replaced, by (job, the agent whose records they were).
    displaced: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # Records refused as implausibly ahead, by job: (iteration, why).
    implausible: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)  # id() of every record kept out (not journalled)
    # Runs that ended because a new one began, by job: the number of the run that ended (its incidents
    # are closed with it: perfd.aggregator.state_ingest).
    ended_runs: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class JobStats:
    steps: int = 0
    dropped_steps: int = 0  # records that left the retention window (or arrived older than it)
    too_old: int = 0  # of those, records that arrived older than every iteration of a full window
    implausible: int = 0  # records refused as implausibly ahead (MAX_ITERATION_LEAP, train-iters)
    new_runs: int = 0  # restarts seen: the old run's records replaced by a digest of it
    replaced_by_new_run: int = 0  # ... how many records
    ended_run_records: int = 0  # records of a run that had ended arriving after it: refused
    evicted_iterations: int = 0
    evicted_iterations_bytes: int = 0  # of those, evicted for the byte bound
    analysis_errors: int = 0
    conflicts: int = 0  # records of another agent for an (iteration, rank) already held: kept out
    displaced: int = 0  # records held from an agent that wrote them ahead of the job: replaced
    worse_duplicates: int = 0  # copies of a held record lacking some of its values: kept out


@dataclass(frozen=True, slots=True)
class JobOverview(JsonWritten):
    """A job as the job store holds it (JobStore.overview): what /api/jobs lists of it first, in this
    order (:meth:`to_json`), and what the rows, the stall watch and the retention read."""

    job: str
    agents: tuple[str, ...]  # sorted
    gpu: str | None  # --gpu, else the GPU model its samples name
    iterations_seen: int
    first_iteration: int | None
    last_iteration: int | None
    has_job_info: bool
    last_step_age_s: float | None  # as of the read (a snapshot's overview_at says it at its own now)
    last_step_time: float | None  # when its last step record arrived (epoch s); None: none yet
    skipped_iterations_total: int | None  # None: its source counts none
    nan_iterations_total: int | None
    # Why its analysis failed last, since when, how many failed (JobState.analysis_failed); not in
    # to_json: the snapshot's overview_at serves it (``analysis_error``).
    analysis_failure: str | None = field(default=None, metadata=unwritten())
    analysis_failed_since: float | None = field(default=None, metadata=unwritten())
    analysis_failures: int = field(default=0, metadata=unwritten())
