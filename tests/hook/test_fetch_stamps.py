"""The fetch stamps (perfd.hook.loader): what the training thread spends getting its batches, from
``hook.loader(iterable)`` or torch's DataLoader iterators, and nothing else."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from perfd.hook.loader import CLOCK, FetchClock, Loader, dataloader_watched, watch_dataloader
from tests.hook.sim_clock import SimClock


def _slow(sim: SimClock, n: int, s: float) -> Iterator[int]:
    for k in range(n):
        sim.advance(s)
        yield k


def test_a_loader_yields_the_same_batches_and_stamps_each_fetch(sim_clock: SimClock) -> None:
    clock = FetchClock()
    wrapped = Loader(list(range(5)), clock)
    assert len(wrapped) == 5 and wrapped.count(3) == 1  # the wrapped object's attributes
    assert list(wrapped) == [0, 1, 2, 3, 4]
    assert clock.count == 6  # five batches and the StopIteration
    assert clock.total_ns == 0  # no time passed in them
    assert list(Loader(_slow(sim_clock, 3, 0.01), clock)) == [0, 1, 2]
    assert clock.total_ns == 30_000_000


def test_only_the_watched_threads_fetches_count(sim_clock: SimClock) -> None:
    clock = FetchClock()  # watches the thread that made it
    other = threading.Thread(target=lambda: list(Loader(_slow(sim_clock, 2, 0.01), clock)))
    other.start()
    other.join()
    assert clock.count == 0 and clock.total_ns == 0  # a prefetching thread's fetches overlap the step
    list(Loader(range(2), clock))
    assert clock.count == 3


def test_a_fetch_inside_another_is_counted_once(sim_clock: SimClock) -> None:
    clock = FetchClock()
    inner = Loader(_slow(sim_clock, 3, 0.01), clock)
    outer = Loader(inner, clock)
    list(outer)
    assert clock.count == 4 and clock.total_ns == 30_000_000  # the outer fetches only


@pytest.mark.slow
def test_torch_dataloader_fetches_are_stamped_once_per_process() -> None:
    torch = pytest.importorskip("torch")
    data = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=0)
    assert watch_dataloader() and watch_dataloader() and dataloader_watched()  # idempotent
    CLOCK.watch()
    before = CLOCK.count
    assert [b.tolist() for b in data] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert CLOCK.count - before == 5


@pytest.mark.slow
def test_the_environment_leaves_torch_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """PERFD_HOOK_DATALOADER=0 set before the hook is made: torch's DataLoader left as torch has it.
    In this process another test may have stamped the iterator class already (the wrap is once per
    process): its own __next__ is put back for this test (monkeypatch restores the class after), so the
    class is as a fresh process imports it."""
    pytest.importorskip("torch")
    import torch.utils.data.dataloader as torch_loader

    from perfd.hook import StepHook

    cls = torch_loader._BaseDataLoaderIter
    nxt = cls.__dict__["__next__"]
    if dataloader_watched():
        monkeypatch.setattr(cls, "__next__", nxt.__wrapped__)
    assert not dataloader_watched()
    monkeypatch.setenv("PERFD_HOOK_DATALOADER", "0")
    h = StepHook("/nonexistent.sock", cuda=False)
    try:
        assert not watch_dataloader() and not dataloader_watched() and not h.watch_dataloader
    finally:
        h.close()  # its socket: the subprocess this was closed it by ending


def test_a_raising_fetch_is_timed_and_raises(sim_clock: SimClock) -> None:
    clock = FetchClock()

    def boom() -> int:
        sim_clock.advance(0.01)
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError, match="worker died"):
        clock.timed(boom)
    assert clock.count == 1 and clock.total_ns == 10_000_000 and not clock.busy
