"""Megatron-LM log collector: a streaming parser for training logs and a tailer for growing files.

See README.md in this folder for the formats, the Megatron flags that produce them, and limits.
"""

from perfd.collectors.collector import Registry
from perfd.collectors.megatron.parser import MegatronLogParser, ParsedLog, parse_file, parse_lines
from perfd.collectors.megatron.tail import LogTail

__all__ = ["LogTail", "MegatronLogParser", "ParsedLog", "parse_file", "parse_lines", "register"]


def register(registry: Registry) -> None:
    """Add this collector to the agent's registry (imported lazily: the parser alone needs
    nothing of the agent)."""
    from perfd.collectors.megatron.collector import MegatronCollector

    registry.register("megatron", MegatronCollector)
