"""Which of the aggregator's endpoints are reachable beyond its host with nothing to authenticate
a client, and the warning it logs at start for them (docs/security.md: loopback unless told
otherwise; ``--listen-all`` or a non-loopback ``--grpc-host``/``--http-host`` is the telling, and a
token is what keeps the opened ports closed to whoever reaches them). Pure."""

from __future__ import annotations

import ipaddress

from perfd.core.model import TextEnum


class Endpoint(TextEnum):
    """An endpoint of the aggregator that a token (or mutual TLS, for gRPC) would guard."""

    GRPC = "grpc"  # the agents' ingest: samples, steps and events in, capture commands out
    HTTP_API = "http-api"  # /api/*: jobs, reports, GPU process lists; POST captures and the webhook


def loopback(host: str) -> bool:
    """Whether ``host`` is reached from this host only ("" and 0.0.0.0 are every interface; a name
    other than localhost may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def unauthenticated(grpc_host: str, http_host: str, token: bool, client_ca: bool) -> tuple[Endpoint, ...]:
    """The endpoints listening beyond loopback that nothing authenticates: no ``token``, and for gRPC
    no mutual TLS (``client_ca``) either."""
    out: list[Endpoint] = []
    if not loopback(grpc_host) and not token and not client_ca:
        out.append(Endpoint.GRPC)
    if not loopback(http_host) and not token:
        out.append(Endpoint.HTTP_API)
    return tuple(out)


_OPEN_TO_ALL = {
    Endpoint.GRPC: "the gRPC ingest on {grpc} (any client may stream data in as any agent and job)",
    Endpoint.HTTP_API: "the HTTP API on {http} (anyone may read every job, report and GPU process list "
                       "with its users and command lines, and ask agents for captures)",
}


def exposure_warning(open_: tuple[Endpoint, ...], grpc: str, http: str) -> str:
    """The start-up warning for ``open_`` (the address of each, ``grpc`` and ``http``)."""
    what = "; ".join(_OPEN_TO_ALL[e].format(grpc=grpc, http=http) for e in open_)
    return (f"listening beyond this host with no authentication: {what}. Give --auth-token-file "
            "(docs/security.md), or keep the aggregator on 127.0.0.1 (no --listen-all)")
