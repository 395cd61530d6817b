"""The engine: what a caller asks in its own terms (asks.py), one admitted call run on a
served model (pipeline.py), and the front door that answers each ask (front_door.py, `Engine`).

`Engine` is read from here lazily, so importing the asks (as every dialect does) does not import
the front door and all it assembles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infinity_cloud.engine.front_door import Engine

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from infinity_cloud.engine.front_door import Engine

        return Engine
    raise AttributeError(name)
