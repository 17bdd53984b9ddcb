"""LogTail on real files: a new run rewriting the log with the same start-up
block is told from a resume and from more lines; two rotations between two reads count what can be
known; a log replaced by a FIFO (or any non-regular file) is refused, never a blocked collector."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from perfd.collectors.megatron.tail import HEAD_BYTES, LogTail, TailPosition, load_position, save_position
from perfd.collectors.megatron.tests.test_tail_rotation import copytruncate, iterations, line, read_all

HEAD = b"".join(b"  argument %04d ........ value\n" % i for i in range(200))  # > HEAD_BYTES, no stamps


def run(first: int, last: int, tag: bytes = b"") -> bytes:
    return b"".join(line(i).replace(b"lm loss", tag + b"lm loss") for i in range(first, last + 1))


def test_a_new_run_with_the_same_start_up_block_is_read_from_its_start(tmp_path: Path) -> None:
    assert len(HEAD) > HEAD_BYTES
    log = tmp_path / "train.log"
    log.write_bytes(HEAD + run(1, 60))
    tail = LogTail(log)
    assert iterations(read_all(tail)[200:]) == list(range(1, 61))
    log.write_bytes(HEAD + run(31, 120, b"new "))  # '>' and a new run, grown past our offset
    got = read_all(tail)
    assert got[:200] == HEAD.decode().splitlines()  # the start-up block again: the parser sees a new run
    assert iterations(got[200:]) == list(range(31, 121))
    assert tail.counts["rewrites"] == 1 and tail.counts["truncations_unread"] == 1
    assert tail.counts["unread_unknown"] == 1  # what the old run wrote after our last read: not known


def test_a_saved_position_in_a_file_rewritten_by_a_new_run_is_not_resumed(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(HEAD + run(1, 60))
    tail = LogTail(log)
    read_all(tail)
    pos = tail.position_at(log.stat().st_size)
    assert pos is not None and pos.tail_len > 0
    state = tmp_path / "pos.json"
    save_position(state, pos)
    tail.close()
    assert load_position(state) == pos
    log.write_bytes(HEAD + run(31, 120, b"new "))
    again = LogTail(log, resume=load_position(state))
    assert again.counts.get("resume_other_file") == 1 and "resumed" not in again.counts
    assert iterations(read_all(again)[200:]) == list(range(31, 121))
    # A position saved before the tail bytes existed (an older agent's checkpoint) still loads.
    old = {k: v for k, v in pos.__dict__.items() if not k.startswith("tail")}
    state.write_text(str(old).replace("'", '"'))
    assert load_position(state) == TailPosition(**old)


def test_two_copytruncates_between_two_reads_count_the_generation_never_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as w:
        w.write(HEAD + run(1, 20))
        w.flush()
        tail = LogTail(log)
        read_all(tail)
        w.write(run(21, 30))  # not read before the first rotation
        w.flush()
        copytruncate(log)  # .1 = our file, with 21-30 unread
        w.write(run(31, 50))
        w.flush()
        os.replace(log.with_name("train.log.1"), log.with_name("train.log.2"))  # logrotate shifts .1 to .2
        copytruncate(log)  # .1 = 31-50, never read
        w.write(run(51, 60))
        w.flush()
        got = read_all(tail)
    assert iterations(got) == list(range(51, 61))
    c = tail.counts
    gen2 = len(run(31, 50))
    assert c["missed_generations"] == 1 and c["truncations_unread"] == 1
    # our unread rest (21-30, exact: .2 is our file) and the generation in .1, all counted
    assert c["unread_bytes"] == len(run(21, 30)) + gen2 and "unread_unknown" not in c


def test_two_renames_between_two_reads_count_the_generation_never_opened(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(HEAD + run(1, 20))
    tail = LogTail(log)
    read_all(tail)
    with log.open("ab") as w:
        w.write(run(21, 30))  # still read: the old file is drained through its descriptor
    os.rename(log, log.with_name("train.log.1"))
    log.write_bytes(run(31, 50))
    os.rename(log.with_name("train.log.1"), log.with_name("train.log.2"))
    os.rename(log, log.with_name("train.log.1"))  # B (31-50): never opened
    log.write_bytes(run(51, 60))
    got = read_all(tail)
    assert iterations(got) == [*range(21, 31), *range(51, 61)]
    assert tail.counts["missed_generations"] == 1 and tail.counts["unread_bytes"] == len(run(31, 50))


def test_a_log_replaced_by_a_fifo_is_refused_and_never_blocks(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(run(1, 5))
    tail = LogTail(log)
    assert iterations(read_all(tail)) == list(range(1, 6))
    log.unlink()
    os.mkfifo(log)
    got: list[list[str]] = []
    reader = threading.Thread(target=lambda: got.extend(tail.read_lines() for _ in range(5)), daemon=True)
    reader.start()
    reader.join(20)
    blocked = reader.is_alive()
    if blocked:  # the old tail opened the FIFO and waited for a writer: give it one, so it ends
        fd = os.open(log, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert not blocked, "the tail blocked on a FIFO"
    assert got == [[]] * 5 and tail.errors == {"not_regular": 1}  # counted once, not at every poll
    log.unlink()
    log.write_bytes(run(6, 8))  # a regular file again: read
    assert iterations(read_all(tail)) == [6, 7, 8]
