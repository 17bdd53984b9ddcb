"""Is a job running, stalled (hung) or ended? From how old its last step is and whether its
processes are still on their GPUs.

A job whose last step is older than ``stale_after`` (``STALL_STEPS`` × its own median step, at
least ``STALE_FLOOR_S``, or the aggregator's ``--job-stale-after``) is no longer running. If its rank
processes are still on their GPUs it is *stalled* — a hang, the most expensive failure in training —
otherwise it *ended*. Without process lists (an agent without NVML) the two cannot be told apart:
the job is called ended and the reason says why. Pure.
"""

from __future__ import annotations

RUNNING = "running"
STALLED = "stalled"
ENDED = "ended"
STATES: tuple[str, ...] = (RUNNING, STALLED, ENDED)

STALL_STEPS = 10.0  # no step for this many median steps: the job stopped stepping
STALE_FLOOR_S = 60.0  # never sooner (first iterations, checkpoints, evaluation pauses)


def stale_after(median_step_s: float | None, override_s: float | None = None) -> float:
    """Seconds without a step after which a job is no longer running."""
    if override_s is not None:
        return override_s
    return max(STALE_FLOOR_S, STALL_STEPS * median_step_s) if median_step_s else STALE_FLOOR_S


def job_state(last_step_age_s: float | None, median_step_s: float | None, processes_alive: bool | None,
              override_s: float | None = None) -> tuple[str, str]:
    """(state, why). ``processes_alive``: the job's rank processes are in the latest GPU process
    lists (None: no process lists for the job)."""
    limit = stale_after(median_step_s, override_s)
    if last_step_age_s is None:
        return RUNNING, "no step yet (starting)"
    if last_step_age_s <= limit:
        return RUNNING, f"last step {last_step_age_s:.0f} s ago (stale after {limit:.0f} s)"
    if processes_alive:
        return STALLED, (f"no step for {last_step_age_s:.0f} s (> {limit:.0f} s) while its rank processes "
                         "are still on their GPUs: hung")
    if processes_alive is None:
        return ENDED, (f"no step for {last_step_age_s:.0f} s (> {limit:.0f} s); no GPU process lists to "
                       "tell a hang from an exit (agent without NVML)")
    return ENDED, f"no step for {last_step_age_s:.0f} s and its rank processes are gone"
