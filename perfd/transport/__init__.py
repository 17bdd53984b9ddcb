"""Agent → aggregator transport: wire protocol (perfd.proto), codec, disk spool, client, server.

See docs/design.md §3 "Transport" for the measurements behind the design, and ``perfd.proto`` for the
protocol. Regenerate ``gen/`` with ``python -m perfd.transport.regen``.
"""

from perfd.transport.client import AgentClient
from perfd.transport.codec import Command, DecodedBatch, HelloInfo, decode_batch, encode_batch
from perfd.transport.delivery import SeqTracker
from perfd.transport.record_codec import DecodedEvent
from perfd.transport.series import Series, SeriesTable
from perfd.transport.server import IngestServer
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
