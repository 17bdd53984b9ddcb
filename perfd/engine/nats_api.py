"""The part of nats-py the engine uses, as Protocols: nats-py is an optional dependency (perfd[engine]),
imported only where it is used, so the engine's modules name its objects by what perfd calls on them.

:func:`perfd.engine.connect.connect` returns nats-py's client as a :class:`NatsClient`, which the type
checker verifies against nats-py's own annotations (the configs perfd hands back to it are nats-py's
classes, named here for the type checker only).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig


class StreamSequence(Protocol):
    @property
    def stream(self) -> int: ...  # the message's sequence number in its stream


class MsgMetadata(Protocol):
    @property
    def sequence(self) -> StreamSequence: ...
    @property
    def num_delivered(self) -> int | None: ...  # this delivery's number (1: the first)
    @property
    def num_pending(self) -> int | None: ...  # the consumer's messages not delivered yet, after this one


class Msg(Protocol):
    """A message received: a command (core NATS, with a reply subject) or a stream's (JetStream)."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def reply(self) -> str: ...
    @property
    def metadata(self) -> MsgMetadata: ...  # JetStream messages only
    async def respond(self, data: bytes) -> None: ...
    async def ack(self) -> None: ...
    async def nak(self) -> None: ...  # delivered again at once, before newer messages
    async def in_progress(self) -> None: ...  # its ack wait starts again
    async def term(self) -> None: ...


class PubAck(Protocol):
    @property
    def duplicate(self) -> bool | None: ...  # the stream had a message of that id already


class Subscription(Protocol):
    """An ordered push consumer read one message at a time."""

    async def next_msg(self, timeout: float | None = ...) -> Msg: ...
    async def unsubscribe(self, limit: int = ...) -> None: ...


class PullSubscription(Protocol):
    async def fetch(self, batch: int = ..., timeout: float | None = ...) -> Sequence[Msg]: ...
    async def unsubscribe(self) -> None: ...
    async def consumer_info(self) -> ConsumerInfo: ...


class KVEntry(Protocol):
    @property
    def value(self) -> bytes | None: ...
    @property
    def revision(self) -> int | None: ...


class KeyValue(Protocol):
    """A KV bucket: the leases (perfd.engine.leases), the job infos (perfd.engine.shard)."""

    async def create(self, key: str, value: bytes) -> int: ...
    async def get(self, key: str) -> KVEntry: ...
    async def put(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int | None = ...) -> int: ...
    async def delete(self, key: str, last: int | None = ...) -> bool: ...
    async def keys(self) -> Sequence[str]: ...


class ConsumerInfo(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def num_ack_pending(self) -> int | None: ...  # delivered and not acknowledged yet
    @property
    def num_pending(self) -> int | None: ...  # not delivered yet
    @property
    def num_redelivered(self) -> int | None: ...  # delivered more than once, not acknowledged yet
    @property
    def config(self) -> ConsumerConfig: ...


class StreamState(Protocol):
    @property
    def messages(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def subjects(self) -> dict[str, int] | None: ...  # subject -> messages, where asked (subjects_filter)


class StreamLimits(Protocol):
    @property
    def max_bytes(self) -> int | None: ...  # -1 or None: no limit


class StreamInfo(Protocol):
    @property
    def state(self) -> StreamState: ...
    @property
    def config(self) -> StreamLimits: ...


class JetStream(Protocol):
    async def stream_info(self, name: str, subjects_filter: str | None = ...) -> StreamInfo: ...
    async def consumer_info(self, stream: str, consumer: str,
                            timeout: float | None = ...) -> ConsumerInfo: ...
    async def add_consumer(self, stream: str, config: ConsumerConfig | None = ...) -> ConsumerInfo: ...
    async def publish(self, subject: str, payload: bytes = ..., *, timeout: float | None = ...,
                      headers: dict[str, str] | None = ...) -> PubAck: ...
    async def subscribe(self, subject: str, *, stream: str | None = ..., ordered_consumer: bool = ...,
                        deliver_policy: DeliverPolicy | None = ...,
                        config: ConsumerConfig | None = ...) -> Subscription: ...
    async def pull_subscribe(self, subject: str, durable: str | None = ..., stream: str | None = ..., *,
                             config: ConsumerConfig | None = ...) -> PullSubscription: ...
    async def key_value(self, bucket: str) -> KeyValue: ...
    async def delete_consumer(self, stream: str, consumer: str) -> bool: ...
    async def purge_stream(self, name: str, seq: int | None = ..., subject: str | None = ...,
                           keep: int | None = ...) -> bool: ...
    async def add_stream(self, config: StreamConfig | None = ...) -> object: ...
    async def create_key_value(self, *, bucket: str, ttl: float, replicas: int, history: int,
                               max_bytes: int = ...) -> KeyValue: ...


class NatsClient(Protocol):
    """A connection (nats-py's ``Client``: it reconnects by itself a while)."""

    @property
    def is_connected(self) -> bool: ...
    @property
    def max_payload(self) -> int: ...  # the server's, from its INFO
    def jetstream(self) -> JetStream: ...
    async def subscribe(self, subject: str, *, cb: Callable[[Msg], Awaitable[None]]) -> object: ...
    async def request(self, subject: str, payload: bytes = ..., timeout: float = ...) -> Msg: ...
    async def close(self) -> None: ...
