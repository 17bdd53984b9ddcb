"""CudaMarker/CudaApi logic with a stand-in torch and driver (no GPU here): the stream cache, the
driver fast path after torch's first record, and the permanent fallback to the torch API; and
StepHook on that driver path, whose harvester thread must make the training thread's context
current before it queries."""

from __future__ import annotations

import socket
import threading
import time
import types
from pathlib import Path
from typing import Any, cast

import pytest

import perfd.hook.step
import perfd.hook.timing
from perfd.hook import StepHook, wire
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

    def ctx_get(self, out: Any) -> int:  # the markers alone never ask for the context
        raise AssertionError("ctx_get")

    def ctx_set(self, ctx: int) -> int:
        raise AssertionError("ctx_set")

    @staticmethod
    def c_float() -> Any:
        return types.SimpleNamespace(value=0.0)

    @staticmethod
    def c_void_p() -> Any:
        return types.SimpleNamespace(value=None)

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


def test_prime_creates_the_event_once_and_not_ready_is_not_a_failure() -> None:
    torch = fake_torch([])
    api = CudaApi(torch, use_driver=False)
    drv = api.driver = FakeDriver()
    a, b = CudaMarker(api), CudaMarker(api)
    a.prime()
    b.prime()
    a.prime()  # once only
    assert len(a.ev.records) == 1 and a.handle and drv.calls == []
    a.record()  # after priming, straight to the driver
    assert len(a.ev.records) == 1 and drv.calls[-1][0] == "record"

    def not_ready(out: Any, start: int, end: int) -> int:
        return 600  # CUDA_ERROR_NOT_READY: e.g. events on two streams completing out of order

    drv.elapsed = not_ready  # type: ignore[method-assign]
    assert a.elapsed_ns(b) is None and api.name == "driver" and api.driver_errors == 0


# --------------------------------------------------------------------------- StepHook on the driver path

_CTX = 0xC0FFEE


class ThreadAwareDriver(FakeDriver):
    """Like the CUDA driver, each thread has its own current context: a call on a thread without
    the training thread's context fails with CUDA_ERROR_INVALID_CONTEXT (201)."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()
        self.local.ctx = _CTX  # the training thread (this one), where torch made it current
        self.where: list[tuple[str, bool]] = []  # (call, on the main thread)

    def _ok(self, call: str) -> bool:
        self.where.append((call, threading.current_thread() is threading.main_thread()))
        return getattr(self.local, "ctx", None) == _CTX

    def record(self, handle: int, stream: int) -> int:
        return super().record(handle, stream) if self._ok("record") else 201

    def query(self, handle: int) -> int:
        return super().query(handle) if self._ok("query") else 201

    def elapsed(self, out: Any, start: int, end: int) -> int:
        return super().elapsed(out, start, end) if self._ok("elapsed") else 201

    def ctx_get(self, out: Any) -> int:
        out.value = getattr(self.local, "ctx", None)
        return 0

    def ctx_set(self, ctx: int) -> int:
        self.calls.append(("ctx_set", ctx))
        self.local.ctx = ctx
        return 0


@pytest.mark.usefixtures("no_data_marker")
def test_step_hook_on_the_driver_path_harvests_on_its_thread(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    torch = fake_torch([])
    torch.cuda.is_available = lambda: True
    drv = ThreadAwareDriver()
    modes: list[tuple[int, bool]] = []

    def exchange_capture_mode(mode: Any) -> int:
        modes.append((mode._obj.value, threading.current_thread() is threading.main_thread()))
        return 0

    monkeypatch.setattr(perfd.hook.step, "_import_torch", lambda: torch)
    monkeypatch.setattr(perfd.hook.timing, "_load_driver", lambda: drv)
    monkeypatch.setattr(perfd.hook.timing, "_load_capture_mode", lambda: exchange_capture_mode)
    monkeypatch.setattr(perfd.hook.step, "_ALIAS_GAP_NS", 50_000_000)  # see test_step_hook.py
    monkeypatch.delenv("PERFD_HOOK_CUDA_API", raising=False)
    try:
        hook = StepHook(path, warmup_steps=0, rank=0, pool_size=8, harvest_interval_s=0.005)
        assert hook.cuda and hook.counters()["harvester"] == "thread"
        markers = cast(list[CudaMarker], hook._markers)
        assert all(len(m.ev.records) == 0 for m in markers)  # nothing created before the first step
        for _ in range(6):
            with hook.step():
                hook.data_ready()
        # Every event was created (torch's record) once, before the first step; the steps
        # themselves made one driver record each (plus the first step's begin) and nothing else.
        assert all(len(m.ev.records) == 1 for m in markers)
        assert [w for w in drv.where if w[1]] == [("record", True)] * 7
        deadline = time.monotonic() + 10
        while hook.steps_reported < 6:
            assert time.monotonic() < deadline, hook.counters()
            time.sleep(0.005)
        # The harvester made the training thread's context current, then queried and measured;
        # it put itself in thread-local capture mode first, so that its queries cannot break a
        # CUDA graph capture on the training thread (1: CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).
        assert ("ctx_set", _CTX) in drv.calls and modes == [(1, False)]
        assert {w for w in drv.where if not w[1]} == {("query", False), ("elapsed", False)}
        hook.close()
        c = hook.counters()
        assert c["cuda_api"] == "driver" and c["cuda_driver_errors"] == 0 and c["internal_errors"] == 0
        got = received(sock)
        assert [m.step for m in got] == [1, 2, 3, 4, 5, 6]
        assert all(m.step_ns == 1_250_000 and m.compute_ns is None for m in got)  # the driver's elapsed
    finally:
        sock.close()


def test_step_hook_on_the_torch_api_sets_the_device_on_its_thread(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    torch = fake_torch([])
    torch.cuda.is_available = lambda: True
    torch.state["device"] = 3  # local rank 3: the runtime would use device 0 on a new thread
    set_device: list[tuple[int, bool]] = []

    def set_device_here(d: int) -> None:
        set_device.append((d, threading.current_thread() is threading.main_thread()))

    torch._C._cuda_setDevice = set_device_here
    monkeypatch.setattr(perfd.hook.step, "_import_torch", lambda: torch)
    monkeypatch.setenv("PERFD_HOOK_CUDA_API", "torch")
    try:
        hook = StepHook(path, warmup_steps=0, rank=0, pool_size=4, harvest_interval_s=0.005)
        for _ in range(3):
            with hook.step():
                pass
        deadline = time.monotonic() + 10
        while hook.steps_reported < 3:
            assert time.monotonic() < deadline, hook.counters()
            time.sleep(0.005)
        hook.close()
        assert set_device == [(3, False)]  # once, on the harvester thread
        c = hook.counters()
        assert c["cuda_api"] == "torch" and c["internal_errors"] == 0
        assert [m.step_ns for m in received(sock)] == [2_500_000] * 3  # torch's elapsed_time
    finally:
        sock.close()


def received(sock: socket.socket) -> list[wire.StepMsg]:
    got: list[wire.StepMsg] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return got
        got += [wire.unpack_step(d) for k, d in wire.split_records(data)[0] if k in wire.STEP_KINDS]
