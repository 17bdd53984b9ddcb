"""Streaming parser for SGLang server logs: batch records, start-up facts, counted issues.

``SglangLogParser.feed(line)`` returns the records the line completes (0 or 1: every batch line is a
record by itself); ``parse_lines`` / ``parse_file`` run a whole log. Never raises on input: a line
that looks like a batch line but cannot be used is a ``ParseIssue`` and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfd.collectors.sglang.lines import (
    MAX_LINE,
    BatchParse,
    parse_batch_line,
    parse_startup_line,
    split_prefix,
)
from perfd.core.logfiles import iter_text_lines
from perfd.core.model import ParseIssue, Provenance
from perfd.core.serving_records import ServerInfo, ServingRecord

MAX_ISSUES = 10_000
DAY_S = 86400.0


@dataclass
class ParsedServingLog:
    records: list[ServingRecord] = field(default_factory=list)
    server: ServerInfo = field(default_factory=ServerInfo)
    issues: list[ParseIssue] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


class SglangLogParser:
    """Feed lines one at a time (a tail) or all at once (a file)."""

    def __init__(self, source_name: str = "sglang.log") -> None:
        self.source_name = source_name
        self.server = ServerInfo()
        self.issues: list[ParseIssue] = []
        self.counts: Counter[str] = Counter()
        self.line_no = 0
        self._last_clock: float | None = None
        self._day_offset = 0.0
        self.server_changed = False  # a start-up line was read since the flag was last cleared

    def feed(self, line: str) -> list[ServingRecord]:
        self.line_no += 1
        self.counts["lines"] += 1
        try:
            return self._feed(line)
        except Exception as exc:  # a parser bug must not take the agent down
            self._issue("internal-error", f"{type(exc).__name__}: {line[:200]}")
            return []

    def _feed(self, line: str) -> list[ServingRecord]:
        line = line.rstrip("\r\n")
        if len(line) > MAX_LINE:
            self.counts["long_lines"] += 1
            line = line[:MAX_LINE]
        if not line.strip():
            self.counts["empty"] += 1
            return []
        res = parse_batch_line(line, self.line_no)
        if isinstance(res, str):
            self._issue(res, line)
            return []
        if isinstance(res, BatchParse):
            return [self._record(res, line)]
        _, msg = split_prefix(line)
        kind = parse_startup_line(msg.strip(), self.server)
        if kind is not None:
            self.counts[f"startup_{kind}"] += 1
            self.server_changed = True
            return []
        self.counts["other"] += 1
        return []

    def _record(self, res: BatchParse, line: str) -> ServingRecord:
        rec = res.record
        self.counts[f"{rec.kind}_lines"] += 1
        self.counts[f"prefix_{rec.prefix_format}"] += 1
        if res.unknown_keys:
            self.counts["unknown_keys"] += res.unknown_keys
        for reason in res.issues:
            self._issue(reason, line)
        if res.truncated:
            self._issue("truncated-batch-line", line)
        if rec.clock_time is not None:  # HH:MM:SS only: unwrap across midnight
            t = rec.clock_time + self._day_offset
            if self._last_clock is not None and t < self._last_clock - DAY_S / 2:
                self._day_offset += DAY_S
            rec.clock_time += self._day_offset
            self._last_clock = rec.clock_time
        rec.source = Provenance("sglang", f"{self.source_name}:{self.line_no}")
        return rec

    def _issue(self, reason: str, text: str) -> None:
        self.counts[f"malformed:{reason}"] += 1
        if len(self.issues) < MAX_ISSUES:
            self.issues.append(ParseIssue(self.line_no, reason, text[:200]))
        else:
            self.counts["issues_dropped"] += 1


def parse_lines(lines: Iterable[str], source_name: str = "sglang.log") -> ParsedServingLog:
    p = SglangLogParser(source_name)
    out = ParsedServingLog(server=p.server, issues=p.issues, counts=p.counts)
    for line in lines:
        out.records.extend(p.feed(line))
    return out


def parse_file(path: str | Path) -> ParsedServingLog:
    """Parse a whole log file, plain, gzip, xz or zstd (perfd.core.logfiles)."""
    p = Path(path)
    return parse_lines(iter_text_lines(p), source_name=p.name)
