"""NCCL Inspector lines, bus-bandwidth factors and the directory tail.

The two README lines below are the examples in NVIDIA/nccl ext-profiler/inspector/README.md
(format v4.0); the others are synthetic, built from the field list the plugin source writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.nccl.inspector import (
    InspectorReader,
    bus_bw_factor,
    check_busbw,
    expected_busbw_gbs,
    parse_line,
)

README_ALLREDUCE = (
    '{"header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1}, '
    '"metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": '
    '"profiler_plugin", "dump_timestamp_us": 1748030377748202, "hostname": "example-hostname", '
    '"pid": 1639453}, "coll_perf": {"coll": "AllReduce", "coll_sn": 1407, "coll_msg_size_bytes": '
    '17179869184, "coll_exec_time_us": 61974, "coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099}}'
)
README_REDUCESCATTER = (
    '{"header": {"id": "0xe62dedaa97644a", "rank": 4, "n_ranks": 8, "nnodes": 1}, "metadata": '
    '{"dump_timestamp_us": 1752867229276385, "hostname": "example-hostname", "pid": 438776}, '
    '"coll_perf": {"coll": "ReduceScatter", "coll_sn": 1231, "coll_msg_size_bytes": 2147483648, '
    '"coll_exec_time_us": 41057, "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 418.439467, '
    '"coll_busbw_gbs": 366.134533}}'
)


def line(kind: str = "coll", sn: int = 1, comm: str = "0xabc", **perf: Any) -> str:
    header = {"id": comm, "comm_name": "DP Group 0", "rank": 0, "n_ranks": 2, "nnodes": 1}
    meta = {"hostname": "node0", "pid": 100, "dump_timestamp_us": 12}
    if kind == "coll":
        body = {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 268435456,
                "coll_exec_time_us": 930, "coll_timing_source": "kernel_gpu",
                "coll_algobw_gbs": 288.63, "coll_busbw_gbs": 288.63, **perf}
        return json.dumps({"header": header, "metadata": meta, "coll_perf": body})
    body = {"p2p": "Send", "p2p_sn": sn, "p2p_peer": 1, "p2p_msg_size_bytes": 524288,
            "p2p_exec_time_us": 50, "p2p_timing_source": "kernel_gpu", "p2p_algobw_gbs": 10.49,
            "p2p_busbw_gbs": 10.49, **perf}
    return json.dumps({"header": header, "metadata": meta, "p2p_perf": body})


def test_factors_as_in_nccl_tests() -> None:
    assert bus_bw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_bw_factor("all_gather", 8) == bus_bw_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert bus_bw_factor("broadcast", 8) == bus_bw_factor("reduce", 8) == bus_bw_factor("send", 2) == 1.0
    assert bus_bw_factor("all_reduce", 1) is None and bus_bw_factor("broadcast", 1) is None  # nothing moves
    assert bus_bw_factor("mystery", 4) is None and bus_bw_factor("all_reduce", 0) is None


def test_readme_examples_parse_and_their_bandwidth_checks_out() -> None:
    r = parse_line(README_ALLREDUCE, "j", "a.log:1")
    assert (r.op, r.raw_op, r.collective_seq_id, r.bytes, r.group_rank, r.group_size) == \
        ("all_reduce", "AllReduce", 1407, 17179869184, 2, 8)
    assert r.duration_ms == pytest.approx(61.974) and r.comm_id == "0x7f8c496ae9f661"
    assert r.timing_source is None and r.pg_name is None  # absent in that version: absent here
    assert r.time_completed_ns == 1748030377748202000 and r.host == "example-hostname" and r.pid == 1639453
    assert r.rank is None  # the header's rank is within the communicator, not global
    assert check_busbw(r.op, r.bytes or 0, 61974, 8, 485.119099) is True
    rs = parse_line(README_REDUCESCATTER, "j")
    # msg size is one rank's chunk for reduce-scatter: bytes is normalised to the full buffer.
    assert rs.bytes == 2147483648 * 8 and rs.timing_source == "kernel_gpu"
    assert check_busbw("reduce_scatter", rs.bytes, 41057, 8, 366.134533) is True
    assert check_busbw("reduce_scatter", rs.bytes, 41057, 8, 366.134533 * 1.1) is False
    assert check_busbw("mystery", 1, 1, 2, 1.0) is None and check_busbw("all_reduce", 1, 0, 2, 1.0) is None


def test_design_reference_point() -> None:
    # docs/design.md §3: 256 MB fp32 all-reduce on 2 NVLinked H200s, 0.93 ms, ~290 GB/s bus bandwidth.
    assert expected_busbw_gbs("all_reduce", 268435456, 930, 2) == pytest.approx(288.6, abs=0.1)


def test_p2p_line() -> None:
    r = parse_line(line("p2p", sn=8), "j")
    assert (r.op, r.is_p2p, r.p2p_seq_id, r.collective_seq_id, r.peer, r.bytes) == \
        ("send", True, 8, None, 1, 524288)
    assert r.pg_name == "DP Group 0" and r.busbw_gbs == pytest.approx(10.49)


@pytest.mark.parametrize(("text", "reason"), [
    ("not json", "not-json"), ("[1, 2]", "not-an-object"), ('{"coll_perf": {}}', "no-header"),
    ('{"header": {}, "metadata": {}}', "no-perf"),
    ('{"header": {}, "coll_perf": {"coll": "AllReduce"}}', "bad-field:coll_sn"),
    ('{"header": {}, "coll_perf": {"coll": 3}}', "bad-field:coll"),
])
def test_malformed_lines_have_reasons(text: str, reason: str) -> None:
    from perfd.collectors.nccl.inspector import InspectorLineError

    with pytest.raises(InspectorLineError) as info:
        parse_line(text, "j")
    assert info.value.reason == reason


def test_reader_tails_files_that_appear_and_counts_problems(tmp_path: Path) -> None:
    (tmp_path / "node0-pid100.log").write_text(line(sn=1) + "\n" + "garbage\n" + line(sn=2) + "\n")
    reader = InspectorReader(tmp_path, "j", rescan_s=0.0)
    assert [r.collective_seq_id for r in reader.read()] == [1, 2]
    assert reader.counts["malformed:not-json"] == 1 and reader.issues[0].line_no == 2
    # A new process appears; the first file grows with a partial line, then a duplicate.
    (tmp_path / "node0-pid200.log").write_text(line("p2p", sn=1) + "\n")
    with (tmp_path / "node0-pid100.log").open("a") as fh:
        fh.write(line(sn=2) + "\n" + line(sn=3)[:40])
    got = reader.read()
    # sn=2 again is a duplicate, sn=3 is not complete yet: only the new file's record.
    assert [(r.is_p2p, r.p2p_seq_id) for r in got] == [(True, 1)]
    assert reader.counts["duplicate"] == 1
    with (tmp_path / "node0-pid100.log").open("a") as fh:
        fh.write(line(sn=3)[40:] + "\n")
    assert [r.collective_seq_id for r in reader.read()] == [3]
    assert got[0].provenance is not None and got[0].provenance.detail == "inspector:node0-pid200.log:1"


def test_reader_flags_bandwidth_that_does_not_add_up(tmp_path: Path) -> None:
    (tmp_path / "h-pid1.log").write_text(line(sn=1, coll_busbw_gbs=999.0) + "\n")
    reader = InspectorReader(tmp_path, "j")
    assert len(reader.read()) == 1 and reader.counts["busbw_mismatch"] == 1


def test_reader_from_start_false_and_missing_dir(tmp_path: Path) -> None:
    (tmp_path / "h-pid1.log").write_text(line(sn=1) + "\n")
    reader = InspectorReader(tmp_path, "j", from_start=False, rescan_s=0.0)
    assert reader.read() == []
    (tmp_path / "h-pid2.log").write_text(line(sn=1) + "\n")  # new after start: read from its start
    assert len(reader.read()) == 1
    gone = InspectorReader(tmp_path / "nope", "j")
    assert gone.read() == [] and gone.counts["dir_missing"] >= 1


def test_deleted_file_is_drained_then_dropped(tmp_path: Path) -> None:
    path = tmp_path / "h-pid1.log"
    path.write_text(line(sn=1) + "\n")
    reader = InspectorReader(tmp_path, "j", rescan_s=0.0)
    assert len(reader.read()) == 1
    with path.open("a") as fh:
        fh.write(line(sn=2) + "\n")
    path.unlink()
    assert [r.collective_seq_id for r in reader.read()] == [2]
    assert reader.counts["files_gone"] == 1


# What NCCL 2.28.9's plugin writes, from its source (ext-profiler/inspector at v2.28.9-1): no
# comm_name, a sequence number per op type, "Invalid" for ops its name table lacks, and -1 x count
# as the size of uint8/bool collectives.
def v2289(coll: str, sn: int, size: int = 268435456, exec_us: int = 930, busbw: float = 288.64) -> str:
    return json.dumps({
        "header": {"id": "0x1234abcd5678ef", "rank": 0, "n_ranks": 2, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "v2.28.9-1",
                     "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": 1795305705478021,
                     "hostname": "node0", "pid": 7101},
        "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": exec_us,
                      "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": busbw, "coll_busbw_gbs": busbw}})


def test_sequence_numbers_are_per_op_type(tmp_path: Path) -> None:
    # A DDP start-up: broadcast #0, then all-reduces #0, #1. All three are distinct ops.
    (tmp_path / "node0-pid7101.log").write_text(
        "\n".join([v2289("Broadcast", 0, busbw=288.64), v2289("AllReduce", 0), v2289("AllReduce", 1),
                   v2289("AllReduce", 1)]) + "\n")
    reader = InspectorReader(tmp_path, "j", rescan_s=0.0)
    got = [(r.op, r.collective_seq_id) for r in reader.read()]
    assert got == [("broadcast", 0), ("all_reduce", 0), ("all_reduce", 1)]
    assert reader.counts["duplicate"] == 1  # only the repeated all-reduce #1


def test_invalid_op_name_and_implausible_size(tmp_path: Path) -> None:
    unknown = parse_line(v2289("Invalid", 3, size=1 << 20, exec_us=10, busbw=1.0), "j")
    assert unknown.op == "unknown" and unknown.raw_op == "Invalid" and unknown.duration_ms == 0.01
    bogus = parse_line(v2289("AllReduce", 4, size=18446744073709550616, busbw=9.9e9), "j")
    assert bogus.bytes is None and bogus.busbw_gbs is None and bogus.algbw_gbs is None
    assert bogus.duration_ms == 0.93  # the time is still the kernels' own
    (tmp_path / "n-pid1.log").write_text(v2289("Invalid", 3, size=1 << 20, exec_us=10, busbw=1.0) + "\n"
                                         + v2289("AllReduce", 4, size=18446744073709550616) + "\n")
    reader = InspectorReader(tmp_path, "j", rescan_s=0.0)
    assert len(reader.read()) == 2
    assert reader.counts["unknown_op"] == 1 and reader.counts["implausible_size"] == 1
    assert "busbw_mismatch" not in reader.counts
