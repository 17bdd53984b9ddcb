"""The step windows made again only for what changed (perfd.analytics.collectives.step_window_memo) are
the ones step_windows makes from all the records, whatever comes: new iterations, a late record for an
iteration already read, iterations let go, a rank's own records beside the folds."""

from __future__ import annotations

import random

from perfd.analytics.collectives.collective_windows import step_windows
from perfd.analytics.collectives.step_window_memo import StepWindowMemo
from perfd.core.model import StepRecord

RANKS = 16


def _fold(it: int, rng: random.Random, ranks: range = range(RANKS), warm: bool = False) -> StepRecord:
    ends = {r: 100.0 + it + rng.random() * 0.2 for r in ranks}
    return StepRecord(job="j", iteration=it, rank="all", end_time=max(ends.values()), rank_end_times=ends,
                      fields={"warmup": "true"} if warm else {})


def _same(memo: StepWindowMemo, steps: list[StepRecord]) -> None:
    per_rank, job = step_windows(steps)
    assert memo.rank_windows == per_rank
    assert memo.job_windows == job


def test_new_iterations_extend_the_windows_as_a_rebuild_does() -> None:
    rng = random.Random(3)
    memo, held = StepWindowMemo(), []
    for it in range(1, 12):
        held.append(_fold(it, rng, warm=it < 3))
        changed = memo.update(held)
        _same(memo, held)
        assert changed == (set(range(RANKS)))
    assert memo.update(list(held)) == set()  # the same records again: nothing made again


def test_a_late_record_for_an_answered_iteration_changes_it_as_a_rebuild_does() -> None:
    """A node's partial that came after iteration 5 was read: the root's fold of 5 is a new record
    whose ends differ for that node's ranks; iteration 5's windows and 6's (which starts at 5's end)
    change exactly as step_windows of all the records gives them. Fails with the identity check
    (``_same``) reading an iteration held as unchanged."""
    rng = random.Random(5)
    memo = StepWindowMemo()
    held = [_fold(it, rng) for it in range(1, 10)]
    memo.update(held)
    before = {r: list(ws) for r, ws in memo.rank_windows.items()}
    late = _fold(5, rng)
    late.rank_end_times.update({r: late.rank_end_times[r] + 0.05 for r in (0, 1, 2)})
    held[4] = late
    changed = memo.update(held)
    _same(memo, held)
    assert {0, 1, 2} <= changed
    assert memo.rank_windows[0] != before[0]  # the test reads a change, not two equal lists


def test_iterations_let_go_and_a_ranks_own_records() -> None:
    rng = random.Random(7)
    memo, held = StepWindowMemo(), []
    for it in range(1, 30):
        held.append(_fold(it, rng, ranks=range(RANKS - 4) if it % 7 == 0 else range(RANKS)))
        if it % 5 == 0:  # a rank's own record beside the fold: it wins for that rank
            held.append(StepRecord(job="j", iteration=it, rank=3, end_time=100.0 + it + 0.5))
        held = held[-20:]  # retention: the oldest go
        if it % 9 == 0:  # an end that does not move on (skipped as a window) inside the ones held
            held[-3] = _fold(held[-3].iteration, random.Random(0), ranks=range(2))
        memo.update(held)
        _same(memo, held)
    memo.update([])
    _same(memo, [])


def test_any_sequence_of_changes_gives_what_a_rebuild_gives() -> None:
    """Random changes of every kind the job store makes, each checked against step_windows: a new
    iteration's fold (of some ranks, handed again with more), a late one for any iteration held,
    iterations let go from the oldest, a rank's own records, ends that do not move on, equal ends."""
    rng = random.Random(11)
    memo = StepWindowMemo()
    held: dict[int, list[StepRecord]] = {}
    nxt = 1
    for _ in range(400):
        op = rng.random()
        if op < 0.35 or not held:  # the next iteration, its fold of some ranks
            held[nxt] = [_fold(nxt, rng, ranks=range(rng.randint(1, RANKS)), warm=rng.random() < 0.1)]
            nxt += 1
        elif op < 0.6:  # a fold handed on again (more ranks, other ends), any iteration held
            it = rng.choice(list(held))
            held[it] = [_fold(it, rng, ranks=range(rng.randint(1, RANKS)))]
        elif op < 0.7:  # the oldest let go
            del held[min(held)]
        elif op < 0.8:  # a rank's own record, sometimes ending no later than the iteration before
            it = rng.choice(list(held))
            held[it] = [*held[it], StepRecord(job="j", iteration=it, rank=rng.randrange(RANKS),
                                              end_time=100.0 + it - rng.choice((0.0, 1.5)))]
        elif op < 0.9:  # a second fold of the iteration beside the first, equal ends for some ranks
            it = rng.choice(list(held))
            f = held[it][0]
            held[it] = [*held[it], StepRecord(job="j", iteration=it, rank="all", end_time=f.end_time,
                                              rank_end_times={r: e for r, e in f.rank_end_times.items()
                                                              if r % 2 == 0})]
        else:  # a job-level record (a log's line)
            it = rng.choice(list(held))
            held[it] = [*held[it], StepRecord(job="j", iteration=it, rank="last",
                                              end_time=100.0 + it + rng.random())]
        steps = [s for it in sorted(held) for s in held[it]]
        memo.update(steps)
        _same(memo, steps)
