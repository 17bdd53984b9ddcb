"""The capture book's readers never wait on its lock (perfd/aggregator/capture_book.py).

A full suite hung an aggregator for good: the rules tick held the book's lock while it had a job
analysed (a rule's targets) and waited for the state's incident lock; the refresh held that lock
and, updating the job's incidents, waited for the book's lock to read the job's capture records;
every /captures request and the aggregator's stop queued behind them. Readers now get the copies
published when a change ends, with no lock, so a reader holding any other lock cannot close a cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from perfd.aggregator.capture_book import CaptureBook
from perfd.aggregator.capture_records import CaptureRecord
from perfd.core.model import CaptureTool


def _rec(cid: str, job: str, tool: CaptureTool, at: float) -> CaptureRecord:
    return CaptureRecord(cid, job, [0], tool, 3, "manual", at)


T = TypeVar("T")


def _in_thread(read: Callable[[], T]) -> T:
    """``read()`` on another thread; fails if it does not return within 5 s (it waited on the lock)."""
    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(read()), daemon=True)
    t.start()
    t.join(timeout=5.0)
    assert not t.is_alive(), "a reader waited on the book's lock"
    return out[0]


def test_readers_get_what_was_published_while_a_change_holds_the_lock() -> None:
    book = CaptureBook()
    book.restore([_rec("a", "job", "ncu", 1.0)])
    with book.writing():
        book.records["b"] = _rec("b", "job", "ncu", 2.0)
        book.records["a"].reason = "changing"
        # the lock is held (as the rules tick holds it through an analysis): readers do not wait, and
        # see the records as the last change left them
        assert [r.id for r in _in_thread(lambda: book.of_job("job"))] == ["a"]
        assert [r.id for r in _in_thread(lambda: book.latest_ncu("job"))] == ["a"]
        assert _in_thread(lambda: book.published()[0].reason) == ""
        with book.writing():  # nested: published once, when the outermost change ends
            book.records["c"] = _rec("c", "other", "kineto", 3.0)
        assert [r.id for r in book.published()] == ["a"]
    assert [r.id for r in book.of_job("job")] == ["a", "b"]
    assert [r.id for r in book.latest_ncu("job")] == ["b"] and book.latest_ncu("none") == []
    assert [r.id for r in book.of_job("other")] == ["c"]
    assert book.published()[0].reason == "changing"


def test_what_a_reader_gets_is_its_own() -> None:
    book = CaptureBook()
    book.restore([_rec("a", "job", "ncu", 1.0)])
    mine = book.of_job("job")[0]
    mine.reason = "a reader's change"
    assert book.of_job("job")[0].reason == "" and book.records["a"].reason == ""
