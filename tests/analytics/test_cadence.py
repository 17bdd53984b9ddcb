"""perfd.analytics.incidents.cadence: which pauses between the steps are the loop's own cadence, and which
work each was by what the aggregator saw during it. (The recorded loops: tests/incidents/
test_cadence_recorded.py.)"""

from __future__ import annotations

from perfd.analytics.incidents.cadence import (
    Pause,
    PausePart,
    PauseSighting,
    SeenKind,
    find_cadences,
    name_part,
    outside_explains,
    part_seconds,
)


def _p(it: int, s: float = 2.0) -> Pause:
    return Pause(it, s, start_time=1000.0 + it, end_time=1000.0 + it + s)


def test_two_pauses_where_a_loops_counter_puts_its_work_are_a_cadence() -> None:
    (c,) = find_cadences([_p(100), _p(200)])
    assert c.every == 100 and c.iterations == (100, 200) and c.id == "cadence-100"
    (c,) = find_cadences([_p(101), _p(201)])  # the pause after step N, on step N+1's period
    assert c.every == 100


def test_two_one_off_stalls_some_steps_apart_are_none() -> None:
    assert find_cadences([_p(137), _p(412)]) == []


def test_three_at_one_interval_are_a_cadence_wherever_they_fall() -> None:
    (c,) = find_cadences([_p(37), _p(87), _p(137)])
    assert c.every == 50 and c.iterations == (37, 87, 137)


def test_too_often_or_too_unlike_is_no_cadence() -> None:
    assert find_cadences([_p(103), _p(108), _p(113)]) == []  # every 5 steps: the step pattern's own
    assert find_cadences([_p(100, 2.0), _p(200, 30.0)]) == []  # a 30 s hang is not the 2 s save


def test_a_cadence_the_loop_stepped_through_was_none() -> None:
    pauses = [_p(100), _p(150), _p(200), _p(300)]
    # until step 250 runs at its steady time, 100, 150, 200 look like "every 50"
    assert [c.every for c in find_cadences(pauses[:3], stepped_to=210)] == [50]
    (c,) = find_cadences(pauses, stepped_to=320)
    assert c.every == 100 and c.iterations == (100, 200, 300)  # 150 stays a one-off


def test_a_pause_lies_outside_the_step() -> None:
    assert outside_explains([1892.9], [1765.5 / 1892.9], 1759.2)  # nanoGPT's iteration 100
    assert not outside_explains([1892.9], [0.9 / 1892.9], 1759.2)  # the step itself slow
    assert not outside_explains([900.0, 900.0, 900.0], [0.9, 0.9, 0.9], 2000.0)  # a slow stretch


def test_what_was_seen_during_the_pauses_names_the_part() -> None:
    (c,) = find_cadences([_p(100), _p(200)])

    def seen(**kw: float) -> list[PauseSighting]:
        return [PauseSighting(1101.0, 0, **kw), PauseSighting(1201.0, 0, **kw)]

    writing = name_part(c, seen(write_bytes_per_s=1.5e9, gpu_util=0.02))
    assert writing.part is PausePart.CHECKPOINT
    assert [(s.kind, s.value, s.n) for s in writing.seen] == [(SeenKind.DISK_WRITES, 1.5e9, 2),
                                                              (SeenKind.GPU_IDLE, 0.02, 2)]
    assert name_part(c, seen(gpu_util=0.97, write_bytes_per_s=1e4)).part is PausePart.EVALUATION
    both = name_part(c, seen(gpu_util=0.97, write_bytes_per_s=1.5e9))
    assert both.part is PausePart.UNTOLD and len(both.seen) == 2
    outside = name_part(c, [PauseSighting(1150.0, 0, gpu_util=0.97)])  # between the pauses: not theirs
    assert outside.part is PausePart.UNTOLD and outside.seen == ()
    assert part_seconds([writing]) == {"checkpoint": 4.0}
