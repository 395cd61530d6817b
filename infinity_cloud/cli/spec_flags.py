"""The spec's fields as flags: every spec-reading command's options (`with_spec`), one model's
(`with_model_options`) and a target's section (`section_options`), each made from the field's
type, description and default (`field_option`)."""

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic.fields import FieldInfo

from infinity_cloud.cli.common import reported_errors
from infinity_cloud.core.config import (
    LIMIT_OPTIONS,
    MODEL_OPTIONS,
    SERVER_OPTIONS,
    LimitsSpec,
    ModelSpec,
    ServerSpec,
    load_spec,
)
from infinity_cloud.targets import registry

_M = "Models (repeat --model-id to serve several; give other model options once for all, or once per model)"
_S = "Server"


def _cli_type(annotation: Any) -> Any:
    """The type typer parses a field's flag as; pydantic then validates the value."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (tuple, list):
        return list[str]  # repeatable; each value validated as an item by pydantic
    if args and origin is not typing.Literal:  # Optional[X] / X | None
        return _cli_type(args[0])
    if origin is typing.Literal or annotation not in (bool, int, float):
        return str
    return annotation


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def field_option(name: str, info: FieldInfo, env: str | None, panel: str) -> tuple[Any, Any]:
    """A spec field as a typer option: (the type typer parses, or None, the option). The flag is
    `--field-name` (or the field's `flag`), booleans get `--x/--no-x` (or its `off`), the help
    is the field's description and its default, the variable `env` + the field's name (or its
    `env`); none when `env` is None."""
    extra: dict[str, Any] = info.json_schema_extra or {}  # type: ignore[assignment]
    hint = _cli_type(info.annotation)
    flag = str(extra.get("flag") or f"--{name.replace('_', '-')}")
    decls = (f"{flag}/{extra.get('off') or '--no-' + flag.removeprefix('--')}",) if hint is bool else (flag,)
    default = info.get_default(call_default_factory=True)
    shown = "" if default in (None, (), "") or "(default:" in (info.description or "") else (
        f" (default: {_shown(default)})"
    )
    envvar = None if env is None else f"{env}{str(extra.get('env') or name).upper()}"
    option = typer.Option(
        *decls, envvar=envvar, help=(info.description or "") + shown, rich_help_panel=panel,
        show_default=False,
    )
    return hint | None, option


def _spec_options() -> dict[str, tuple[Any, Any]]:
    """The options every spec-reading command takes, one per field a flat source sets
    (`None`: not given, so the file wins). A model's option other than a boolean is a list:
    once for all models, or once per --model-id."""
    options = {"config": (Path | None, typer.Option(
        envvar="INFINITY_CLOUD_CONFIG", help="YAML deployment spec (infinity-cloud.yaml).",
        rich_help_panel="Spec", show_default=False,
    ))}
    for name in ("model_id", *MODEL_OPTIONS):
        info = ModelSpec.model_fields[name]
        parsed = _cli_type(info.annotation)
        if parsed is not bool and typing.get_origin(parsed) is not list:
            parsed = list[parsed]  # type: ignore[valid-type]
        options[name] = (parsed | None, field_option(name, info, "INFINITY_CLOUD_", _M)[1])
    for spec, names in ((ServerSpec, SERVER_OPTIONS), (LimitsSpec, LIMIT_OPTIONS)):
        for name in names:
            options[name] = field_option(name, spec.model_fields[name], "INFINITY_CLOUD_", _S)
    return options


SPEC_OPTIONS = _spec_options()


KEYWORD = inspect.Parameter.KEYWORD_ONLY


def with_spec(fn: Callable[..., Any] | None = None, *, target: str | None = None) -> Any:
    """Give a command the spec options (and the flags of `target`'s spec section); it
    receives the merged `spec` instead."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn).parameters.values() if p.name != "spec"]
        section = section_options(target) if target else {}

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            options = {name: kwargs.pop(name) for name in SPEC_OPTIONS}
            if target:
                given = {field: kwargs.pop(param) for param, (field, _, _) in section.items()}
                options["sections"] = {target: given}
            config = options.pop("config")
            with reported_errors():
                spec = load_spec(config, targets=registry, **options)
            return fn(spec=spec, **kwargs)

        flags = [(name, hint, option) for name, (hint, option) in SPEC_OPTIONS.items()]
        flags += [(name, hint, option) for name, (_, hint, option) in section.items()]
        params = own + [
            inspect.Parameter(name, KEYWORD, default=None, annotation=Annotated[hint, option])
            for name, hint, option in flags
        ]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return command

    return decorate(fn) if fn is not None else decorate


def with_model_options(fn: Callable[..., Any]) -> Any:
    """Give a command one model's spec options, made as serve's are (`field_option`) but each
    given once and read from no variable (a shell's INFINITY_CLOUD_DTYPE, say, is meant for
    `serve`); it receives those given as `options`, a model of the spec less its `model_id`."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "options"]
    flags = {name: field_option(name, ModelSpec.model_fields[name], None, "Model") for name in MODEL_OPTIONS}

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in flags}
        return fn(options={k: v for k, v in given.items() if v is not None and v != []}, **kwargs)

    command.__signature__ = inspect.Signature(own + [  # type: ignore[attr-defined]
        inspect.Parameter(name, KEYWORD, default=None, annotation=Annotated[hint, option])
        for name, (hint, option) in flags.items()
    ])
    return command


def section_options(target: str) -> dict[str, tuple[str, Any, Any]]:
    """A target's spec section as CLI options: parameter name -> (field, type, typer option),
    made as the serve options are (`field_option`), the variable INFINITY_CLOUD_<TARGET>_<FIELD>."""
    section = registry.section_class(target)
    if section is None:
        return {}
    return {
        f"{target}__{field}": (field, *field_option(field, info, f"INFINITY_CLOUD_{target.upper()}_",
                                                    target.capitalize()))
        for field, info in section.model_fields.items()
    }

