"""What `serve` says once it listens: where its API docs and models are, and a first call to
each served model that works as printed (the URL prefix and the host's port in it; with API
keys, a placeholder for the key, never the key)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from typing import Any

import uvicorn

from infinity_cloud.core.capability import ROUTE_NAMES, Capability
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.targets.base import CLIENT_KEY_ENV, curl_example

log = logging.getLogger(__name__)


def base_url(host: str, port: int, prefix: str) -> str:
    """The URL a client on this machine reaches the server at: a wildcard address (0.0.0.0, ::)
    is not one to connect to, so the loopback stands for it."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        return f"http://{host}:{port}{prefix}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}{prefix}"


def ready_lines(spec: DeploymentSpec, served: Sequence[tuple[str, Capability]]) -> str:
    """The lines for a server of `spec` serving `served` (each model's name and task)."""
    server = spec.server
    url = base_url(server.host, server.port, server.url_prefix)
    keyed = bool(server.keys)
    lines = [f"ready: {url}", f"  API docs: {url}/docs", f"  models:   {url}/models"]
    if keyed:
        lines.append(f"  calls need a key: export {CLIENT_KEY_ENV}=<one of the server's keys>, then")
    for name, capability in served:
        route = ROUTE_NAMES.get(capability, "embeddings")  # sparse and multi-vector: /embeddings too
        lines.append(f"  try {name} ({route}):\n{curl_example(url, name, route, api_key=keyed)}")
    return "\n".join(lines)


class ServerThatSaysWhere(uvicorn.Server):
    """uvicorn's server, which logs `lines` once it listens (not before: a port already taken
    fails its start, and the lines would point at another server)."""

    def __init__(self, config: uvicorn.Config, lines: str) -> None:
        super().__init__(config)
        self.lines = lines

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            log.info("%s", self.lines)
