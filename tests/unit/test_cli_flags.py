"""The serve options are made from the spec, as target flags are: every field a flat source
may set has its flag (and variable), every flag sets a field, and its help is the field's
description, so the command line cannot drift from the spec."""

from __future__ import annotations

from infinity_cloud.cli import SPEC_OPTIONS
from infinity_cloud.core.config import FILE_ONLY, LimitsSpec, ModelSpec, ServerSpec

SPECS = (ModelSpec, ServerSpec, LimitsSpec)
FIELDS = {f for spec in SPECS for f in spec.model_fields}


def test_every_settable_field_has_a_flag() -> None:
    missing = sorted(FIELDS - set(FILE_ONLY) - set(SPEC_OPTIONS))
    assert missing == [], f"spec fields without a flag in cli.spec_flags.SPEC_OPTIONS: {missing}"


def test_every_flag_sets_a_field() -> None:
    # model_id is FILE_ONLY for the pairing of per-model options, yet the flag that lists models.
    assert sorted(set(SPEC_OPTIONS) - FIELDS - {"config"}) == []


def test_each_flags_help_is_its_fields_description() -> None:
    for name, (_, option) in SPEC_OPTIONS.items():
        if name == "config":
            continue
        info = next(spec.model_fields[name] for spec in SPECS if name in spec.model_fields)
        assert info.description, f"{name} has no description, so its flag has no help"
        assert option.help.startswith(info.description), name


def declared(name: str) -> tuple[str, ...]:
    """An option's flags (typer keeps the first positional as `default` in an Annotated hint)."""
    option = SPEC_OPTIONS[name][1]
    return (option.default, *option.param_decls)


def test_a_fields_own_flag_and_variable_are_used() -> None:
    assert declared("api_keys") == ("--api-key",)
    assert SPEC_OPTIONS["api_keys"][1].envvar == "INFINITY_CLOUD_API_KEY"
    assert declared("latency") == ("--latency/--throughput",)
    assert SPEC_OPTIONS["port"][1].help.endswith("(default: 7997)")
