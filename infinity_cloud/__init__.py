"""infinity-cloud: embeddings, reranking and classification behind one OpenAI-compatible API.

Importing the package is cheap: backends and cloud SDKs load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infinity_cloud import wiring

__version__ = "0.1.0"
__all__ = ["DeploymentSpec", "EmbedAsk", "Engine", "ModelSpec", "__version__"]

if TYPE_CHECKING:
    from infinity_cloud.asks import EmbedAsk
    from infinity_cloud.config import DeploymentSpec, ModelSpec
    from infinity_cloud.engine import Engine


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from infinity_cloud.engine import Engine

        return Engine
    if name == "EmbedAsk":
        from infinity_cloud.asks import EmbedAsk

        return EmbedAsk
    if name in {"DeploymentSpec", "ModelSpec"}:
        from infinity_cloud import config

        return getattr(config, name)
    raise AttributeError(name)


def _target_registry() -> Any:
    """The target registry, imported when first read: it names every target's section and
    planner (`wiring.TargetSections`, `wiring.TargetPlanners`)."""
    from infinity_cloud.targets import registry

    return registry


# The spec checks its target sections with the target registry, and `plan` finds each target's
# planner there; neither can import it (the targets import them): the package hands it over
# here, before any module can read it.
wiring.target_sections = _target_registry
wiring.target_planners = _target_registry
