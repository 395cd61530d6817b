"""The neuron backend (Inferentia2) as far as it runs without the Neuron SDK: it demands
static shapes, never compiles at start-up, names what to install, and fits any batch to a
compiled shape. Compiling and running the graphs needs optimum-neuron and the Neuron
compiler, which install only from AWS's own package index: not run here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.backends import exports, registry
from infinity_cloud.backends.neuron_backend import COMPILE_ENV, buckets_of, fit
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.numerics.inputs import ModelInputs

BUCKETS = {"batch_buckets": (1, 4), "length_buckets": (16, 64)}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(exports.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


async def load(path: Path, **options: object) -> None:
    async with Engine(ModelSpec(model_id=str(path), backend="neuron", **options)):
        pass


async def test_a_server_never_compiles_at_start_up(tiny_embedder: Path, cache: Path, monkeypatch) -> None:
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    message = rf"not compiled for Neuron at batch 1 x length 16.*{COMPILE_ENV}=1"
    with pytest.raises(ModelLoadError, match=message):
        await load(tiny_embedder, **BUCKETS)
    assert not cache.exists() or not any(cache.iterdir())  # nothing recorded: the image build may compile


async def test_the_build_step_names_what_to_install(tiny_embedder: Path, cache: Path, monkeypatch) -> None:
    monkeypatch.setenv(COMPILE_ENV, "1")
    message = "optimum-neuron.*" + re.escape(install_command("neuron")) + ".*pip.repos.neuron"
    with pytest.raises(BackendUnavailableError, match=message):
        await load(tiny_embedder, **BUCKETS)


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_buckets": (1, 8)}, "--length-buckets"),
    ({"length_buckets": (128,)}, "--batch-buckets"),
    ({**BUCKETS, "dtype": "int8"}, "runs bfloat16 or float32"),
    ({**BUCKETS, "device": "cuda"}, "runs on neuron devices"),
])
async def test_what_it_cannot_run_is_a_config_error(tiny_embedder: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        await load(tiny_embedder, **options)


def test_the_shapes_are_the_buckets_crossed() -> None:
    assert buckets_of(ModelSpec(**BUCKETS)) == [(1, 16), (1, 64), (4, 16), (4, 64)]


def test_a_batch_is_fitted_to_a_compiled_shape_without_changing_its_rows() -> None:
    ids = np.array([[101, 7, 102], [101, 102, 0]])
    mask = (ids > 0).astype(np.int64)
    inputs = ModelInputs({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    fitted = fit(inputs, 4, 8)
    assert {k: v.shape for k, v in fitted.items()} == {k: (4, 8) for k in ("input_ids", "attention_mask",
                                                                         "token_type_ids")}
    np.testing.assert_array_equal(fitted["input_ids"][:2, :3], ids)
    assert not fitted["attention_mask"][:, 3:].any()  # padding the mask hides
    np.testing.assert_array_equal(fitted["input_ids"][2], fitted["input_ids"][1])  # filler rows repeat


def test_auto_is_never_neuron_off_a_neuron_machine_and_not_installed_is_no_crash() -> None:
    assert not registry.installed("neuron")  # `optimum` itself is absent here
    assert registry.auto_order("neuron") == ("neuron",)
    assert "neuron" not in registry.auto_order("cpu") + registry.auto_order("cuda")
