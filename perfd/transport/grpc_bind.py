"""Binding a ``grpc.aio`` server to its address: the options every perfd gRPC server runs with, and a
bind that refuses a port already in use (no port sharing) with the kernel's own error, before gRPC's C
core prints a raw line of its own. Apart from perfd.transport.server, which is the ingest protocol:
how a server is bound is not what its streams do."""

from __future__ import annotations

import errno
import socket

import grpc

from perfd.core import limits as L
from perfd.transport.security import ServerTls


def probe_bind(host: str, port: int) -> None:
    """Bind ``host:port`` as gRPC would (SO_REUSEADDR, no SO_REUSEPORT) and let go at once: raises
    the kernel's OSError (errno kept: in use, not local) without gRPC printing a line of its own."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))


def server_options(max_message_bytes: int = L.MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    ms = 1000
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A port already in use must refuse to start: with SO_REUSEPORT a second aggregator would
        # share the port and take some agents' connections.
        ("grpc.so_reuseport", 0),
        # Agents ping every KEEPALIVE_TIME_S to notice a dead network; let them, even idle.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(L.KEEPALIVE_TIME_S * ms) // 2),
        ("grpc.http2.max_ping_strikes", 0),
        # And notice dead agents ourselves, so their stream (and its registry entry) goes away.
        ("grpc.keepalive_time_ms", int(L.KEEPALIVE_TIME_S * ms)),
        ("grpc.keepalive_timeout_ms", int(L.KEEPALIVE_TIMEOUT_S * ms)),
        ("grpc.http2.max_pings_without_data", 0),  # an idle agent sends no data: keep pinging it
    ]


async def bind(server: grpc.aio.Server, host: str, port: int, tls: ServerTls | None) -> int:
    """Add ``host:port`` to ``server`` (TLS when ``tls``); returns the bound port (``port=0`` picks a
    free one). Raises OSError when the address cannot be bound (in use, not local), the server
    stopped."""
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if port:
        try:  # before gRPC tries: its C core logs a raw line of its own on stderr when bind fails
            probe_bind(host, port)
        except OSError:
            await server.stop(None)
            raise
    try:
        if tls is not None:
            bound = server.add_secure_port(addr, tls.credentials())
        else:
            bound = server.add_insecure_port(addr)
    except RuntimeError as exc:  # grpcio raises where older versions returned 0
        bound, why = 0, str(exc)
    else:
        why = ""
    if not bound:
        await server.stop(None)
        why = why.split(";")[0]  # not gRPC's advice to set GRPC_VERBOSITY
        # The kernel's own error when the address is the problem (in use: taken since the probe, a
        # race; not local); "in use" is never said of a port that is not.
        probe_bind(host, port)
        # Not the address: gRPC refused what it was given (the TLS files are checked before, so rare).
        raise OSError(errno.EINVAL, f"gRPC could not add the port ({why or 'no reason given'})")
    return int(bound)
