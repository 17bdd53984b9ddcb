"""LogTail against a real file that the test appends to, truncates and rotates."""

from __future__ import annotations

import os
from pathlib import Path

from perfd.collectors.megatron import LogTail
from perfd.collectors.megatron.tail import HEAD_BYTES, load_position, save_position


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def test_partial_line_is_held_until_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"one\ntw")
    tail = LogTail(log)
    assert tail.read_lines() == ["one"]
    assert tail.read_lines() == []
    append(log, b"o\nthree")
    assert tail.read_lines() == ["two"]
    append(log, b"\n")
    assert tail.read_lines() == ["three"]
    assert tail.counts["lines"] == 3 and tail.errors == {}


def test_utf8_character_split_across_writes(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    encoded = "loss é\n".encode()
    log.write_bytes(encoded[:-2])  # ends inside the two-byte "é"
    tail = LogTail(log)
    assert tail.read_lines() == []
    append(log, encoded[-2:])
    assert tail.read_lines() == ["loss é"]


def test_invalid_bytes_are_replaced_and_crlf_kept_for_the_parser(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"bad \xff\xfe byte\r\n")
    assert LogTail(log).read_lines() == ["bad \ufffd\ufffd byte\r"]


def test_from_start_false_skips_existing_content(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"old 1\nold 2\n")
    tail = LogTail(log, from_start=False)
    assert tail.read_lines() == []
    append(log, b"new\n")
    assert tail.read_lines() == ["new"]


def test_missing_file_is_counted_then_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    tail = LogTail(log, from_start=False)
    assert tail.read_lines() == []
    assert tail.errors["missing"] >= 1
    log.write_bytes(b"first line of a new file\n")
    assert tail.read_lines() == ["first line of a new file"]


def test_max_bytes_bounds_one_call(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"".join(b"line %03d\n" % i for i in range(100)))  # 9 bytes a line
    tail = LogTail(log)
    first = tail.read_lines(max_bytes=95)
    assert first == [f"line {i:03d}" for i in range(10)]  # 95 bytes: 10 lines and a partial
    rest: list[str] = []
    while batch := tail.read_lines(max_bytes=95):
        rest += batch
    assert first + rest == [f"line {i:03d}" for i in range(100)]


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"a\nb\npartial")
    tail = LogTail(log)
    assert tail.read_lines() == ["a", "b"]
    log.write_bytes(b"")  # truncate in place (copytruncate, or "> train.log")
    append(log, b"c\n")
    assert tail.read_lines() == ["c"]  # the stale partial line is dropped, not glued to "c"
    assert tail.counts["truncations"] == 1 and tail.counts["partial_dropped"] == 1
    append(log, b"d\n")
    assert tail.read_lines() == ["d"]
    assert tail.counts["truncations"] == 1


def test_rotation_drains_the_old_file_first(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"1\n2\n")
    tail = LogTail(log)
    assert tail.read_lines() == ["1", "2"]
    append(log, b"3\nunterminated")  # written before the rotation, not yet read
    os.rename(log, tmp_path / "train.log.1")
    assert tail.read_lines() == ["3"]  # path missing for now: keep reading the old file
    log.write_bytes(b"new 1\nnew 2\n")
    assert tail.read_lines() == ["unterminated", "new 1", "new 2"]
    assert tail.counts["rotations"] == 1 and tail.counts["partial_at_rotation"] == 1
    append(log, b"new 3\n")
    assert tail.read_lines() == ["new 3"]
    append(tmp_path / "train.log.1", b"late write to the old file\n")
    assert tail.read_lines() == []  # the old file is no longer followed
    assert tail.errors == {}


def test_rotation_with_a_small_budget_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    tail = LogTail(log)
    append(log, b"".join(b"old %02d\n" % i for i in range(20)))
    os.rename(log, tmp_path / "train.log.1")
    log.write_bytes(b"".join(b"new %02d\n" % i for i in range(20)))
    got: list[str] = []
    for _ in range(100):
        got += tail.read_lines(max_bytes=13)
    assert got == [f"old {i:02d}" for i in range(20)] + [f"new {i:02d}" for i in range(20)]


def test_overlong_partial_line_is_handed_over(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"x" * 5000)
    tail = LogTail(log, max_line_bytes=1000)
    assert tail.read_lines() == ["x" * 5000]
    assert tail.counts["partial_overlong"] == 1


def test_unreadable_path_never_raises(tmp_path: Path) -> None:
    tail = LogTail(tmp_path)  # a directory: not a regular file, refused (counted once per file)
    assert tail.read_lines() == []
    assert tail.read_lines() == []
    assert tail.errors == {"not_regular": 1}
    tail.close()
    gone = LogTail(tmp_path / "missing.log")  # a missing file: counted at every try
    assert gone.read_lines() == [] and gone.read_lines() == []
    assert gone.errors == {"missing": 2}


# --- resuming at a saved position -------------------------------------------------------------


