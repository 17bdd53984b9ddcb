"""perfd beside dynolog: the Kineto socket taken → trace configs go to dynolog's RPC port.

No dynolog binary is packaged for this machine (Debian/PyPI), so the peer here is a stand-in that
speaks dynolog's RPC as its source defines it (dynolog/src/rpc/SimpleJsonServer.cpp: native int32
length + JSON each way; SimpleJsonServerInl.h: getStatus, getVersion, setKinetOnDemandRequest;
LibkinetoConfigManager.cpp: a pid matches its process or any descendant; a process whose activity
profiler holds a config is busy). The Kineto socket is held by a real bound datagram socket."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.capture_executor import AgentCaptures
from perfd.capture.dynolog import DynologClient, DynologError, DynologKineto, kineto_socket_taken
from perfd.capture.kineto_daemon import build_config, socket_address

LEN = struct.Struct("=i")


class StandInDynolog:
    """dynolog's RPC server logic for on-demand Kineto requests, over a real TCP socket."""

    def __init__(self, processes: dict[int, tuple[int, ...]]) -> None:
        self.processes = processes  # leaf pid -> (leaf, ancestors...), as libkineto registers them
        self.pending: dict[int, str] = {}  # leaf pid -> activity config not yet taken
        self.requests: list[dict[str, Any]] = []
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.srv.getsockname()[1])
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            with conn:
                size = LEN.unpack(conn.recv(4, socket.MSG_WAITALL))[0]
                req = json.loads(conn.recv(size, socket.MSG_WAITALL))
                self.requests.append(req)
                out = self._process(req)
                body = json.dumps(out).encode() if out is not None else b""
                conn.sendall(LEN.pack(len(body)) + body)

    def _process(self, req: dict[str, Any]) -> dict[str, Any] | None:
        if req.get("fn") == "getStatus":
            return {"status": 1}
        if req.get("fn") == "getVersion":
            return {"version": "0.5.0-standin"}
        if req.get("fn") != "setKinetOnDemandRequest":
            return None  # dynolog logs "Unknown RPC call" and answers nothing
        if "config" not in req or "pids" not in req:
            return {"status": "failed"}
        want = set(req["pids"])
        res: dict[str, Any] = {"processesMatched": [], "activityProfilersTriggered": [],
                               "activityProfilersBusy": 0, "eventProfilersTriggered": [],
                               "eventProfilersBusy": 0}
        for leaf, chain in self.processes.items():
            if not want or want & set(chain):
                res["processesMatched"].append(leaf)
                if leaf in self.pending:
                    res["activityProfilersBusy"] += 1
                else:
                    self.pending[leaf] = req["config"]
                    res["activityProfilersTriggered"].append(leaf)
        return res

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.srv.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self.srv.close()
        self._t.join(timeout=5)


@pytest.fixture
def dynolog() -> Iterator[StandInDynolog]:
    d = StandInDynolog({4242: (4242, 4000, 1), 4343: (4343, 4000, 1)})
    yield d
    d.close()


@pytest.fixture
def held_socket() -> Iterator[str]:
    """A Kineto daemon socket name held by another process-like owner (as dynolog holds its own)."""
    name = f"perfd-test-dynolog-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(socket_address(name, None))
    yield name
    s.close()


def test_socket_taken_is_detected(held_socket: str) -> None:
    assert kineto_socket_taken(held_socket)
    assert not kineto_socket_taken(held_socket + "-free")


def test_client_speaks_dynologs_framing(dynolog: StandInDynolog) -> None:
    c = DynologClient(port=dynolog.port)
    assert c.status() == 1 and c.version() == "0.5.0-standin"
    cfg = build_config("/tmp/perfd-x/rank1.json", iterations=3)
    reply = c.request_trace(cfg, [4242], job_id=7)
    assert reply["processesMatched"] == [4242] and reply["activityProfilersTriggered"] == [4242]
    req = dynolog.requests[-1]
    assert req == {"fn": "setKinetOnDemandRequest", "config": cfg, "job_id": 7, "pids": [4242],
                   "process_limit": 1000}
    # The same process again: its profiler still holds the first config.
    again = c.request_trace(cfg, [4242])
    assert again["activityProfilersTriggered"] == [] and again["activityProfilersBusy"] == 1
    with pytest.raises(DynologError, match="reply size 0"):
        c.call({"fn": "noSuchCall"})
    dynolog.close()
    with pytest.raises(DynologError):
        c.status()


def test_arming_through_dynolog(dynolog: StandInDynolog) -> None:
    k = DynologKineto(DynologClient(port=dynolog.port), clock=lambda: 100.0).start()
    configs = {4242: build_config("/tmp/perfd-x/rank0.json", iterations=2),
               4343: build_config("/tmp/perfd-x/rank1.json", iterations=2)}
    arming = k.arm(configs)
    assert arming.answered() == {4242: 100.0, 4343: 100.0} and arming.wait_answered(0)
    assert {r["config"] for r in dynolog.requests if "config" in r} == set(configs.values())
    busy = k.arm({4242: configs[4242]})
    assert busy.answered() == {} and busy.state(4242).busy_polls == 1
    # A pid dynolog does not know: matched nothing, answered nothing.
    assert k.arm({9999: configs[4242]}).answered() == {}


def test_agent_uses_dynolog_when_the_socket_is_taken(tmp_path: Path, held_socket: str,
                                                     dynolog: StandInDynolog) -> None:
    caps = AgentCaptures("j", str(tmp_path), 1 << 30, lambda e: None, kineto=True,
                         kineto_socket=held_socket, dynolog_port=dynolog.port)
    try:
        assert isinstance(caps.kineto, DynologKineto)
        assert dynolog.requests[0] == {"fn": "getStatus"}
    finally:
        caps.close()


def test_agent_turns_kineto_off_when_the_socket_is_taken_and_dynolog_is_silent(
        tmp_path: Path, held_socket: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = int(s.getsockname()[1])
    caps = AgentCaptures("j", str(tmp_path), 1 << 30, lambda e: None, kineto=True,
                         kineto_socket=held_socket, dynolog_port=dead)
    assert caps.kineto is None
