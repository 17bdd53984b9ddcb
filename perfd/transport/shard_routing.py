"""Which aggregator a job's agents talk to, when there are several: rendezvous hashing.

Aggregators are sharded by job — each holds all of its jobs' state — so every agent of a job must
pick the same one with no coordination: the aggregator with the highest sha256(job, address) wins
(highest-random-weight hashing). Adding or removing one aggregator moves only the jobs it wins or
held (about 1/N of them), not a reshuffle of all. Pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def pick_aggregator(job: str, aggregators: Sequence[str]) -> str:
    """The aggregator (``HOST:PORT``) for ``job`` out of ``aggregators``; ValueError for none."""
    choices = sorted({a.strip() for a in aggregators if a.strip()})
    if not choices:
        raise ValueError("no aggregator to choose from")
    return max(choices, key=lambda a: hashlib.sha256(f"{job}\0{a}".encode()).digest())
