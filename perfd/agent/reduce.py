"""What of the node samples goes to the aggregator: the latest value of each series every few
seconds, not every sample.

The aggregator keeps only the latest value of a node series (the GPU view beside a job: clocks,
power, throttle reasons, GPM activity; serving gauges), and Prometheus scrapes every sample from the
agent's own /metrics, like dcgm-exporter or node_exporter. Sending each 10 Hz sample over the network
made node samples the aggregator's whole load (issue: scale), so each series is forwarded at most
once per ``interval_s``, with its newest value; a series that stops changing still has its last
value sent once its interval is up. ``interval_s`` 0 forwards every sample (the previous behaviour).
"""

from __future__ import annotations

from collections.abc import Iterable

from perfd.core.model import LabelSet, Sample, label_set

_Key = tuple[str, LabelSet]


class SampleReducer:
    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self._last_sent: dict[_Key, float] = {}  # series -> when it was last forwarded
        self._held: dict[_Key, Sample] = {}  # series -> newest sample not forwarded yet
        self.seen = 0
        self.forwarded = 0

    def reduce(self, samples: Iterable[Sample], now: float) -> list[Sample]:
        if self.interval_s <= 0:
            out = list(samples)
            self.seen += len(out)
            self.forwarded += len(out)
            return out
        for s in samples:
            self.seen += 1
            self._held[(s.name, label_set(s.labels))] = s
        out = []
        for key in [k for k in self._held if now - self._last_sent.get(k, -1e18) >= self.interval_s]:
            out.append(self._held.pop(key))
            self._last_sent[key] = now
        self.forwarded += len(out)
        return out
