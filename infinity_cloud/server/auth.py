"""Bearer API keys: one or several, compared in constant time, checked before anything else.

The check is ASGI middleware, not a FastAPI dependency: FastAPI reads and parses a body
before it resolves dependencies, so an unauthenticated caller would get a 422 for a bad body
(learning the schema) and could make the server read megabytes first. The dependency below
only declares the scheme in the OpenAPI document.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from fastapi.security import HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from infinity_cloud.server.asgi import HttpMiddleware
from infinity_cloud.server.errors import UnauthorizedError, error_response

# Dependencies of the routes that need a key: they document the scheme (`ApiKeyGate` checks),
# and only where the server has such keys: a route a keyless server answers declares none.
api_key_scheme = HTTPBearer(auto_error=False, description="one of the server's API keys")
admin_key_scheme = HTTPBearer(
    auto_error=False, scheme_name="AdminKey",
    description="one of the server's admin keys (an API key does not open the admin API)",
)


def rejection(authorization: str | None, keys: Collection[str], what: str = "API key") -> str | None:
    """Why a request with this Authorization header is refused; None when its key is one of `keys`."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return f"missing {what}: send 'Authorization: Bearer <key>'"
    if not any(hmac.compare_digest(given.strip().encode(), key.encode()) for key in keys):
        return f"invalid {what}"
    return None


class ApiKeyGate(HttpMiddleware):
    """With keys, every path but the `open` ones (health checks, the docs) answers 401 to a
    request without a right key, before its body is read. Paths under `admin_prefix` take
    the admin keys instead, always (an admin API exists only with them)."""

    def __init__(
        self, app: ASGIApp, keys: Collection[str], open_paths: Collection[str],
        open_prefix: str | None = None, admin_keys: Collection[str] = (), admin_prefix: str | None = None,
    ) -> None:
        super().__init__(app)
        self.keys = tuple(keys)
        self.open_paths = frozenset(open_paths)
        self.open_prefix = open_prefix
        self.admin_keys = tuple(admin_keys)
        self.admin_prefix = admin_prefix

    def _open(self, path: str) -> bool:
        return path in self.open_paths or bool(self.open_prefix and path.startswith(self.open_prefix))

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        prefix = self.admin_prefix
        admin = bool(prefix and (path == prefix or path.startswith(prefix + "/")))
        keys = self.admin_keys if admin else self.keys
        if (admin or self.keys) and not self._open(path):
            what = "admin key" if admin else "API key"
            reason = rejection(Headers(scope=scope).get("authorization"), keys, what)
            if reason is not None:
                await error_response(UnauthorizedError(reason))(scope, receive, send)
                return
        await self.app(scope, receive, send)
