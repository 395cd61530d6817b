"""The bytes behind a request's media inputs: `data:` URIs decoded, `http(s)` URLs fetched
concurrently through one shared client, with size and time caps.

SSRF: a URL may not reach loopback, private, link-local (cloud metadata), multicast or
reserved addresses unless the spec's allow-list names the host or its network. The check
runs where the connection is made, on the addresses the name resolved to, for the first URL
and every redirect alike, and the connection goes to the address that was checked, so a DNS
answer that changes between check and connect (rebinding) gains nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.core.errors import InvalidInputError, ModelLoadError
from infinity_cloud.core.install_hint import install_command

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class MediaRefused(Exception):
    """A URL the policy does not let the server fetch (raised inside the connection)."""


# IPv6 forms whose packets end at an IPv4 address they carry: judged by that address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix: the last 32 bits
_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible ::a.b.c.d
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated ::ffff:0:a.b.c.d
# IPv6 ranges that are never a public destination although `is_global` may say so: NAT64 for
# local use (RFC 8215, its IPv4 address wherever the operator put it), Teredo (a tunnel to an
# obfuscated client address), and the deprecated site-local fec0::/10.
_NOT_PUBLIC_V6 = tuple(ipaddress.ip_network(net) for net in ("64:ff9b:1::/48", "2001::/32", "fec0::/10"))


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to: IPv4-mapped, SIIT-translated, NAT64, 6to4,
    IPv4-compatible."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64 or address in _TRANSLATED or (address in _COMPATIBLE and int(address) > 0xFFFF):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour  # 2002:AABB:CCDD::/48 -> A.B.C.D


def is_public(address: Address) -> bool:
    """Whether the server may connect to `address` on a caller's behalf (SSRF): by the address
    a packet reaches, so ::ffff:127.0.0.1, 64:ff9b::a9fe:a9fe (169.254.169.254 through NAT64)
    and 2002:7f00:1:: (6to4 to 127.0.0.1) are as private as the IPv4 address they carry."""
    if isinstance(address, ipaddress.IPv6Address):
        carried = embedded_ipv4(address)
        if carried is not None:
            return is_public(carried)
        if any(address in net for net in _NOT_PUBLIC_V6):
            return False
    return address.is_global and not address.is_multicast


class AccessPolicy:
    """Which hosts may be fetched: public addresses, and whatever the allow-list names (a host
    name, an address, or a network such as 10.0.0.0/8)."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.hosts: set[str] = set()
        self.networks: list[Network] = []
        for entry in allowed:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.hosts.add(entry.lower().rstrip("."))

    def check(self, host: str, addresses: Sequence[Address]) -> None:
        if host.lower().rstrip(".") in self.hosts:
            return
        for address in addresses:
            if not is_public(address) and not any(address in net for net in self.networks):
                raise MediaRefused(
                    f"{host} resolves to {address}, a non-public address (loopback, private, "
                    "link-local or metadata); allow it with --media-allow-host if this is intended"
                )


def decode_data_uri(uri: str, index: int) -> bytes:
    """`data:[<mime>][;base64],<data>` to its bytes."""
    header, comma, payload = uri.partition(",")
    if not comma:
        raise InvalidInputError(
            f"input {index}: a data URI needs a ',' before its data", param="input", index=index
        )
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidInputError(
                f"input {index}: the data URI's base64 is invalid: {exc}", param="input", index=index
            ) from exc
    return unquote_to_bytes(payload)


def _resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to (a literal address resolves to itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host}: {exc.strerror}") from exc
    # Scope ids (fe80::1%eth0) are not part of the address.
    return [ipaddress.ip_address(str(answer[4][0]).split("%")[0]) for answer in answers]


def _guarded_backend(policy: AccessPolicy) -> Any:
    """An httpcore network backend that resolves names itself, refuses what the policy does
    not allow, and connects to the address it checked."""
    import httpcore

    class GuardedBackend(httpcore.AsyncNetworkBackend):
        def __init__(self) -> None:
            self._inner = httpcore.AnyIOBackend()

        async def connect_tcp(
            self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
            socket_options: Any = None,
        ) -> Any:
            addresses = await asyncio.to_thread(_resolve, host, port)
            policy.check(host, addresses)
            return await self._inner.connect_tcp(
                str(addresses[0]), port, timeout=timeout, local_address=local_address,
                socket_options=socket_options,
            )

        async def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> Any:
            raise MediaRefused("unix sockets are not fetched")

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    return GuardedBackend()


