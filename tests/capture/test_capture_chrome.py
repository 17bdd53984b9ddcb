"""Kineto / Chrome traces: a small trace written here, plain, gzipped and xz-compressed."""

from __future__ import annotations

import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path

import pytest

from perfd.capture.chrome_trace import analyze_chrome_trace, parse_chrome_trace, read_chrome_trace

# Recent Kineto writes ts relative to baseTimeNanoseconds; older traces used large absolute µs values.
# A base this large checks that sub-µs kernels keep their length after rebasing.
T0 = 5_634_975_433_282.0


def x(cat: str, name: str, ts: float, dur: float, pid: int = 0, tid: int | str = 7,
      **args: object) -> dict[str, object]:
    ev: dict[str, object] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts,
                             "dur": dur}
    if args:
        ev["args"] = args
    return ev


EVENTS: list[dict[str, object]] = [
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    x("cpu_op", "aten::mm", 0, 50, pid=4242, tid=4242),
    x("user_annotation", "ProfilerStep#3", 0, 100, pid=4242, tid=4242),
    x("kernel", "sm90_xmma_gemm_bf16", 10, 20, device=0, stream=7),
    x("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 25, 15, device=0, stream=20),
    x("kernel", "ncclDevKernel_SendRecv", 60, 10, device=0, stream=21),
    x("kernel", "vectorized_elementwise", 30.5, 0.75, device=0, stream=7),  # sub-µs kernel
    x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 5, device=0, stream=7),
    x("gpu_memset", "Memset (Device)", 80, 2, device=0, stream=7),
    x("gpu_user_annotation", "forward", 10, 30, device=0, stream=7),
    x("kernel", "old_style_kernel", 0, 4, pid=1, tid="stream 3"),  # no args.device: pid is the device
    {"ph": "i", "cat": "kernel", "name": "instant", "pid": 0, "ts": T0},  # not a complete event
    x("kernel", "bad", 0, -1, device=0),
]

TRACE: dict[str, object] = {
    "schemaVersion": 1,
    "baseTimeNanoseconds": 1_752_000_000_000_000_000,
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
    "traceEvents": EVENTS,
}


def test_breakdown_from_a_kineto_trace(tmp_path: Path) -> None:
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(TRACE))
    a = analyze_chrome_trace(p)
    assert a.rank == 1 and a.source == str(p)
    d0 = a.device(0)
    assert d0.span_ms == pytest.approx(0.082)  # memcpy at 0 µs → memset ends at 82 µs
    assert d0.kernel_ms == pytest.approx(0.030 + 0.010)  # kernels [10, 40) ∪ [60, 70)
    assert d0.busy_ms == pytest.approx(0.047)  # ... and the copy and set outside them (HTA counts them too)
    assert d0.compute_ms == pytest.approx(0.02075)  # [10, 30) ∪ [30.5, 31.25)
    assert d0.comm_ms == pytest.approx(0.025)
    # AllReduce [25, 40) minus compute → [30, 30.5) ∪ [31.25, 40) = 9.25 µs; SendRecv 10 µs exposed.
    assert d0.comm_exposed_ms == pytest.approx(0.01925)
    assert d0.overlap_ratio == pytest.approx(1 - 19.25 / 25)
    assert d0.sendrecv_ms == pytest.approx(0.010)
    assert d0.memcpy_ms == pytest.approx(0.007)
    assert d0.kernel_count == 4
    small = next(k for k in d0.top_kernels if k.name == "vectorized_elementwise")
    assert small.total_ms == pytest.approx(0.00075, abs=1e-9)
    # The GPU-side annotation wins over the CPU one (no double counting).
    assert [(n.name, n.count) for n in d0.nvtx] == [("forward", 1)]
    d1 = a.device(1)
    assert d1.busy_ms == pytest.approx(0.004)
    assert d1.nvtx == ()


