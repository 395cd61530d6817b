"""infinity-cloud: embeddings, reranking and classification behind one OpenAI-compatible API.

Importing the package is cheap: backends and cloud SDKs load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infinity_cloud.core.version import __version__

__all__ = ["DeploymentSpec", "EmbedAsk", "Engine", "ModelSpec", "__version__"]

if TYPE_CHECKING:
    from infinity_cloud.core.config import DeploymentSpec, ModelSpec
    from infinity_cloud.engine import Engine
    from infinity_cloud.engine.asks import EmbedAsk


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from infinity_cloud.engine import Engine

        return Engine
    if name == "EmbedAsk":
        from infinity_cloud.engine.asks import EmbedAsk

        return EmbedAsk
    if name in {"DeploymentSpec", "ModelSpec"}:
        from infinity_cloud.core import config

        return getattr(config, name)
    raise AttributeError(name)
