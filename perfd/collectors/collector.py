"""The contract every collector implements, and the registry that names them.

A collector knows its source (NVML, a log file, psutil, ...) and nothing of the transport: it
returns plain records (perfd.core.model) and the agent decides where they go. Capabilities are probed
once, at start; ``collect`` must be cheap, never block for long, and never raise for a bad input
(it counts the problem in ``errors`` and returns what it could read).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perfd.core.model import CollectiveRecord, JobInfo, Sample, StepRecord

log = logging.getLogger(__name__)


@dataclass
class Capabilities:
    """What a collector found it can do on this node, probed once at start."""

    available: bool
    reason: str = ""  # why not, when not available (shown to the user, logged once)
    features: dict[str, bool] = field(default_factory=dict)  # e.g. {"gpm": True}


@dataclass
class Collected:
    """One collect() call's output."""

    samples: list[Sample] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # kind, severity, text, labels
    collectives: list[CollectiveRecord] = field(default_factory=list)  # NCCL / Flight Recorder ops
    # What a job's start-up says about it (layout, model spec), sent when it first appears or
    # changes, keyed by job name.
    job_info: dict[str, JobInfo] = field(default_factory=dict)
    # Where the collector can resume once this output is durable (JSON-able; the agent keeps the
    # latest one per collector under its --state-dir and hands it back as config["resume"]).
    checkpoint: dict[str, object] | None = None

    def extend(self, other: Collected) -> None:
        """``other``'s output after this one's (its checkpoint, where it has one, the newer)."""
        self.samples += other.samples
        self.steps += other.steps
        self.events += other.events
        self.collectives += other.collectives
        self.job_info.update(other.job_info)
        if other.checkpoint is not None:
            self.checkpoint = other.checkpoint


class Collector(abc.ABC):
    """Base class. Subclasses set ``name`` and implement probe/collect."""

    name: str = ""
    default_interval_s: float = 1.0

    def __init__(self) -> None:
        # reason -> count; exported as perfd_agent_collector_errors_total{collector, reason}
        self.errors: dict[str, int] = {}
        self._logged: set[str] = set()

    def count_error(self, reason: str, detail: str = "") -> None:
        """Count a failure and log it once per reason (a broken source must not flood the log)."""
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("collector %s: %s %s (counted; further occurrences not logged)",
                        self.name, reason, detail)

    @abc.abstractmethod
    def probe(self) -> Capabilities:
        """Find out once what this node supports. Must not raise."""

    def start(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Acquire resources (open files, init libraries). Called once after probe."""

    @abc.abstractmethod
    def collect(self, now: float) -> Collected:
        """Read the source. Must not raise; count errors instead."""

    def flush(self, now: float) -> Collected:
        """Called once at shutdown, after the last collect: hand over anything held back (a log
        parser's pending record). Must not raise."""
        return Collected()

    def stop(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources. Called once."""


CollectorFactory = Callable[[dict[str, object]], Collector]


class Registry:
    """Name -> factory. Registering a name twice is a programming error and raises."""

    def __init__(self) -> None:
        self._factories: dict[str, CollectorFactory] = {}

    def register(self, name: str, factory: CollectorFactory) -> None:
        if not name:
            raise ValueError("collector name must not be empty")
        if name in self._factories:
            raise ValueError(f"collector {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, config: dict[str, object]) -> Collector:
        try:
            factory = self._factories[name]
        except KeyError:
            raise KeyError(f"unknown collector {name!r}; known: {', '.join(self.names())}") from None
        return factory(config)
