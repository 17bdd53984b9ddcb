"""SGLang collector: a streaming parser for server logs, a ``/metrics`` reader, and the agent-side
collector that turns both into the job's serving gauges.

See README.md in this folder for the formats (per SGLang release), the metrics and how the pieces
connect to the analytics and the aggregator.
"""

from perfd.collectors.collector import Registry
from perfd.collectors.sglang.metrics import parse_exposition, read_file, scrape
from perfd.collectors.sglang.parser import ParsedServingLog, SglangLogParser, parse_file, parse_lines

__all__ = ["ParsedServingLog", "SglangLogParser", "parse_exposition", "parse_file", "parse_lines",
           "read_file", "register", "scrape"]


def register(registry: Registry) -> None:
    """Add this collector to the agent's registry (imported lazily: the parser alone needs nothing
    of the agent)."""
    from perfd.collectors.sglang.collector import SglangCollector

    registry.register("sglang", SglangCollector)
