"""FIFO triggering, dump reading (complete files only), the job environment, and a real torch pickle."""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfd.collectors.nccl.tests.synth import dump, entry, pickled
from perfd.collectors.nccl.trigger import DumpReader, find_pipes, trigger_dump
from perfd.core.flight_recorder_env import env_for_flight_recorder


def test_env_sets_old_and_new_names_and_timing_only_on_request(tmp_path: Path) -> None:
    env = env_for_flight_recorder(tmp_path, buffer_entries=500)
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{tmp_path}/frp_"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/fr_dump_"
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"
    assert "TORCH_NCCL_ENABLE_TIMING" not in env
    assert env_for_flight_recorder(tmp_path, timing=True)["TORCH_NCCL_ENABLE_TIMING"] == "1"
    with pytest.raises(ValueError):
        env_for_flight_recorder(tmp_path, buffer_entries=0)


def test_trigger_statuses(tmp_path: Path) -> None:
    assert trigger_dump(tmp_path / "frp_0.pipe") == "missing"
    regular = tmp_path / "frp_1.pipe"
    regular.write_bytes(b"keep")
    assert trigger_dump(regular) == "not_fifo"
    assert regular.read_bytes() == b"keep"  # never written into
    fifo = tmp_path / "frp_2.pipe"
    os.mkfifo(fifo)
    assert trigger_dump(fifo) == "no_reader"  # ENXIO: nobody has it open; does not block
    # A reader the way torch opens it: O_RDONLY | O_NONBLOCK, polled later.
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert trigger_dump(fifo) == "sent"
        assert os.read(rfd, 128) == b"1"
        # Fill the pipe: the next trigger cannot block and reports busy.
        wfd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            while True:
                os.write(wfd, b"x" * 4096)
        except BlockingIOError:
            pass
        finally:
            os.close(wfd)
        assert trigger_dump(fifo) == "busy"
    finally:
        os.close(rfd)
    link = tmp_path / "frp_3.pipe"
    link.symlink_to(fifo)
    assert trigger_dump(link) == "not_fifo"  # a link is never followed


def test_find_pipes_takes_rank_suffixed_fifos_only(tmp_path: Path) -> None:
    for name in ("frp_0.pipe", "frp_12.pipe", "frp_x.pipe", "other_1.pipe", "frp_3"):
        (tmp_path / name).write_bytes(b"")
    assert find_pipes(f"{tmp_path}/frp_") == {0: f"{tmp_path}/frp_0.pipe", 12: f"{tmp_path}/frp_12.pipe"}


def test_reader_returns_each_dump_once_and_rereads_rewrites(tmp_path: Path) -> None:
    prefix = f"{tmp_path}/fr_dump_"
    old = tmp_path / "fr_dump_0"
    old.write_bytes(pickled(dump([entry(1)])))  # left by an earlier job: skipped
    reader = DumpReader(prefix, job="j")
    assert reader.read_new_dumps() == []
    (tmp_path / "fr_dump_1").write_bytes(pickled(dump([entry(1), entry(2)])))
    (tmp_path / "fr_dump_1.tmp").write_bytes(b"ignored")
    got = reader.read_new_dumps()
    assert [(d.rank, len(d.entries)) for d in got] == [(1, 2)]
    assert got[0].entries[0].record.job == "j"
    assert reader.read_new_dumps() == []
    old.write_bytes(pickled(dump([entry(1), entry(2), entry(3)])))  # rank 0 dumps again, in place
    assert [(d.rank, len(d.entries)) for d in reader.read_new_dumps()] == [(0, 3)]
    assert DumpReader(prefix, read_existing=True).read_new_dumps()[0].rank == 0


def test_partial_file_is_retried_then_read(tmp_path: Path) -> None:
    reader = DumpReader(f"{tmp_path}/fr_dump_")
    data = pickled(dump([entry(i) for i in range(50)]))
    path = tmp_path / "fr_dump_0"
    path.write_bytes(data[: len(data) // 2])  # torch is still writing
    assert reader.read_new_dumps() == []
    assert reader.counts["partial_retry"] == 1
    assert reader.read_new_dumps() == []  # same bytes fail twice: given up until the file changes
    assert reader.counts["corrupt"] == 1
    assert reader.read_new_dumps() == []
    assert reader.counts == {"partial_retry": 1, "corrupt": 1}
    with path.open("ab") as fh:
        fh.write(data[len(data) // 2:])
    (d,) = reader.read_new_dumps()
    assert len(d.entries) == 50 and reader.counts["dumps"] == 1


def test_refused_pickle_is_counted_and_not_retried(tmp_path: Path) -> None:
    reader = DumpReader(f"{tmp_path}/fr_dump_")
    (tmp_path / "fr_dump_0").write_bytes(b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00idq\x85R.")
    assert reader.read_new_dumps() == [] and reader.read_new_dumps() == []
    assert reader.counts == {"refused_global": 1}


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    reader = DumpReader(f"{tmp_path}/fr_dump_", max_bytes=100)
    (tmp_path / "fr_dump_0").write_bytes(pickled(dump([entry(i) for i in range(20)])))
    assert reader.read_new_dumps() == [] and reader.counts == {"too_large": 1}


_GLOO_DUMP = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp

    def run(rank, out, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        t = torch.ones(1000)
        for _ in range(3):
            dist.all_reduce(t)
        dist.broadcast(torch.ones(10, dtype=torch.bfloat16), 0)
        dist.all_reduce(t, group=dist.new_group([0, 1]))
        dist.barrier()
        data = torch._C._distributed_c10d._dump_fr_trace()
        with open(f"{out}/fr_dump_{rank}", "wb") as fh:
            fh.write(data)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
""")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (CPU build is enough)")
def test_a_dump_written_by_torch_itself_loads(tmp_path: Path) -> None:
    """torch's C++ pickler (Gloo's Flight Recorder, CPU) -> the restricted unpickler; run in a child
    process so that this test module imports no torch."""
    script = tmp_path / "gen.py"
    script.write_text(_GLOO_DUMP)
    port = str(29000 + os.getpid() % 1000)
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), port], env=env,
                          capture_output=True, text=True, timeout=120)
    if not (tmp_path / "fr_dump_0").exists():
        pytest.skip(f"this torch build wrote no Gloo Flight Recorder dump: {proc.stderr[-500:]}")
    raw0 = (tmp_path / "fr_dump_0").read_bytes()
    assert b"\x80\x02" == raw0[:2]
    dumps = DumpReader(f"{tmp_path}/fr_dump_", job="j", read_existing=True).read_new_dumps()
    assert [d.rank for d in dumps] == [0, 1]
    recs = [e.record for e in dumps[0].entries]
    assert [r.op for r in recs] == ["all_reduce"] * 3 + ["broadcast", "all_reduce", "barrier"]
    assert recs[0].bytes == 4000 and recs[0].dtype == "Float" and recs[3].bytes == 20
    assert [r.collective_seq_id for r in recs[:4]] == [1, 2, 3, 4] and recs[4].pg_id == 1
    assert recs[0].duration_ms is None and dumps[0].entries[0].user_frame is not None
    assert pickle.loads(raw0)["version"] == dumps[0].version  # same content as the plain loader
