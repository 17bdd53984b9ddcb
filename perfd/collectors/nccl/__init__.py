"""NCCL timings: PyTorch Flight Recorder dumps and NCCL Inspector JSON lines (no torch import).

See README.md in this folder for what each source needs in the job's environment, costs, limits.
"""

from perfd.collectors.nccl.collector import NcclCollector
from perfd.collectors.nccl.flight_recorder import (
    FlightRecorderDump,
    FlightRecorderTracker,
    RestrictedUnpickler,
    load_dump_bytes,
    parse_dump,
)
from perfd.collectors.nccl.hangs import HangReport, detect_hangs
from perfd.collectors.nccl.inspector import InspectorReader, bus_bw_factor, check_busbw, parse_line
from perfd.collectors.nccl.trigger import DumpReader, find_pipes, trigger_dump
from perfd.core.flight_recorder_env import env_for_flight_recorder

__all__ = [
    "DumpReader", "FlightRecorderDump", "FlightRecorderTracker", "HangReport", "InspectorReader",
    "NcclCollector", "RestrictedUnpickler", "bus_bw_factor", "check_busbw", "detect_hangs",
    "env_for_flight_recorder", "find_pipes", "load_dump_bytes", "parse_dump", "parse_line",
    "trigger_dump",
]
