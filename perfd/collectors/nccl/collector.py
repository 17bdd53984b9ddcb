"""The ``nccl`` collector: Flight Recorder dumps (triggered through the ranks' FIFOs) and NCCL
Inspector JSON lines, as CollectiveRecords; stuck collectives as ``nccl_hang`` events.

Per ``collect()``: read the dumps that changed (the ranks answer a trigger about a second later, so
each round reads what the previous round asked for), then, every ``interval_s``, write a byte to
each rank's FIFO; run hang detection on the latest dump of every rank seen here; tail the Inspector
files. Everything is bounded and counted; nothing raises.

Hang detection sees the ranks on this node only. A hang whose late rank lives on another node shows
that rank under "no dump" (``unknown_ranks``); the aggregator can run
:func:`perfd.collectors.nccl.hangs.detect_hangs` over the dumps of all nodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float
from perfd.collectors.nccl.flight_recorder import FlightRecorderTracker
from perfd.collectors.nccl.hangs import HangReport, detect_hangs
from perfd.collectors.nccl.inspector import InspectorReader
from perfd.collectors.nccl.trigger import DumpReader, find_pipes, trigger_dump
from perfd.core.events import NCCL_HANG
from perfd.core.hang_fact import HangFact

MIN_DUMP_INTERVAL_S = 0.5  # a dump pickles the ring on the training process: not more often than this


@dataclass
class FlightRecorderConfig:
    pipe_prefix: str
    dump_prefix: str
    interval_s: float = 10.0
    hang_threshold_s: float = 300.0
    read_existing: bool = False
    buffer_entries: int = 2000  # the ring size the job runs with (perfd launch --fr-buffer)


@dataclass
class InspectorConfig:
    dir: str
    from_start: bool = True
    rescan_s: float = 5.0


@dataclass
class NcclConfig:
    job: str = ""
    flight_recorder: FlightRecorderConfig | None = None
    inspector: InspectorConfig | None = None

    @classmethod
    def from_dict(cls, cfg: Mapping[str, object]) -> NcclConfig:
        """Validate; a bad value is a configuration error and raises ValueError."""
        _known(cfg, {"job", "flight_recorder", "inspector"}, "nccl")
        fr = ins = None
        if cfg.get("flight_recorder") is not None:
            f = _mapping(cfg["flight_recorder"], "nccl.flight_recorder")
            _known(f, {"pipe_prefix", "dump_prefix", "interval_s", "hang_threshold_s", "read_existing",
                       "buffer_entries"}, "nccl.flight_recorder")
            fr = FlightRecorderConfig(
                pipe_prefix=_prefix(f, "pipe_prefix"), dump_prefix=_prefix(f, "dump_prefix"),
                interval_s=_positive(f, "interval_s", 10.0),
                hang_threshold_s=_positive(f, "hang_threshold_s", 300.0),
                read_existing=bool(f.get("read_existing", False)),
                buffer_entries=int(_positive(f, "buffer_entries", 2000)))
        if cfg.get("inspector") is not None:
            i = _mapping(cfg["inspector"], "nccl.inspector")
            _known(i, {"dir", "from_start", "rescan_s"}, "nccl.inspector")
            folder = i.get("dir")
            if not isinstance(folder, str) or not folder:
                raise ValueError("nccl.inspector.dir is required")
            ins = InspectorConfig(dir=folder, from_start=bool(i.get("from_start", True)),
                                  rescan_s=_positive(i, "rescan_s", 5.0))
        if fr is None and ins is None:
            raise ValueError("nccl: configure flight_recorder, inspector, or both")
        return cls(job=str(cfg.get("job", "")), flight_recorder=fr, inspector=ins)


def _known(cfg: Mapping[str, object], known: set[str], where: str) -> None:
    unknown = set(cfg) - known
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")


def _prefix(f: Mapping[str, object], key: str) -> str:
    value = f.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"nccl.flight_recorder.{key} is required (a path prefix)")
    return value


def _mapping(v: object, where: str) -> dict[str, object]:
    if not isinstance(v, dict):
        raise ValueError(f"{where} must be a mapping")
    return v


def _positive(cfg: Mapping[str, object], key: str, default: float) -> float:
    value = as_float(cfg.get(key, default))
    if value <= 0:
        raise ValueError(f"nccl: {key} must be > 0, not {value}")
    return value


class NcclCollector(Collector):
    name = "nccl"
    default_interval_s = 1.0

    def __init__(self, config: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.config = NcclConfig.from_dict(dict(config or {}))
        self.tracker: FlightRecorderTracker | None = None
        self.dumps: DumpReader | None = None
        self.inspector: InspectorReader | None = None
        self._next_trigger = 0.0
        self._pace = (time.monotonic(), 0)  # (when, tracker progress) at the last dump request
        self._reported_hangs: dict[tuple[str, bool, int], tuple[int, ...]] = {}
        self._synced: dict[str, int] = {}  # sub-reader counter -> value already passed to count_error

    def probe(self) -> Capabilities:
        fr, ins = self.config.flight_recorder, self.config.inspector
        features = {"flight_recorder": fr is not None, "inspector": ins is not None}
        problems = []
        if fr is not None and not os.path.isdir(os.path.dirname(fr.dump_prefix) or "."):
            problems.append(f"dump directory of {fr.dump_prefix!r} does not exist yet")
        if ins is not None and not os.path.isdir(ins.dir):
            problems.append(f"inspector dir {ins.dir!r} does not exist yet")
        # A missing directory is not fatal: the job may start after the agent and create it.
        return Capabilities(True, "; ".join(problems), features)

    def start(self) -> None:
        fr, ins = self.config.flight_recorder, self.config.inspector
        if fr is not None:
            self.tracker = FlightRecorderTracker(self.config.job)
            self.dumps = DumpReader(fr.dump_prefix, self.config.job, read_existing=fr.read_existing)
        if ins is not None:
            self.inspector = InspectorReader(ins.dir, self.config.job, from_start=ins.from_start,
                                             rescan_s=ins.rescan_s)

    def collect(self, now: float) -> Collected:
        out = Collected()
        if self.tracker is None and self.inspector is None:
            self.start()
        try:
            self._flight_recorder(now, out)
        except Exception as exc:  # a bug here must not stop the Inspector or the agent
            self.count_error("fr_internal_error", repr(exc))
        try:
            if self.inspector is not None:
                out.collectives.extend(self.inspector.read())
                self._sync_counts("inspector", self.inspector.counts)
        except Exception as exc:
            self.count_error("inspector_internal_error", repr(exc))
        return out

    def stop(self) -> None:
        if self.inspector is not None:
            self.inspector.close()

    # -------------------------------------------------------------------------------------

    def _flight_recorder(self, now: float, out: Collected) -> None:
        fr = self.config.flight_recorder
        if fr is None or self.tracker is None or self.dumps is None:
            return
        for dump in self.dumps.read_new_dumps():
            out.collectives.extend(self.tracker.update(dump))
            for reason, n in dump.issues.items():
                self._count_n(f"fr_entry:{reason}", n, dump.path or "")
        self._sync_counts("fr_dump", self.dumps.counts,
                          errors=("partial_retry", "corrupt", "refused_global", "too_large", "read_failed"))
        self._sync_counts("fr", self.tracker.counts,
                          errors=("entries_lost_between_dumps", "rank_restarted", "duplicate_seq_in_dump",
                                  "only_active_dump"))
        if self.tracker.latest:
            hangs = detect_hangs(self.tracker.latest, int(now * 1e9), fr.hang_threshold_s)
            self._hang_events(now, hangs, out)
        mono = time.monotonic()
        if mono >= self._next_trigger:
            self._next_trigger = mono + self._dump_interval(mono, fr)
            for rank, pipe in sorted(find_pipes(fr.pipe_prefix).items()):
                status = trigger_dump(pipe)
                if status != "sent":
                    # no_reader: the rank exited or has not started; counted, never raised.
                    self.count_error(f"fr_trigger_{status}", f"rank {rank}: {pipe}")

    def _dump_interval(self, mono: float, fr: FlightRecorderConfig) -> float:
        """Seconds to the next dump: ``interval_s``, shortened so that the ring (``buffer_entries``
        per rank) is at most half full between dumps at the collective rate seen since the last
        one — so it does not wrap; what is still lost is counted (entries_lost_between_dumps)."""
        assert self.tracker is not None
        prev_mono, prev_progress = self._pace
        self._pace = (mono, self.tracker.progress)
        elapsed = mono - prev_mono
        ranks = max(1, len(self.tracker.latest))
        rate = (self.tracker.progress - prev_progress) / ranks / elapsed if elapsed > 0 else 0.0
        if rate <= 0:
            return fr.interval_s
        return max(MIN_DUMP_INTERVAL_S, min(fr.interval_s, 0.5 * fr.buffer_entries / rate))

    def _hang_events(self, now: float, hangs: list[HangReport], out: Collected) -> None:
        for h in hangs:
            key = (h.pg_name, h.is_p2p, h.seq)
            signature = (*h.missing_ranks, -1, *h.stuck_ranks)
            if self._reported_hangs.get(key) == signature:
                continue  # reported already with the same ranks; a change is reported again
            self._reported_hangs[key] = signature
            fact = HangFact(process_group=h.pg_name, op=h.op, seq=h.seq, stuck_ranks=tuple(h.stuck_ranks),
                            ranks_not_joined=tuple(h.missing_ranks), unknown_ranks=tuple(h.unknown_ranks),
                            age_s=h.age_s, user_frame=h.user_frame)
            out.events.append({
                "kind": NCCL_HANG.name, "severity": "critical", "time": now, "job": self.config.job,
                "text": h.text(), "labels": {"job": self.config.job, **fact.labels()},
                "payload": fact.payload(),
            })
        if len(self._reported_hangs) > 10_000:  # a job that hangs forever must not grow this
            self._reported_hangs.clear()

    def _sync_counts(self, prefix: str, counts: dict[str, int],
                     errors: tuple[str, ...] | None = None) -> None:
        """Pass a sub-reader's new error counts to ``count_error`` (exported, logged once)."""
        for key, value in counts.items():
            if errors is not None and key not in errors:
                continue
            if errors is None and not (key.startswith("malformed:") or key in (
                    "busbw_mismatch", "dir_missing", "dir_unreadable", "files_over_limit")):
                continue
            name = f"{prefix}:{key}"
            new = value - self._synced.get(name, 0)
            if new > 0:
                self._synced[name] = value
                self._count_n(name, new)

    def _count_n(self, reason: str, n: int, detail: str = "") -> None:
        if n <= 0:
            return
        self.errors[reason] = self.errors.get(reason, 0) + n - 1
        self.count_error(reason, detail)
