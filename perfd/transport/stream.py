"""One agent stream's state on the aggregator, and the pacing of the Acks it sends back.

Apart from the server (perfd.transport.server) so that the admission checks
(perfd.transport.admission) can read a stream's state without importing the server that calls them.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import Series


class AgentStream:
    """One agent stream's state, shared by its reader task and its response generator."""

    def __init__(self, peer: str, identity: str, now: float, token_generation: int | None = None) -> None:
        self.peer = peer
        self.identity = identity
        self.agent_id: str | None = None
        self.epoch = ""
        self.series: dict[int, Series] = {}
        # Ids the Hello (re)defined, reported in the first delivered batch's new_series: after a
        # reconnect with a new spool epoch the same id may name another series.
        self.hello_ids: list[int] = []
        self.commands: deque[pb.Command] = deque()
        self.ack_due = 0
        self.ack_sent = -1  # so that the Ack answering the Hello goes out even when it is 0
        self.ack_forced = False  # a Heartbeat asks for an Ack even when nothing new is covered
        self.last_ack_at = 0.0
        self.ack_timer: asyncio.TimerHandle | None = None  # wakes the stream when its Ack is due
        self.opened_at = now
        self.last_msg_at = now  # loop time of the last message from the agent
        self.closed = False
        self.close_reason: tuple[grpc.StatusCode, str] | None = None
        self.token_generation = token_generation  # of the bearer token it authenticated with
        self.wake = asyncio.Event()

    def close(self, code: grpc.StatusCode, reason: str) -> None:
        if not self.closed:
            self.close_reason = (code, reason)
            self.closed = True
        self.wake.set()

    def ack_now(self, loop: asyncio.AbstractEventLoop, ack_interval_s: float) -> bool:
        """True when the stream's next Ack may go now; else a timer (one per stream) wakes the
        stream when it may."""
        if self.ack_timer is not None:
            return False
        wait = self.last_ack_at + ack_interval_s - loop.time()
        if wait <= 0:
            return True
        self.ack_timer = loop.call_later(wait, self._ack_due)
        return False

    def _ack_due(self) -> None:
        self.ack_timer = None
        self.wake.set()
