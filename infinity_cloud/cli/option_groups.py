"""A command's options in groups, a frozen dataclass each whose fields are its flags (each
`Annotated` with typer's option or argument): typer is given the fields as the command's
parameters, and the command each group built from them. A new option is a field of one group."""

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any


def group_flags(group: type) -> list[inspect.Parameter]:
    """A group's fields as a command's parameters, in their order, with their defaults."""
    hints = typing.get_type_hints(group, include_extras=True)
    return [
        inspect.Parameter(
            field.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[field.name],
            default=inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default,
        )
        for field in dataclasses.fields(group)
    ]


def with_option_groups(fn: Callable[..., Any]) -> Any:
    """Give a command the flags of each parameter annotated with an option group (a
    dataclass), in the order of those parameters; it receives each group built."""
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    groups = {name: hints[name] for name in signature.parameters if dataclasses.is_dataclass(hints.get(name))}
    flags = {name: group_flags(group) for name, group in groups.items()}
    names = [flag.name for group in flags.values() for flag in group]
    if len(set(names)) != len(names):  # one would be handed to both groups' builders: neither sees it right
        raise TypeError(f"{fn.__name__}: a flag named in two option groups: {sorted(names)}")

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        built = {name: group(**{flag.name: kwargs.pop(flag.name) for flag in flags[name]})
                 for name, group in groups.items()}
        return fn(**kwargs, **built)

    own = [p for p in signature.parameters.values() if p.name not in groups]
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        own + [flag for name in groups for flag in flags[name]]
    )
    return command