class MediaFetcher:
    """One per engine: a pooled HTTP client shared by every request."""

    def __init__(self, limits: LimitsSpec) -> None:
        try:
            import certifi
            import httpcore
            import httpx
        except ImportError as exc:
            raise ModelLoadError(
                f"fetching media URLs needs httpx: {install_command('vision')}"
            ) from exc
        self.limits = limits
        self._httpx = httpx
        connections = httpx.Limits(max_connections=32, max_keepalive_connections=16)
        transport = httpx.AsyncHTTPTransport(limits=connections, trust_env=False)
        # The transport's pool, rebuilt with the guarded network backend (httpx offers no
        # public way to pass one).
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl.create_default_context(cafile=certifi.where()),
            max_connections=connections.max_connections,
            max_keepalive_connections=connections.max_keepalive_connections,
            network_backend=_guarded_backend(AccessPolicy(limits.media_allowed_hosts)),
        )
        # No proxies from the environment: a proxy would make every address check moot.
        self._client = httpx.AsyncClient(
            transport=transport, follow_redirects=True, max_redirects=5, trust_env=False,
            timeout=httpx.Timeout(limits.media_timeout_s),
            headers={"User-Agent": "infinity-cloud media fetcher"},
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def fetch_all(
        self, uris: Sequence[str], hold: Callable[[int], None] = lambda _: None
    ) -> list[bytes]:
        """Every input's bytes, in order; the first failure is the request's 400. `hold(n)`: n
        more bytes arrived, held from the memory budget until the request is done (it refuses,
        429 or 413, past the budget: 64 URLs of 20 MB are 1.3 GB for a 3 KB request)."""
        tasks = [asyncio.ensure_future(self.fetch(uri, index, hold)) for index, uri in enumerate(uris)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # one failed: the others are not worth finishing
                task.cancel()

    async def fetch(self, uri: str, index: int, hold: Callable[[int], None] = lambda _: None) -> bytes:
        scheme = urlsplit(uri).scheme.lower()
        if scheme == "data":
            data = decode_data_uri(uri, index)
            hold(len(data))
        elif scheme in ("http", "https"):
            data = await self._download(uri, index, hold)
        else:
            raise InvalidInputError(
                f"input {index} is not a media URL: send an http(s) URL or a data:<mime>;base64,... URI",
                param="input", index=index,
            )
        if len(data) > self.limits.media_max_bytes:
            raise self._too_large(index)
        if not data:
            raise InvalidInputError(f"input {index}: the media is empty", param="input", index=index)
        return data

    def _too_large(self, index: int) -> InvalidInputError:
        return InvalidInputError(
            f"input {index} is larger than the {self.limits.media_max_bytes:,} bytes served",
            param="input", index=index,
        )

    async def _download(self, url: str, index: int, hold: Callable[[int], None]) -> bytes:
        httpx = self._httpx
        try:
            # One deadline for the whole download: a server trickling bytes cannot stretch it.
            return await asyncio.wait_for(self._body(url, index, hold), self.limits.media_timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            raise InvalidInputError(
                f"input {index}: fetching {url} took longer than {self.limits.media_timeout_s:g}s",
                param="input", index=index,
            ) from exc
        except MediaRefused as exc:
            raise InvalidInputError(
                f"input {index}: {url} is refused: {exc}", param="input", index=index
            ) from exc
        except httpx.InvalidURL as exc:  # 0177.0.0.1, 127.000.000.001: not a host httpx reads
            raise InvalidInputError(f"input {index}: {url} is not a valid URL ({exc})",
                                    param="input", index=index) from exc
        except (httpx.HTTPError, OSError) as exc:
            cause = exc.__context__ if isinstance(exc.__context__, MediaRefused) else None
            if cause is not None:
                raise InvalidInputError(
                    f"input {index}: {url} is refused: {cause}", param="input", index=index
                ) from exc
            raise InvalidInputError(
                f"input {index}: fetching {url} failed ({type(exc).__name__}: {exc})",
                param="input", index=index,
            ) from exc

    async def _body(self, url: str, index: int, hold: Callable[[int], None]) -> bytes:
        limit = self.limits.media_max_bytes
        async with self._client.stream("GET", url) as response:
            if response.status_code >= 400:
                raise InvalidInputError(
                    f"input {index}: fetching {url} gave HTTP {response.status_code}",
                    param="input", index=index,
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise self._too_large(index)
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise self._too_large(index)
                hold(len(chunk))
                chunks.append(chunk)
            return b"".join(chunks)
