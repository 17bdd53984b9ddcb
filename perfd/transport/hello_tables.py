"""The series tables the aggregator keeps of its agents' Hellos, so that a reconnect costs no decode.

An agent's Hello defines its series (id -> name and labels); decoding and admitting them is ~13 us a
series. Apart from the server (perfd.transport.server): what is kept of a Hello between streams is
not the stream protocol.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping

from perfd.transport.codec import AdmitSeries, HelloInfo, decode_hello
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import Series
from perfd.transport.stream import AgentStream


class SeriesTables:
    """agent_id -> (digest of its last Hello, the id -> Series table its streams built). A new
    stream's Hello is compared with it: byte for byte the same Hello (a reconnect after a cut) takes
    the table over without decoding it; otherwise only the ids whose definition differs from the kept
    one are reported as redefined, so nothing downstream resolves the agent's unchanged series again.
    After a cut under overload 2,000 agents come back at once, and decoding and re-resolving every
    series was ~13 us a series, 2.6 ms an agent. Least recently used first; at most limits.max_streams
    entries. Event-loop thread only."""

    def __init__(self) -> None:
        self._by_agent: OrderedDict[str, tuple[bytes, dict[int, Series]]] = OrderedDict()
        self.reused = 0  # Hellos whose table was taken over without decoding

    def take(self, conn: AgentStream, hello: pb.Hello, admit: AdmitSeries | None, cap: int) -> HelloInfo:
        """Decode ``hello`` into ``conn``'s series table (``conn.series``, and ``conn.hello_ids``: the
        ids it redefined), or take the agent's kept table over when the Hello is the same; keep at
        most ``cap`` agents' tables."""
        digest = hashlib.blake2b(hello.SerializeToString(deterministic=True), digest_size=16).digest()
        kept = self._by_agent.get(hello.agent_id)
        if kept is not None and kept[0] == digest:
            self.reused += 1
            conn.series = kept[1]
            info = decode_hello(hello, None, peer=conn.peer)
        else:
            info = decode_hello(hello, conn.series, peer=conn.peer, admit=admit)
            before = kept[1] if kept is not None else {}
            conn.hello_ids = [i for i, s in conn.series.items() if before.get(i) != s]
            if before and len(conn.series) < len(hello.series):  # some refused: ids held before go
                conn.hello_ids += [d.id for d in hello.series if d.id in before and d.id not in conn.series]
            self._by_agent[hello.agent_id] = (digest, conn.series)
        self._by_agent.move_to_end(hello.agent_id)
        while len(self._by_agent) > cap:
            self._by_agent.popitem(last=False)
        return info

    def tables(self) -> Iterator[tuple[str, Mapping[int, Series]]]:
        """(agent id, its kept table) of every agent kept, least recently used first."""
        return ((a, t) for a, (_, t) in self._by_agent.items())

    def forget(self, agent_id: str) -> None:
        self._by_agent.pop(agent_id, None)
