"""A collective hang as one agent saw it: what an ``nccl_hang`` event carries (pure data).

collectors/nccl builds a :class:`HangFact` from its Flight Recorder reading and writes it into the
event (:meth:`HangFact.labels`, :meth:`HangFact.payload`); the aggregator reads it back once, where
the event arrives (:meth:`HangEvent.from_event`), and the analysis merges the typed facts
(perfd.analytics.collectives.collective_hangs). JSON appears only in the event, never in between.

An agent older than the payload sent the ranks only as comma-separated labels and the age only in
the event's text ("... stuck 7s on rank(s) ..."): :meth:`HangEvent.from_event` still reads that
form, in this one place. The text's age is a declared format, not prose: the collector writes it with
:func:`age_words` and this module reads it with :func:`age_in_words`, both from ``_AGE_HEAD`` and
``_AGE_TAIL`` (a change to them is a change to what an older agent's event is read as).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from perfd.core.events import NCCL_HANG

# The age in the event's text (collectors/nccl/hangs.HangReport.text): "stuck 7s". An older agent's
# event carries its age only there; a current one's in its payload too (HangFact.age_s, a number).
_AGE_HEAD, _AGE_TAIL = "stuck ", "s"
_AGE = re.compile(re.escape(_AGE_HEAD) + r"(\d+(?:\.\d+)?)" + re.escape(_AGE_TAIL))


def age_words(age_s: float) -> str:
    """The age as the event's text says it ("stuck 7s")."""
    return f"{_AGE_HEAD}{age_s:.0f}{_AGE_TAIL}"


def age_in_words(text: str) -> float | None:
    """The age an older agent's event text says (:func:`age_words`), or None where it says none."""
    m = _AGE.search(text)
    return float(m.group(1)) if m else None


def _csv(ranks: Sequence[int]) -> str:
    return ",".join(map(str, ranks))


def _ranks(value: object) -> tuple[int, ...]:
    """Ranks from a list, or the comma-separated label form ("0,3")."""
    if isinstance(value, list | tuple):
        items: Sequence[object] = value
    elif isinstance(value, str):
        items = [v for v in value.split(",") if v.strip()]
    else:
        return ()
    out = []
    for v in items:
        if not isinstance(v, int | float | str):  # None, a list, an object: no rank
            continue
        try:
            out.append(int(v))
        except ValueError:
            continue
    return tuple(out)


class HangPayload(TypedDict):
    """The payload of an ``nccl_hang`` event (:meth:`HangFact.payload`)."""

    ranks_not_joined: list[int]
    stuck_ranks: list[int]
    unknown_ranks: list[int]
    age_s: float | None
    user_frame: str | None


@dataclass(frozen=True)
class HangFact:
    """An op enqueued and not finished past the agent's hang threshold, on the ranks of its node."""

    process_group: str
    op: str | None  # None: an event that did not name it
    seq: int
    stuck_ranks: tuple[int, ...]  # ranks with the op enqueued, not finished, older than the threshold
    ranks_not_joined: tuple[int, ...]  # group members whose last op on the group is older: never reached it
    unknown_ranks: tuple[int, ...]  # group members without a dump on the agent's node
    age_s: float | None = None  # how long the op had been stuck when the agent reported it
    user_frame: str | None = None  # the training script's frame that enqueued it

    def labels(self) -> dict[str, str]:
        """The event's labels (besides ``job``), as every agent has sent them."""
        out = {"process_group": self.process_group, "op": self.op or "?", "seq": str(self.seq),
               "ranks_not_joined": _csv(self.ranks_not_joined), "stuck_ranks": _csv(self.stuck_ranks)}
        if self.unknown_ranks:
            out["ranks_without_dump"] = _csv(self.unknown_ranks)
        return out

    def payload(self) -> HangPayload:
        """The event's payload: the ranks as lists, the age as a number."""
        return {"ranks_not_joined": list(self.ranks_not_joined), "stuck_ranks": list(self.stuck_ranks),
                "unknown_ranks": list(self.unknown_ranks), "age_s": self.age_s, "user_frame": self.user_frame}


@dataclass(frozen=True)
class HangEvent:
    """One agent's ``nccl_hang`` event as the aggregator holds it: the fact, who sent it, when."""

    fact: HangFact
    agent: str | None
    time: float  # epoch s, the agent's clock
    text: str

    @property
    def is_p2p(self) -> bool:
        return (self.fact.op or "?") in P2P_OPS

    @classmethod
    def from_event(cls, ev: Mapping[str, object], agent: str | None = None) -> HangEvent | None:
        """The event's fact (None: not an ``nccl_hang`` event naming a process group and a sequence
        number). Each value from the payload where it is there, else from an older agent's labels
        and text."""
        if ev.get("kind") != NCCL_HANG.name:
            return None
        raw_labels = ev.get("labels")
        labels: Mapping[str, object] = raw_labels if isinstance(raw_labels, Mapping) else {}
        pg = labels.get("process_group")
        seq_label = labels.get("seq", "")
        if not isinstance(seq_label, int | float | str):
            return None
        try:
            seq = int(seq_label)
        except ValueError:
            return None
        if not pg:
            return None
        raw = ev.get("payload")
        payload: Mapping[str, object] = raw if isinstance(raw, Mapping) else {}
        text = str(ev.get("text") or "")
        age = payload.get("age_s")
        if isinstance(age, int | float) and not isinstance(age, bool):
            age_s: float | None = float(age)
        else:
            age_s = age_in_words(text)
        frame = payload.get("user_frame")
        fact = HangFact(
            process_group=str(pg), op=str(labels["op"]) if "op" in labels else None, seq=seq,
            stuck_ranks=_ranks(payload.get("stuck_ranks", labels.get("stuck_ranks"))),
            ranks_not_joined=_ranks(payload.get("ranks_not_joined", labels.get("ranks_not_joined"))),
            unknown_ranks=_ranks(payload.get("unknown_ranks", labels.get("ranks_without_dump"))),
            age_s=age_s, user_frame=str(frame) if frame else None)
        who = agent if agent is not None else ev.get("agent")
        t = ev.get("time")
        at = float(t) if isinstance(t, int | float | str) and t else 0.0
        return cls(fact, str(who) if who else None, at, text)


P2P_OPS = frozenset({"send", "recv", "send_recv"})
