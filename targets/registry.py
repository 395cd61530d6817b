"""Deployment targets by name: the built-in ones, those other installed packages declare in
the `infinity_cloud.targets` entry-point group, and any registered at run time.

The deployment spec takes each target's section from here (the CLI hands this module to
`load_spec(targets=...)`: the spec cannot import what imports the targets), `plan` each
target's planner (handed to it as `planner`), and the CLI its verbs and flags, so adding a
target adds no line to any of them. Targets are named by import path and
imported on first use: the core never imports a target it does not need. It sits beside the
targets and above them (tests/unit/test_layers.py): no target imports it.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from pydantic import BaseModel

from infinity_cloud.core.errors import ConfigError

BUILTIN = {
    "local": "infinity_cloud.targets.local.target:LocalTarget",
    "modal": "infinity_cloud.targets.modal.target:ModalTarget",
    "sagemaker": "infinity_cloud.targets.sagemaker.target:SageMakerTarget",
    "aws_lambda": "infinity_cloud.targets.aws_lambda.target:LambdaTarget",
    "kubernetes": "infinity_cloud.targets.kubernetes.target:KubernetesTarget",
}
ENTRY_POINT_GROUP = "infinity_cloud.targets"
_registered: dict[str, type[Any]] = {}


def register_target(cls: type[Any]) -> type[Any]:
    """Add a target class (a `name`, its `spec_class` or None, its `verbs`); usable as a
    decorator. A later registration of the same name replaces the earlier one."""
    _registered[cls.name] = cls
    _declared.cache_clear()
    return cls


def unregister_target(name: str) -> None:
    _registered.pop(name, None)
    _declared.cache_clear()


@functools.cache
def _declared() -> dict[str, str | type[Any]]:
    from importlib.metadata import entry_points

    found: dict[str, str | type[Any]] = dict(BUILTIN)
    found.update({ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)})
    found.update(_registered)
    return found


@functools.cache
def _load(path: str) -> type[Any]:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def target_names() -> list[str]:
    return list(_declared())


def target_class(name: str) -> type[Any]:
    declared = _declared().get(name)
    if declared is None:
        raise ConfigError(f"unknown target {name!r}; known: {', '.join(target_names())}")
    return _load(declared) if isinstance(declared, str) else declared


def planner(name: str) -> Any:
    """How `plan` sizes a target's section (a `sizing.plan.Planner`, named by the target's
    `planner`, imported now), or None where it sizes none."""
    path = getattr(target_class(name), "planner", None)
    return None if path is None else _load(path)


def section_class(name: str) -> type[BaseModel] | None:
    """The spec section a target reads (`modal:` in the YAML file), or None."""
    return target_class(name).spec_class
