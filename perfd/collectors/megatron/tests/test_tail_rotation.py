"""copytruncate and rotation as logrotate does them, against a writer that keeps its file open
(O_APPEND, as `cmd >> train.log` or Python's logging do): nothing written is lost unless the rotated
copy is gone, and then what is lost is counted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import BinaryIO

from perfd.collectors.megatron.tail import LogTail


def line(i: int) -> bytes:
    # Iteration lines of a realistic width, so a few dozen pass the 4 KiB head.
    return (b" [2025-01-01 00:00:00.000000] iteration %5d/ 1000 | consumed samples: %8d | "
            b"elapsed time per iteration (ms): 190.4 | lm loss: 7.1E+00 |\n" % (i, 64 * i))


def write(w: BinaryIO, first: int, last: int) -> None:
    w.write(b"".join(line(i) for i in range(first, last + 1)))
    w.flush()


def copytruncate(log: Path) -> None:
    """logrotate's copytruncate: copy to <name>.1 (an older .1 shifted away), then truncate."""
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    os.truncate(log, 0)


def iterations(lines: list[str]) -> list[int]:
    return [int(s.split("iteration")[1].split("/")[0]) for s in lines]


def read_all(tail: LogTail) -> list[str]:
    got: list[str] = []
    while batch := tail.read_lines():
        got += batch
    return got


def test_truncated_and_grown_past_the_old_offset_is_seen(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 29)
        tail = LogTail(log)
        assert iterations(read_all(tail)) == list(range(1, 30))
        write(w, 30, 40)  # not read before the rotation
        copytruncate(log)
        write(w, 41, 110)  # the new file outgrows the old offset before the next poll
        assert os.path.getsize(log) > os.path.getsize(log.with_name("train.log.1")) - 11 * len(line(30))
        assert iterations(read_all(tail)) == list(range(30, 111))
    assert tail.counts["truncations"] == 1 and tail.counts["rotated_tail_reads"] == 1
    assert "truncations_unread" not in tail.counts


def test_plain_copytruncate_reads_the_unread_tail_from_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    got: list[str] = []
    with log.open("ab") as w:
        tail = LogTail(log)
        n = 0
        for _ in range(3):
            write(w, n + 1, n + 10)
            got += read_all(tail)
            write(w, n + 11, n + 18)  # 8 lines the tail has not read when the rotation comes
            copytruncate(log)
            write(w, n + 19, n + 20)
            n += 20
        got += read_all(tail)
    assert iterations(got) == list(range(1, 61))  # the 24 unread lines came from the copies
    assert tail.counts["truncations"] == 3 and tail.counts["rotated_tail_reads"] == 3


def test_a_partial_line_goes_on_in_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 40)
        w.write(line(41)[:30])
        w.flush()
        tail = LogTail(log)
        assert iterations(read_all(tail)) == list(range(1, 41))
        w.write(line(41)[30:])
        write(w, 42, 43)
        copytruncate(log)
        write(w, 44, 45)
        assert iterations(read_all(tail)) == [41, 42, 43, 44, 45]


def test_copytruncate_without_a_copy_counts_what_is_lost(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 40)
        tail = LogTail(log)
        assert len(read_all(tail)) == 40
        write(w, 41, 45)
        os.truncate(log, 0)  # "> train.log": no copy anywhere
        write(w, 46, 100)
        assert iterations(read_all(tail)) == list(range(46, 101))
    assert tail.counts["truncations"] == 1 and tail.counts["truncations_unread"] == 1


def test_a_copy_of_another_file_is_not_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 40)
        tail = LogTail(log)
        read_all(tail)
        log.with_name("train.log.1").write_bytes(b"some other log\n" * 500)
        os.truncate(log, 0)
        write(w, 46, 100)
        assert iterations(read_all(tail)) == list(range(46, 101))
    assert tail.counts["truncations_unread"] == 1


def test_copytruncate_while_the_agent_is_down_resumes_in_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 30)
        tail = LogTail(log)
        lines = tail.read_lines_at()
        pos = tail.position_at(lines[-1][1] + 1)  # type: ignore[operator]
        tail.close()  # the agent stops
        assert pos is not None
        write(w, 31, 50)
        copytruncate(log)
        write(w, 51, 140)  # grows past the saved offset: size alone would not show it
        again = LogTail(log, resume=pos)
        assert iterations(read_all(again)) == list(range(31, 141))
    assert again.counts["resumed"] == 1 and again.counts["resumed_rotated"] == 1


def test_rename_rotation_while_the_agent_is_down_resumes_in_the_old_file(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 30)
    tail = LogTail(log)
    lines = tail.read_lines_at()
    pos = tail.position_at(lines[-1][1] + 1)  # type: ignore[operator]
    tail.close()
    assert pos is not None
    with log.open("ab") as w:
        write(w, 31, 55)
    os.rename(log, log.with_name("train.log.1"))
    with log.open("ab") as w:
        write(w, 56, 60)
    again = LogTail(log, resume=pos)
    assert iterations(read_all(again)) == list(range(31, 61))
    assert again.counts["resumed_rotated"] == 1


def test_resume_with_the_old_file_gone_is_counted(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        write(w, 1, 30)
    tail = LogTail(log)
    lines = tail.read_lines_at()
    pos = tail.position_at(lines[-1][1] + 1)  # type: ignore[operator]
    tail.close()
    assert pos is not None
    os.unlink(log)
    with log.open("ab") as w:
        write(w, 56, 60)
    again = LogTail(log, resume=pos)
    assert iterations(read_all(again)) == list(range(56, 61))
    assert again.counts["resume_other_file"] == 1 and "resumed" not in again.counts


def test_the_collector_reports_an_unreadable_rotation_as_a_log_gap(tmp_path: Path) -> None:
    from perfd.collectors.megatron.collector import MegatronCollector
    from perfd.core.events import LOG_GAP

    demo = (Path(__file__).resolve().parents[4] / "perfd" / "app" / "demo" / "data"
            / "megatron_h200x2_tp1_pp2.log")
    text = demo.read_text()
    log = tmp_path / "train.log"
    log.write_text(text)
    col = MegatronCollector({"path": str(log), "job": "j", "flush_after_s": 3600})
    col.start()
    assert col.collect(0.0).steps
    os.truncate(log, 0)  # "> train.log": no copy
    body = text[text.index(" [20"):]  # what a job writes after its start-up block
    with log.open("a") as w:
        w.write(body * 3)  # grows past the old offset again
    got = col.collect(1.0)
    gaps = [e for e in got.events if e["kind"] == LOG_GAP.name]
    assert len(gaps) == 1 and gaps[0]["payload"]["cause"] == "truncation"
    assert col.errors.get("tail:unread_lost") == 1
    assert col.collect(2.0).events == []  # reported once
    col.stop()
