"""perfd.aggregator.eventlog: bounded by count and bytes, each event kept cut to its size cap (its
listeners get it whole), numbered, and paged (issue 36 item 4)."""

from __future__ import annotations

from typing import Any

from perfd import events
from perfd import limits as L
from perfd.aggregator.eventlog import EventLog


def _ev(i: int, kind: str = "xid", payload_kb: int = 0) -> dict[str, Any]:
    return {"kind": kind, "time": float(i), "job": "j", "text": f"e{i}",
            "payload": {"blob": "b" * (payload_kb * 1000)} if payload_kb else {"i": i}}


def test_a_large_event_is_kept_cut_and_its_listener_gets_it_whole() -> None:
    log = EventLog()
    heard: list[Any] = []
    log.listeners.append(lambda ev: heard.append(ev))
    log.ingest("a", [_ev(1, events.CAPTURE_FINISHED.name, payload_kb=100)])
    assert len(heard[0]["payload"]["blob"]) == 100_000  # the capture records read it whole
    kept = log.recent()[0]
    assert kept["payload"] == {"cut_bytes": 100_000 + len('{"blob": ""}')} and kept["seq"] == 1
    assert log.cut == 1 and log.cut_bytes > 99_000


def test_the_log_is_bounded_by_bytes_and_pages_walk_it_once() -> None:
    log = EventLog(max_events=1000, max_bytes=200_000)
    log.ingest("a", [_ev(i, payload_kb=10) for i in range(100)])  # ~10 KB each as kept: ~19 fit
    st = log.stats()
    assert st["bytes"] <= 200_000 and 15 <= st["held"] <= 20 and st["last_seq"] == 100
    newest, more = log.page(limit=5)
    assert [e["seq"] for e in newest] == [96, 97, 98, 99, 100] and more
    seen: list[object] = []
    cursor = 0
    while True:
        page, more = log.page(limit=7, after=cursor, max_bytes=L.MAX_EVENTS_PAGE_BYTES)
        seen += [e["seq"] for e in page]
        if not more:
            break
        last = page[-1]["seq"]
        assert isinstance(last, int)
        cursor = last
    assert seen == list(range(100 - st["held"] + 1, 101))
    page, _ = log.page(limit=1000, after=0, max_bytes=25_000)  # about that many bytes, at least one
    assert 1 <= len(page) <= 3


def test_cut_keeps_valid_json_and_says_how_much_went() -> None:
    text, payload, n = events.cut("t" * 10_000, '{"a": "' + "x" * 20_000 + '"}', 4096)
    assert len(text.encode()) <= 1024 + len(events.CUT_MARK.encode()) and payload == '{"cut_bytes": 20009}'
    assert n == 10_000 + 20_009 - len(text.encode()) - len(payload)
    assert events.cut("small", "{}", 4096) == ("small", "{}", 0)
