"""Bearer API keys: one or several, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from infinity_cloud.server.errors import UnauthorizedError

_bearer = HTTPBearer(auto_error=False, description="one of the server's API keys")


async def require_api_key(request: Request) -> None:
    """A FastAPI dependency; a no-op when the server has no keys."""
    keys: tuple[str, ...] = request.app.state.spec.server.api_keys
    if not keys:
        return
    credentials: HTTPAuthorizationCredentials | None = await _bearer(request)
    if credentials is None:
        raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>'")
    given = credentials.credentials.encode()
    if not any(hmac.compare_digest(given, key.encode()) for key in keys):
        raise UnauthorizedError("invalid API key")
