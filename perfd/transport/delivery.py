"""What once-only delivery rests on across streams and restarts: the dedupe state
(:class:`SeqTracker`, the highest seq accepted per agent and spool epoch) and the contract of the
journal a durable aggregator writes (:class:`IngestJournal`).

Apart from the server (perfd.transport.server) because both outlive any one server: the dedupe
state is exported and loaded again across a restart, and the journal is implemented in
perfd.aggregator.durable.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from perfd.transport.gen import perfd_pb2 as pb


@dataclass(frozen=True)
class Kept:
    """What the receiver of a batch (the aggregator's ``on_batch``) kept of it, for the journal: a
    durable aggregator stores nothing it refused (a job's refused step records, a
    stranger's events). Indices into the batch's steps, events and collectives, its job info's job
    names; None: all of that part."""

    steps: Sequence[int] | None = None
    events: Sequence[int] | None = None
    collectives: Sequence[int] | None = None
    job_info: Collection[str] | None = None
    # Events kept with part of their payload left out (entries refused, perfd.core.events.checked): index
    # into the batch's events -> the payload kept, as JSON. The journal stores that, not what was sent.
    payloads: Mapping[int, str] | None = None


class IngestJournal(Protocol):
    """Where a durable aggregator writes what it accepted (perfd.aggregator.durable). The server
    calls it on its event loop; :meth:`commit` runs before every Ack, so an Ack means durable.

    Durability is per agent: a failed transaction (whoever committed it: the aggregator's own
    documents share it) marks every agent that had written into it :meth:`lost`. A lost agent's
    stream is closed before anything more of it is accepted or acknowledged, and its dedupe state
    goes back to what :meth:`recover` says is on disk, so its resend is taken again."""

    def hello(self, agent_id: str, jobs: Sequence[str]) -> None: ...  # the jobs the Hello was given
    def batch(self, agent_id: str, batch: pb.Batch, kept: Kept | None = None) -> None: ...
    def seq(self, agent_id: str, epoch: str, seq: int) -> None: ...
    def commit(self) -> bool: ...
    def lost(self, agent_id: str) -> bool: ...
    def recover(self, agent_id: str) -> tuple[str, int] | None: ...


class SeqTracker:
    """Highest accepted seq per agent and spool epoch: the dedupe state. Export it to keep it
    across an aggregator restart; a new epoch from an agent (its spool was lost) starts over."""

    def __init__(self, state: Mapping[str, tuple[str, int]] | None = None) -> None:
        self._last: dict[str, tuple[str, int]] = dict(state or {})

    def last(self, agent_id: str, epoch: str) -> int:
        e = self._last.get(agent_id)
        return e[1] if e is not None and e[0] == epoch else 0

    def advance(self, agent_id: str, epoch: str, seq: int) -> None:
        if seq > self.last(agent_id, epoch):
            self._last[agent_id] = (epoch, seq)

    def known(self, agent_id: str) -> bool:
        return agent_id in self._last

    def reset(self, agent_id: str, state: tuple[str, int] | None) -> None:
        """The agent's state back to ``state`` (what is durable), even below what was accepted."""
        if state is None:
            self._last.pop(agent_id, None)
        else:
            self._last[agent_id] = state

    def export(self) -> dict[str, tuple[str, int]]:
        return dict(self._last)

    @classmethod
    def load(cls, state: Mapping[str, tuple[str, int]]) -> SeqTracker:
        return cls(state)
