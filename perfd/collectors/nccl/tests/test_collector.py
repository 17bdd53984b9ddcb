"""NcclCollector end to end, with fake ranks that answer the FIFO the way torch does."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.nccl import NcclCollector
from perfd.collectors.nccl.tests.synth import T0, dump, entry, pickled


class FakeRank:
    """Opens its FIFO like ProcessGroupNCCL (O_RDONLY|O_NONBLOCK) and dumps when a byte arrives."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.pipe = directory / f"frp_{rank}.pipe"
        self.out = directory / f"fr_dump_{rank}"
        os.mkfifo(self.pipe)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        self.entries: list[dict[str, Any]] = []

    def poll(self) -> bool:
        try:
            got = os.read(self.fd, 128)
        except BlockingIOError:
            return False
        if got:
            self.out.write_bytes(pickled(dump(self.entries)))
        return bool(got)

    def close(self) -> None:
        os.close(self.fd)


def config(tmp_path: Path, **fr: Any) -> dict[str, Any]:
    return {"job": "j", "flight_recorder": {"pipe_prefix": f"{tmp_path}/frp_",
                                            "dump_prefix": f"{tmp_path}/fr_dump_", "interval_s": 0.001,
                                            "hang_threshold_s": 60, **fr}}


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="configure"):
        NcclCollector({})
    with pytest.raises(ValueError, match="unknown"):
        NcclCollector({"flight_recorder": {"pipe_prefix": "a", "dump_prefix": "b", "oops": 1}})
    with pytest.raises(ValueError, match="required"):
        NcclCollector({"flight_recorder": {"pipe_prefix": "a"}})
    with pytest.raises(ValueError, match="> 0"):
        NcclCollector(config(tmp_path, interval_s=0))
    c = NcclCollector({"inspector": {"dir": str(tmp_path / "later")}})
    caps = c.probe()
    assert caps.available and "does not exist yet" in caps.reason
    assert caps.features == {"flight_recorder": False, "inspector": True}


def test_trigger_read_dedupe_and_hang_event(tmp_path: Path) -> None:
    r0, r1 = FakeRank(tmp_path, 0), FakeRank(tmp_path, 1)
    c = NcclCollector(config(tmp_path))
    assert c.probe().available
    c.start()
    try:
        r0.entries = [entry(i) for i in range(1, 4)]
        r1.entries = [entry(i) for i in range(1, 4)]
        now = (T0 + 10**9) / 1e9
        out = c.collect(now)  # nothing dumped yet; triggers both ranks
        assert out.collectives == [] and r0.poll() and r1.poll()
        time.sleep(0.002)
        out = c.collect(now)
        assert sorted((r.rank, r.collective_seq_id) for r in out.collectives) == \
            [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
        assert out.events == []
        # Rank 0 waits in all_reduce #4 for 1000 s; rank 1 never got there.
        r0.entries = [*r0.entries, entry(4, state="scheduled", retired=False, created_ns=T0)]
        assert r0.poll() and r1.poll()
        later = (T0 + 10**12) / 1e9
        out = c.collect(later)
        assert out.collectives == []  # nothing new became final
        (ev,) = out.events
        assert ev["kind"] == "nccl_hang" and ev["severity"] == "critical"
        assert ev["payload"]["ranks_not_joined"] == [1] and ev["payload"]["stuck_ranks"] == [0]
        assert ev["labels"]["ranks_not_joined"] == "1" and ev["labels"]["op"] == "all_reduce"
        assert "never reached it" in ev["text"]
        time.sleep(0.002)
        r0.poll()
        r1.poll()
        assert c.collect(later).events == []  # the same hang is reported once
    finally:
        r0.close()
        r1.close()


def test_rank_gone_is_counted_not_raised(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "frp_0.pipe")  # the rank died: FIFO left behind, no reader
    (tmp_path / "fr_dump_1").write_bytes(b"\x80\x02cos\nsystem\nX\x01\x00\x00\x00xq\x85R.")
    c = NcclCollector(config(tmp_path, read_existing=True))
    c.start()
    out = c.collect(time.time())
    assert out.collectives == [] and out.events == []
    assert c.errors["fr_trigger_no_reader"] == 1
    assert c.errors["fr_dump:refused_global"] == 1


def test_inspector_records_flow_through(tmp_path: Path) -> None:
    d = tmp_path / "insp"
    d.mkdir()
    rec = {"header": {"id": "0x1", "rank": 0, "n_ranks": 2, "nnodes": 1},
           "metadata": {"hostname": "h", "pid": 5, "dump_timestamp_us": 1},
           "coll_perf": {"coll": "AllGather", "coll_sn": 3, "coll_msg_size_bytes": 1 << 20,
                         "coll_exec_time_us": 100, "coll_timing_source": "kernel_gpu",
                         "coll_algobw_gbs": 20.97, "coll_busbw_gbs": 10.49}}
    (d / "h-pid5.log").write_text(json.dumps(rec) + "\nnot json\n")
    c = NcclCollector({"job": "j", "inspector": {"dir": str(d)}})
    c.start()
    out = c.collect(time.time())
    (r,) = out.collectives
    assert (r.source, r.op, r.bytes, r.job) == ("nccl_inspector", "all_gather", 2 << 20, "j")
    assert c.errors == {"inspector:malformed:not-json": 1}
    c.stop()


def test_sample_yaml_is_a_valid_config() -> None:
    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[1] / "sample.yaml").read_text())
    c = NcclCollector(cfg)
    assert c.config.flight_recorder is not None and c.config.inspector is not None
    assert c.config.flight_recorder.interval_s == 10
