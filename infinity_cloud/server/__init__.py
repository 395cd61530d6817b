"""The HTTP app: one factory (`create_app`) that every target serves. Imported when first
asked for, so that the server's lighter modules (logging, read deadlines) do not load the
whole app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infinity_cloud.server.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from infinity_cloud.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
