"""The deployment spec: validation and the file < env < flags merge."""

from __future__ import annotations

import pytest

from infinity_cloud.core.config import DEFAULT_MODEL_ID, DeploymentSpec, ModelSpec, load_spec, merge_overrides
from infinity_cloud.core.errors import ConfigError


def test_default_spec_serves_the_default_model():
    spec = DeploymentSpec()
    assert [m.model_id for m in spec.models] == [DEFAULT_MODEL_ID]
    assert spec.models[0].name == DEFAULT_MODEL_ID
    assert spec.server.port == 7997


def test_flags_replace_the_file_models_and_apply_per_model_options(tmp_path):
    config = tmp_path / "infinity-cloud.yaml"
    config.write_text("models:\n  - model_id: from-file\n    dtype: float16\nserver:\n  port: 9000\n")
    assert load_spec(config).models[0].dtype == "float16"
    spec = load_spec(config, model_id=["a", "b"], served_model_name=["x", "y"], dtype=["bfloat16"])
    assert [(m.model_id, m.name, m.dtype) for m in spec.models] == [
        ("a", "x", "bfloat16"),
        ("b", "y", "bfloat16"),
    ]
    assert spec.server.port == 9000  # the file still holds what the flags do not override


def test_per_model_option_applies_to_file_models(tmp_path):
    config = tmp_path / "spec.yaml"
    config.write_text("models:\n  - model_id: a\n  - model_id: b\n")
    spec = load_spec(config, device=["cpu"], batch_tokens=[1024, 2048])
    assert [(m.device, m.batch_tokens) for m in spec.models] == [("cpu", 1024), ("cpu", 2048)]


def test_mismatched_per_model_counts_are_refused():
    with pytest.raises(ConfigError, match="given 2 times for 3 models"):
        load_spec(model_id=["a", "b", "c"], served_model_name=["x", "y"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model_id": ["a", "a"]}, "must be unique"),
        ({"dtype": ["float8"]}, "models.0.dtype"),
        ({"port": 70000}, "server.port"),
        ({"max_inputs_per_request": 10}, "max_inputs_per_request"),
    ],
)
def test_invalid_specs_say_which_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(**overrides)


def test_bad_config_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_spec(tmp_path / "missing.yaml")


def test_url_prefix_is_normalised():
    assert load_spec(url_prefix="api/").server.url_prefix == "/api"


def test_spec_is_frozen():
    with pytest.raises(ValueError):
        ModelSpec().model_id = "x"  # type: ignore[misc]


def test_merge_keeps_unknown_options_out():
    with pytest.raises(ConfigError, match="unknown options: colour"):
        merge_overrides({}, {"colour": "red"})