def _consumed(tail: LogTail, n: int) -> tuple[list[str], int]:
    """Read lines, keep the first ``n`` as 'acknowledged', return them and the resume offset."""
    got = tail.read_lines_at()
    offset = got[n - 1][1]
    assert offset is not None
    return [line for line, _ in got[:n]], offset + 1


def test_resume_restarts_after_the_last_acknowledged_line_nothing_lost_nothing_re_read(
    tmp_path: Path,
) -> None:
    log, state = tmp_path / "train.log", tmp_path / "tail.json"
    lines = [f"iteration {i}" for i in range(1, 121)]
    log.write_bytes("".join(f"{x}\n" for x in lines[:50]).encode())
    first = LogTail(log)
    acked, offset = _consumed(first, 40)  # 10 lines read but never acknowledged
    pos = first.position_at(offset)
    assert pos is not None
    save_position(state, pos)
    first.close()
    append(log, "".join(f"{x}\n" for x in lines[50:]).encode())  # written while "down"

    second = LogTail(log, from_start=False, resume=load_position(state))
    rest = second.read_lines()
    assert acked + rest == lines  # 0 lost, 0 read twice
    assert second.counts["resumed"] == 1


def test_a_re_created_log_is_read_anew(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"old 1\nold 2\n")
    tail = LogTail(log)
    _, offset = _consumed(tail, 2)
    pos = tail.position_at(offset)
    assert pos is not None
    tail.close()
    log.unlink()
    log.write_bytes(b"new 1\nnew 2\nnew 3\n")  # another file (inode may even be reused)
    again = LogTail(log, resume=pos)
    assert again.read_lines() == ["new 1", "new 2", "new 3"]
    assert again.counts["resume_other_file"] == 1


def test_a_log_rewritten_in_place_with_another_head_is_read_anew(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"run A line 1\nrun A line 2\n")
    tail = LogTail(log)
    _, offset = _consumed(tail, 1)
    pos = tail.position_at(offset)
    assert pos is not None
    tail.close()
    with log.open("r+b") as fh:  # same inode, same length, other bytes: not the file we read
        fh.write(b"run B line 1\nrun B line 2\n")
    again = LogTail(log, resume=pos)
    assert again.read_lines() == ["run B line 1", "run B line 2"]
    assert again.counts["resume_other_file"] == 1


def test_a_log_shorter_than_the_saved_offset_is_read_anew(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"a\nb\nc\n")
    tail = LogTail(log)
    _, offset = _consumed(tail, 3)
    pos = tail.position_at(offset)
    assert pos is not None
    tail.close()
    os.truncate(log, 0)
    append(log, b"a\n")
    assert LogTail(log, resume=pos).read_lines() == ["a"]


def test_head_hash_covers_only_bytes_before_the_offset(tmp_path: Path) -> None:
    """A position taken early in a growing file still matches once more is appended."""
    log = tmp_path / "train.log"
    log.write_bytes(b"x\n")
    tail = LogTail(log)
    _, offset = _consumed(tail, 1)
    pos = tail.position_at(offset)
    assert pos is not None and pos.head_len == 2
    append(log, b"y" * (2 * HEAD_BYTES) + b"\nz\n")
    resumed = LogTail(log, resume=pos)
    assert resumed.read_lines()[-1] == "z" and resumed.counts["resumed"] == 1


def test_unreadable_or_malformed_state_file_means_no_position(tmp_path: Path) -> None:
    state = tmp_path / "tail.json"
    assert load_position(state) is None  # missing
    for bad in (
        "{",
        "[]",
        '{"dev": 1}',
        '{"dev": -1, "ino": 1, "head_len": 0, "head_sha256": "", "offset": 0}',
        '{"dev": 1, "ino": 1, "head_len": 9000, "head_sha256": "", "offset": 9000}',
    ):
        state.write_text(bad)
        assert load_position(state) is None, bad


def test_far_behind_it_skips_ahead_counts_every_byte_and_resumes_on_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, b"start\n")
    tail = LogTail(log, max_lag_bytes=4096)
    assert tail.read_lines() == ["start"]
    lines = [f"line {i:06d} " + "x" * 50 for i in range(2000)]  # ~120 kB appended at once
    payload = "".join(f"{ln}\n" for ln in lines).encode()
    append(log, payload)
    got: list[str] = []
    while True:
        more = tail.read_lines(max_bytes=1 << 20)
        if not more:
            break
        got.extend(more)
    assert tail.counts["skips"] == 1
    assert got and set(got) <= set(lines)  # every line handed over is whole
    assert got == lines[-len(got):]  # and they are the newest, in order
    read = sum(len(g) + 1 for g in got)
    assert tail.counts["skipped_bytes"] + read == len(payload)  # nothing passed over uncounted
    assert read <= 4096 // 2


def test_a_tail_that_keeps_up_never_skips(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    tail = LogTail(log, max_lag_bytes=4096)
    for i in range(200):
        append(log, f"line {i}\n".encode())
        assert tail.read_lines() == [f"line {i}"]
    assert "skips" not in tail.counts
