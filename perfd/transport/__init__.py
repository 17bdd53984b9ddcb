"""Agent → aggregator transport: wire protocol (perfd.proto), codec, disk spool, client, server.

See DESIGN.md §3 "Transport" for the measurements behind the design, and ``perfd.proto`` for the
protocol. Regenerate ``gen/`` with ``python -m perfd.transport.regen``.
"""

from perfd.transport.client import AgentClient
from perfd.transport.codec import (
    Command,
    DecodedBatch,
    DecodedEvent,
    HelloInfo,
    Series,
    SeriesTable,
    decode_batch,
    encode_batch,
)
from perfd.transport.server import IngestServer, SeqTracker
from perfd.transport.spool import Spool

__all__ = [
    "AgentClient",
    "Command",
    "DecodedBatch",
    "DecodedEvent",
    "HelloInfo",
    "IngestServer",
    "SeqTracker",
    "Series",
    "SeriesTable",
    "Spool",
    "decode_batch",
    "encode_batch",
]
