"""Agent → aggregator transport: wire protocol (perfd.proto), codec, disk spool, client, server.

See docs/design.md §3 "Transport" for the measurements behind the design, and ``perfd.proto`` for the
protocol. Regenerate ``gen/`` with ``python -m perfd.transport.regen``.

The names below are loaded when first asked for (PEP 562), not with the package: importing any module
of it (the codec, the spool) loaded the agent's client and the aggregator's server with it, each side
the other's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfd.transport.client import AgentClient
    from perfd.transport.codec import Command, DecodedBatch, HelloInfo, decode_batch, encode_batch
    from perfd.transport.delivery import SeqTracker
    from perfd.transport.record_codec import DecodedEvent
    from perfd.transport.series import Series, SeriesTable
    from perfd.transport.server import IngestServer
    from perfd.transport.spool import Spool

# name -> the module that defines it
_WHERE = {"AgentClient": "client", "Command": "codec", "DecodedBatch": "codec", "HelloInfo": "codec",
          "decode_batch": "codec", "encode_batch": "codec", "SeqTracker": "delivery",
          "DecodedEvent": "record_codec", "Series": "series", "SeriesTable": "series",
          "IngestServer": "server", "Spool": "spool"}

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


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked once
    return value
