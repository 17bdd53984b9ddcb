"""The thresholds a collector applies as well as the analysis (declared once), and the type every
threshold of perfd is declared with. Pure data.

collectors/ranks starts its CPU contention scan and marks a rank idle by the host evidence's
numbers; collectors/megatron holds an announced pause back for as long as the stall detector
believes it: both read them here, below the analytics. The rest of the diagnosis playbook is in
perfd.analytics.thresholds, whose ``all_thresholds`` lists these too (for the consistency test).

Values are in base units: ratios in [0, 1], seconds. Each says why (``why``) and where docs/design.md
defines it (``design``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Pack = Literal["default", "serving", "prometheus"]


@dataclass(frozen=True)
class RuleRef:
    """A rule that compares a metric with the threshold: which pack, the rule (or alert) name, the
    operand the comparison is on, the operator, and its ``for:`` (None: fires at once)."""

    pack: Pack
    name: str
    operand: str
    op: str
    for_: str | None
    note: str = ""


@dataclass(frozen=True)
class Threshold:
    value: float
    why: str
    design: str  # the docs/design.md section that defines it
    rules: tuple[RuleRef, ...] = ()


# --- host evidence of a rank process (perfd.analytics.incidents.host_evidence, collectors/ranks)
# ------------------
_HOST = "docs/design.md §2 Who is to blame (host evidence of the rank's process)"
PAUSE_WRITES_BPS = Threshold(
    20e6, "a rank process writing 20 MB/s or more to disk (proc(5) io write_bytes) while its steps wait is "
    "saving a checkpoint (the model's state: hundreds of MB in seconds; a logger writes kilobytes); the "
    "agent reports such writing at once, every collect, so that a pause of a few seconds is seen", _HOST)
CPU_WAIT_SCAN = Threshold(
    0.10, "a rank waiting for a CPU a tenth of the time it wants one starts the scan that names who else "
    "runs on its CPUs (the scan reads every process: it runs only then)", _HOST)
CPU_WAIT_CONTENTION = Threshold(
    0.25, "a rank waiting in the run queue a quarter of the time it wants a CPU is slowed by it: an "
    "uncontended rank waits ~0% (measured here: 0.005% alone on its CPU, 66% beside two spinning "
    "burners, 80% beside four: tests/data/host)", _HOST)
CPU_OTHERS_SHARE = Threshold(
    0.20, "processes outside the job taking a fifth of the rank's CPUs are the contention's cause; "
    "less, and the rank's own threads (data loader workers) oversubscribe them", _HOST)
CPU_FULL_SHARE = Threshold(
    0.90, "a rank's CPUs (its affinity set, or its cgroup's quota) busy nine tenths of the time have no "
    "room for another data-loader worker: it would take CPU from the others (a busy CPU still idles "
    "a few percent between wake-ups)", _HOST)
CPU_THROTTLED_SHARE = Threshold(
    0.10, "a cgroup throttled in a tenth of its quota periods loses CPU time every tenth period (a "
    "Kubernetes CPU limit slows data loaders this way)", _HOST)
MEMORY_PRESSURE_SHARE = Threshold(
    0.10, "tasks stalled on memory (PSI some) a tenth of the time: reclaim or swap is in the step's way",
    _HOST)
SWAP_IN_BYTES_PER_S = Threshold(
    1 << 20, "swapping in more than 1 MiB/s while the rank runs: its pages (or a neighbour's) are on disk",
    _HOST)
IO_PRESSURE_SHARE = Threshold(
    0.30, "tasks stalled on I/O (PSI some) 30% of the time, or the rank itself in disk sleep: it is "
    "blocked in I/O", _HOST)

# --- a stall seen live (perfd.analytics.incidents.stall)
# -----------------------------------------------------------
_STALL = "docs/design.md §2 Diagnosis playbook (hangs)"
STALL_CADENCE_FACTOR = Threshold(
    4.0, "no step record for four of the job's usual intervals between records (its log interval's "
    "cadence, not the step time) is a stop, not jitter", _STALL)
STALL_FLOOR_S = Threshold(
    5.0, "... and at least 5 s: a record takes up to ~2.5 s from the rank to the aggregator (the log "
    "tail's quiet flush 2 s, the collect and batch intervals), so a shorter silence is the pipeline", _STALL)
STALL_EXIT_GRACE_S = Threshold(
    60.0, "a silence that ends with every rank process gone within a minute of the job's last step is "
    "its exit (a final save, the loader's and CUDA's teardown: 16 s seen on a plain PyTorch job), not a "
    "stall; a job that hung and was killed later is one", _STALL)
STALL_IDLE_CPU_CORES = Threshold(
    0.05, "a rank process using under 5% of a core makes no progress (a training loop runs a core or "
    "more; a sleeping or blocked one, ~0)", _STALL)
STALL_PHASE_MAX_S = Threshold(
    1800.0, "an announced checkpoint save or evaluation holds a stall back for at most 30 minutes: one "
    "still open after that is stuck itself", _STALL)


def all_thresholds() -> dict[str, Threshold]:
    """Every threshold of this module by name."""
    return {k: v for k, v in globals().items() if isinstance(v, Threshold)}
