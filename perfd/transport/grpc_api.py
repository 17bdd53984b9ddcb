"""What perfd calls on grpcio's objects, as Protocols: grpcio ships no type information, so its
servicer context, its stream call and its server are named here by the part perfd uses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import NoReturn, Protocol

import grpc

from perfd.transport.gen import perfd_pb2 as pb


class ServicerContext(Protocol):
    """grpc.aio.ServicerContext of an agent's stream: who is calling, and how the stream ends."""

    def peer(self) -> str: ...  # "ipv4:127.0.0.1:54321"
    def auth_context(self) -> Mapping[str, Sequence[bytes | str]]: ...  # x509_common_name -> values
    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...
    async def abort(self, code: grpc.StatusCode, details: str = ...,
                    trailing_metadata: Sequence[tuple[str, str]] = ...) -> NoReturn: ...
    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, str]]) -> None: ...


class AgentCall(Protocol):
    """grpc.aio.StreamStreamCall of the agent's stream: serialized AgentMessages written, the
    aggregator's messages read."""

    def __aiter__(self) -> AsyncIterator[pb.AggregatorMessage]: ...
    async def write(self, request: bytes) -> None: ...
    async def code(self) -> grpc.StatusCode: ...
    async def details(self) -> str: ...
    async def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...
    async def initial_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...
    def cancel(self) -> bool: ...


class Server(Protocol):
    """grpc.aio.Server, once started."""

    async def stop(self, grace: float | None) -> None: ...
    async def wait_for_termination(self, timeout: float | None = ...) -> bool: ...