def test_gzip_and_bare_event_list(tmp_path: Path) -> None:
    gz = tmp_path / "trace.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(TRACE).encode()))
    assert analyze_chrome_trace(gz).to_json()["devices"] == analyze_chrome_trace(
        _write(tmp_path / "plain.json", TRACE)).to_json()["devices"]
    bare = parse_chrome_trace(EVENTS)
    assert bare.rank is None and len(bare.kernels) == 5


def test_xz_reads_as_gzip_whatever_it_is_called(tmp_path: Path) -> None:
    body = json.dumps(TRACE).encode()
    gz = tmp_path / "trace.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(body))
    xz = tmp_path / "trace.pt.trace.json"  # no .xz: the magic bytes say it
    xz.write_bytes(lzma.compress(body, preset=9 | lzma.PRESET_EXTREME))
    assert read_chrome_trace(xz).kernels == read_chrome_trace(gz).kernels != []
    assert analyze_chrome_trace(xz).to_json()["devices"] == analyze_chrome_trace(gz).to_json()["devices"]


@pytest.mark.parametrize("pack", [gzip.compress, lzma.compress], ids=["gzip", "xz"])
def test_a_cut_archive_raises_eof_whichever_its_format(tmp_path: Path,
                                                        pack: Callable[[bytes], bytes]) -> None:
    # Large enough that the cut falls inside the compressed data, not in its header.
    packed = pack(json.dumps({**TRACE, "traceEvents": EVENTS * 200}).encode())
    cut = tmp_path / "trace.json.gz"
    cut.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(EOFError, match="ended before the end-of-stream marker"):
        read_chrome_trace(cut)


def test_cpu_annotations_apply_when_there_is_no_gpu_projection() -> None:
    events = [e for e in EVENTS if e.get("cat") != "gpu_user_annotation"]
    data = parse_chrome_trace({"traceEvents": events})
    assert [(r.name, r.device, r.pid) for r in data.nvtx] == [("ProfilerStep#3", None, None)]


def test_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        read_chrome_trace(_write_text(tmp_path / "bad.json", "{"))
    with pytest.raises(ValueError, match="not a Chrome trace"):
        parse_chrome_trace(42)
    assert read_chrome_trace(_write(tmp_path / "empty.json", {})).kernels == []


def test_the_collector_pauses_while_a_trace_is_read_and_comes_back_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused during the read (it allocates ~1M containers and frees none), then as it was before: on
    after a read that worked and after one that raised, off where the process had turned it off; two
    threads reading at once leave it on only once both are done."""
    import gc
    import threading

    from perfd.capture import chrome_trace

    seen: list[bool] = []
    real = chrome_trace.parse_chrome_trace

    def parse(doc: object, source: str = "") -> object:
        seen.append(gc.isenabled())
        return real(doc, source)

    good, bad = _write(tmp_path / "t.json", TRACE), _write_text(tmp_path / "bad.json", "{")
    assert gc.isenabled()
    try:
        monkeypatch.setattr(chrome_trace, "parse_chrome_trace", parse)
        assert read_chrome_trace(good).kernels and seen == [False] and gc.isenabled()
        with pytest.raises(ValueError, match="not valid JSON"):
            read_chrome_trace(bad)
        assert gc.isenabled()
        gc.disable()
        read_chrome_trace(good)
        assert not gc.isenabled()
        gc.enable()
        inside, go = threading.Event(), threading.Event()

        def slow(doc: object, source: str = "") -> object:
            inside.set()
            go.wait(10)
            return real(doc, source)

        monkeypatch.setattr(chrome_trace, "parse_chrome_trace", slow)
        t = threading.Thread(target=read_chrome_trace, args=(good,))
        t.start()
        assert inside.wait(10)
        monkeypatch.setattr(chrome_trace, "parse_chrome_trace", real)
        read_chrome_trace(good)  # a second reader ends while the first still reads
        assert not gc.isenabled()
        go.set()
        t.join(10)
        assert gc.isenabled()
    finally:
        gc.enable()


def _write(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
