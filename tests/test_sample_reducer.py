"""perfd.agent.reduce: the aggregator gets each node series' newest value every few seconds."""

from __future__ import annotations

from perfd.agent.reduce import SampleReducer
from perfd.core.model import Sample


def _s(name: str, v: float, t: float, gpu: str = "0") -> Sample:
    return Sample(name, v, t, {"gpu": gpu, "node": "n"})


def test_each_series_goes_at_most_once_per_interval_with_its_newest_value() -> None:
    r = SampleReducer(2.0)
    assert [s.value for s in r.reduce([_s("p", 1, 0.0), _s("p", 2, 0.1)], 0.1)] == [2]  # first: at once
    assert r.reduce([_s("p", 3, 0.5)], 0.5) == []  # within the interval: held
    assert r.reduce([_s("p", 4, 1.5)], 1.5) == []
    assert [s.value for s in r.reduce([], 2.2)] == [4]  # the newest, even with nothing new arriving
    assert r.reduce([], 9.0) == []  # nothing held: nothing invented
    assert (r.seen, r.forwarded) == (4, 2)


def test_series_are_told_apart_by_labels_and_zero_forwards_everything() -> None:
    r = SampleReducer(5.0)
    got = r.reduce([_s("p", 1, 0, "0"), _s("p", 2, 0, "1"), _s("q", 3, 0, "0")], 0.0)
    want = [("p", "0", 1), ("p", "1", 2), ("q", "0", 3)]
    assert sorted((s.name, s.labels["gpu"], s.value) for s in got) == want
    every = SampleReducer(0)
    assert len(every.reduce([_s("p", 1, 0), _s("p", 2, 0.1)], 0.1)) == 2
