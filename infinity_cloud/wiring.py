"""What a lower layer is handed by an upper one instead of importing it (which would import
upwards). The package sets each hook when it is imported (`infinity_cloud/__init__.py`), so
before any module that reads one; a test or a program may set another."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class TargetSections(Protocol):
    """What the spec asks the target registry (`targets/registry.py`): a target's section
    model (None: it has none; a ConfigError for an unknown name) and the names it knows."""

    def section_class(self, name: str) -> Any: ...

    def target_names(self) -> list[str]: ...


# The target registry the spec checks its target sections with: the targets import the spec,
# so the spec cannot import the registry that imports them.
target_sections: Callable[[], TargetSections] | None = None


class TargetPlanners(Protocol):
    """What `plan` (`sizing/plan.py`) asks the target registry: how a target sizes its section
    (a `sizing.plan.Planner`), None where it sizes none."""

    def planner(self, name: str) -> Any: ...


# The target registry `plan` finds each target's planner in: the planners import sizing, so
# sizing cannot import the registry that imports them.
target_planners: Callable[[], TargetPlanners] | None = None
