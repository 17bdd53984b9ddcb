"""Sketches of values that merge by adding (quantiles within a stated relative error, whatever the
merge's order and grouping) and a hash of a set of ranks that adds under union: what a summary of some
ranks carries in place of the ranks' own values (perfd.engine.stepsummary, perfd.core.commsummary).
Pure.

:class:`Sketch` is DDSketch's logarithmic mapping (the ``ddsketch`` package, perfd[engine]) over integer
counts of our own: a value is stood for by its bucket's, within SKETCH_ACCURACY of it (relative), so the
value read at a rank (a quantile: the value at rank q·(n-1)) is within SKETCH_ACCURACY of the exact value
there, and the median (statistics.median's: the mean of the two middle values of an even count) within it
of the exact median. The package's own sketch keeps float counts and no exact zero count; ours are
integers, compared and encoded exactly (perfd.engine.summary_codec).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ddsketch.mapping import LogarithmicMapping

SKETCH_ACCURACY: Final = 0.01  # a sketched value's relative error at most
_MASK64: Final = (1 << 64) - 1


def rank_hash(ranks: Iterable[int]) -> int:
    """The sum (mod 2^64) of each rank's splitmix64 mix: summaries' hashes add as their ranks do, so the
    merge of a partition's holders equals the hash of the iteration's ranks only if no rank is in two
    of them and none is missing (a rank twice adds its mix twice; equal by chance with odds ~2^-64).
    Written here: a set's hash that adds under union is what no library offers."""
    total = 0
    for r in ranks:
        z = (r + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        total += z ^ (z >> 31)
    return total & _MASK64


def hashes_joined(a: int, b: int) -> int:
    """The :func:`rank_hash` of two sets of ranks together, from theirs."""
    return (a + b) & _MASK64


_MAPPING: Final = LogarithmicMapping(SKETCH_ACCURACY)
# The buckets a value can fall in (the mapping's keys of the least and the greatest it tells apart)
MIN_KEY: Final = int(_MAPPING.key(_MAPPING.min_possible))
MAX_KEY: Final = int(_MAPPING.key(_MAPPING.max_possible))


class Sketch:
    """Counts of values by their DDSketch logarithmic bucket (``_MAPPING``); values at or below zero
    counted apart (they are read as 0)."""

    __slots__ = ("bins", "zeros")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.zeros = 0

    def add(self, v: float) -> None:
        if v <= 0 or v < _MAPPING.min_possible:
            self.zeros += 1
        else:
            k = _MAPPING.key(v)
            self.bins[k] = self.bins.get(k, 0) + 1

    def __eq__(self, other: object) -> bool:
        """The same counts in the same buckets (the same values, as the sketch stands for them)."""
        return isinstance(other, Sketch) and (self.zeros, self.bins) == (other.zeros, other.bins)

    def merge(self, other: Sketch) -> None:
        for k, n in other.bins.items():
            self.bins[k] = self.bins.get(k, 0) + n
        self.zeros += other.zeros

    @property
    def count(self) -> int:
        return self.zeros + sum(self.bins.values())

    def quantile(self, q: float) -> float | None:
        """The value at rank q·(count-1) (0-based, rounded down), as its bucket stands for it."""
        n = self.count
        return self.at_rank(int(q * (n - 1))) if n else None

    def at_rank(self, rank: int) -> float | None:
        """The value at ``rank`` (0-based, in ascending order), as its bucket stands for it."""
        seen = self.zeros
        if rank < seen:
            return 0.0
        for k in sorted(self.bins):
            seen += self.bins[k]
            if rank < seen:
                return float(_MAPPING.value(k))
        return None

    def median(self) -> float | None:
        """statistics.median's: the middle value, or the mean of the two middle ones (each within the
        sketch's relative error, so the mean is too)."""
        n = self.count
        if not n:
            return None
        lo, hi = self.at_rank((n - 1) // 2), self.at_rank(n // 2)
        return None if lo is None or hi is None else (lo + hi) / 2

    def at_most(self, x: float) -> int:
        """How many values' buckets stand for at most ``x``."""
        n = self.zeros if x >= 0 else 0
        return n + sum(c for k, c in self.bins.items() if _MAPPING.value(k) <= x)
