"""Every field of the spec that a flat source may set has its flag (and variable), and every
flag sets a field: the hand-written help cannot drift from the spec."""

from __future__ import annotations

from infinity_cloud.cli import SPEC_OPTIONS
from infinity_cloud.config import FILE_ONLY, LimitsSpec, ModelSpec, ServerSpec

FIELDS = {f for spec in (ModelSpec, ServerSpec, LimitsSpec) for f in spec.model_fields}


def test_every_settable_field_has_a_flag() -> None:
    missing = sorted(FIELDS - set(FILE_ONLY) - set(SPEC_OPTIONS))
    assert missing == [], f"spec fields without a flag in cli.SPEC_OPTIONS: {missing}"


def test_every_flag_sets_a_field() -> None:
    # model_id is FILE_ONLY for the pairing of per-model options, yet the flag that lists models.
    assert sorted(set(SPEC_OPTIONS) - FIELDS - {"config"}) == []
