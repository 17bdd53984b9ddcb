"""CudaMarker/CudaApi logic with a stand-in torch and driver (no GPU here): the stream cache, the
driver fast path after torch's first record, and the permanent fallback to the torch API."""

from __future__ import annotations

import types
from typing import Any

from perfd.hook.timing import CudaApi, CudaMarker


class FakeEvent:
    next_handle = 100

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.cuda_event = 0
        self.records: list[Any] = []
        self.t = 0.0

    def record(self, stream: Any) -> None:
        if not self.cuda_event:
            FakeEvent.next_handle += 1
            self.cuda_event = FakeEvent.next_handle
        self.records.append(stream)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return 2.5  # ms


def fake_torch(calls: list[str]) -> Any:
    state = {"stream": 7, "device": 0}

    def get_stream(dev: int) -> tuple[int, int, int]:
        calls.append("getCurrentStream")
        return state["stream"], dev, 1

    def make_stream(stream_id: int, device_index: int, device_type: int) -> tuple[str, int]:
        calls.append("Stream()")
        return ("stream", stream_id)

    c = types.SimpleNamespace(_cuda_getDevice=lambda: state["device"], _cuda_getCurrentStream=get_stream,
                              _cuda_getCurrentRawStream=lambda dev: 0xABC0 + state["stream"])
    cuda = types.SimpleNamespace(Event=FakeEvent, Stream=make_stream)
    return types.SimpleNamespace(_C=c, cuda=cuda, state=state)


class FakeDriver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.record_rc = 0
        self.query_rc = 0

    def record(self, handle: int, stream: int) -> int:
        self.calls.append(("record", (handle, stream)))
        return self.record_rc

    def query(self, handle: int) -> int:
        self.calls.append(("query", handle))
        return self.query_rc

    def elapsed(self, out: Any, start: int, end: int) -> int:
        self.calls.append(("elapsed", (start, end)))
        out.value = 1.25
        return 0

    @staticmethod
    def c_float() -> Any:
        return types.SimpleNamespace(value=0.0)

    @staticmethod
    def byref(x: Any) -> Any:
        return x


def test_torch_path_caches_the_stream_object() -> None:
    calls: list[str] = []
    torch = fake_torch(calls)
    api = CudaApi(torch, use_driver=False)
    a, b = CudaMarker(api), CudaMarker(api)
    for _ in range(3):
        a.record()
        b.record()
    assert calls.count("Stream()") == 1 and calls.count("getCurrentStream") == 6
    torch.state["stream"] = 9  # the loop switched streams: rebuilt once
    a.record()
    assert calls.count("Stream()") == 2 and a.ev.records[-1] == ("stream", 9)
    assert a.query() and a.elapsed_ns(b) == 2_500_000 and api.name == "torch"


def test_driver_fast_path_after_the_first_torch_record() -> None:
    torch = fake_torch([])
    api = CudaApi(torch, use_driver=False)
    drv = api.driver = FakeDriver()
    a, b = CudaMarker(api), CudaMarker(api)
    a.record()  # first: torch creates the event
    assert len(a.ev.records) == 1 and drv.calls == [] and a.handle == a.ev.cuda_event
    a.record()
    b.record()
    b.record()
    assert len(a.ev.records) == 1
    assert drv.calls == [("record", (a.handle, 0xABC7)), ("record", (b.handle, 0xABC7))]
    assert a.query() and a.elapsed_ns(b) == 1_250_000
    drv.query_rc = 600  # CUDA_ERROR_NOT_READY
    assert a.query() is False
    assert api.name == "driver" and api.driver_errors == 0


def test_unexpected_driver_result_falls_back_for_good() -> None:
    torch = fake_torch([])
    api = CudaApi(torch, use_driver=False)
    drv = api.driver = FakeDriver()
    m = CudaMarker(api)
    m.record()
    drv.record_rc = 201  # CUDA_ERROR_INVALID_CONTEXT
    m.record()  # falls back to torch within the same call
    assert len(m.ev.records) == 2 and api.driver is None and api.driver_errors == 1
    assert api.last_driver_error == 201 and api.name == "torch"
    m.record()
    assert len(m.ev.records) == 3 and len(drv.calls) == 1
