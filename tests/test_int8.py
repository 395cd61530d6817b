"""Accuracy-aware int8 (`backends/onnx_int8`): layers ranked by what their own quantisation
loses, and a model built to hold its bar on held-out texts with as many int8 layers as hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from infinity_cloud.backends import onnx_int8  # noqa: E402
from infinity_cloud.backends.base import Calibration  # noqa: E402
from infinity_cloud.numerics.fidelity import agreement  # noqa: E402
from infinity_cloud.numerics.inputs import ModelInputs  # noqa: E402


def two_layers(path: Path, outlier: float) -> Path:
    """x -> MatMul(first) -> hidden -> MatMul(second) -> y, where `first` makes one hidden
    column `outlier` times larger than the rest: the activation outliers of real encoders,
    which one uint8 scale over the whole tensor resolves badly for `second`."""
    rng = np.random.default_rng(0)
    first = rng.normal(size=(16, 32)).astype(np.float32)
    first[:, 0] *= outlier
    second = rng.normal(size=(32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "first_w"], ["hidden"], name="first"),
            helper.make_node("MatMul", ["hidden", "second_w"], ["y"], name="second"),
        ],
        "two_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(first, "first_w"), numpy_helper.from_array(second, "second_w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def batches(count: int, seed: int) -> list[ModelInputs]:
    rng = np.random.default_rng(seed)
    return [ModelInputs({"x": rng.normal(size=(64, 16)).astype(np.float32)}) for _ in range(count)]


def identity(rows: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    return rows


def simulation(source: Path, folder: Path) -> onnx_int8.Simulation:
    model = onnx.load(str(source))
    layers = onnx_int8.candidates(model)
    return onnx_int8.Simulation(onnx_int8.simulated(model, layers, folder / "sim.onnx"), layers, identity)


def test_the_layer_fed_by_outliers_ranks_first(tmp_path: Path) -> None:
    source = two_layers(tmp_path / "m.onnx", outlier=200.0)
    assert simulation(source, tmp_path).rank(batches(2, 1)) == ["second", "first"]


def test_the_simulation_is_the_real_int8_model(tmp_path: Path) -> None:
    """All switches off: float32 exactly; all on: the error of ONNX Runtime's int8 kernels
    (with 7-bit weights, which no CPU's kernels saturate: 8-bit ones lose 7x more than exact
    int8 on an AVX2-only CPU, which the build measures for itself)."""
    source = two_layers(tmp_path / "m.onnx", outlier=200.0)
    sim, held_out = simulation(source, tmp_path), batches(2, 2)
    exact = onnx_int8._outputs(source, held_out, identity)
    np.testing.assert_array_equal(sim.outputs(held_out, set()), exact)
    real = tmp_path / "int8.onnx"
    onnx_int8.quantize(source, real, reduce_range=True)
    real_error = np.abs(onnx_int8._outputs(real, held_out, identity) - exact).max()
    simulated_error = np.abs(sim.outputs(held_out, {"first", "second"}) - exact).max()
    assert 0.5 * simulated_error < real_error < 2 * simulated_error


def test_what_loses_most_stays_float32_until_the_bar_holds(tmp_path: Path) -> None:
    source = two_layers(tmp_path / "m.onnx", outlier=200.0)
    calibration = Calibration(batches(2, 1), batches(2, 2), identity, batches(2, 3))

    all_int8 = tmp_path / "all.onnx"
    onnx_int8.quantize(source, all_int8)
    reference = onnx_int8._outputs(source, calibration.held_out, identity)
    naive = agreement(onnx_int8._outputs(all_int8, calibration.held_out, identity), reference)

    target = tmp_path / "int8.onnx"
    floor = min(naive + (1 - naive) / 2, 0.999)  # a bar the all-int8 model misses
    facts = onnx_int8.quantize_holding(source, target, calibration, floor)
    got = agreement(onnx_int8._outputs(target, calibration.held_out, identity), reference)
    assert naive < floor <= got == pytest.approx(facts["held_out_agreement"])
    assert facts["float32_layers"] == ["second"] and facts["int8_layers"] == 1
    ops = [node.op_type for node in onnx.load(str(target)).graph.node]
    assert "MatMul" in ops and ({"MatMulInteger", "DynamicQuantizeMatMul"} & set(ops))
