"""int8 for ONNX Runtime that keeps its fidelity: accuracy-aware dynamic quantisation.

Dynamic quantisation (per-channel int8 weights, uint8 activations scaled per batch) needs no
calibrated activation ranges, but a few layers lose far more than the rest: on
all-MiniLM-L6-v2 the first layer's feed-forward output alone takes the worst cosine to
float32 from 0.97 to 0.98. So each layer is ranked by how much the model's outputs on
calibration texts lose when it alone is int8, and the fewest of the worst that make the
outputs on held-out texts agree with float32's to `floor` stay in float32.

Both are measured on a simulation: the float32 graph with every candidate layer's input and
weight passed through int8 and back (ONNX's DynamicQuantizeLinear, as ONNX Runtime's kernels
quantise), each layer switched on or off by an input of its own, so one session answers
every question and a base-size model ranks in a minute, where a quantisation per try would
take 20 s each. The chosen set is then quantised for real and measured again; where the real
kernels lose more than the simulation (u8 x s8 sums saturate in int16 on CPUs without VNNI),
more layers stay float32 until it holds.
All of it is measured on the CPU that builds the export; the load-time verdict
(`backend_choice`) measures again on the CPU that serves it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from infinity_cloud.backends.base import Calibration
from infinity_cloud.core.hardware import int8_kernels
from infinity_cloud.numerics.fidelity import agreement
from infinity_cloud.numerics.heads import Head
from infinity_cloud.numerics.inputs import ModelInputs

log = logging.getLogger(__name__)

# The held-out texts are a sample: the worst cosine over a user's whole corpus is lower than
# over them (all-MiniLM-L6-v2 built to 0.9905 on them gave 0.9896 on 400 passages), so the
# search aims this far above the bar.
MARGIN = 0.002
# The ops whose weights are made int8, weight at input 1 (the word embeddings, a lookup that
# int8 makes no faster, stay float32).
QUANTIZED_OPS = ("MatMul", "Attention")
_SWITCH = "int8_switch_"  # the simulation's per-layer inputs: 1 quantises that layer


def quantize_holding(source: Path, target: Path, calibration: Calibration, floor: float) -> dict[str, Any]:
    """Write the int8 model to `target`; returns what was kept in float32 and the agreement
    measured on the held-out texts."""
    import onnx

    floor = min(floor + MARGIN, 1.0)
    model = onnx.load(str(source))
    layers = candidates(model)
    with tempfile.TemporaryDirectory(prefix="int8-") as folder:
        path = simulated(model, layers, Path(folder) / "simulated.onnx")
        simulation = Simulation(path, layers, calibration.head)
        del model
        reference = simulation.outputs(calibration.held_out, set())
        log.info("int8: ranking %d layers by what each loses alone (a run each)", len(layers))
        ranked = simulation.rank(calibration.batches)
        # The fewest worst-ranked layers kept in float32 that hold the bar, by bisection.
        low, high = -1, len(ranked)  # low misses the bar (or is below any), high holds it
        while high - low > 1:
            middle = (low + high) // 2
            quantised = set(ranked[middle:])
            if agreement(simulation.outputs(calibration.held_out, quantised), reference) >= floor:
                high = middle
            else:
                low = middle
        del simulation
    log.info("int8: the simulation keeps %d of %d layers in float32; quantising for real", high, len(ranked))
    kept, step = high, 1
    # Where u8 x s8 pairs are summed in int16 (no VNNI), large activations times large weights
    # saturate: ONNX Runtime's answer is 7-bit weights (`reduce_range`), which costs precision
    # where nothing saturates. Both are measured there and the better kept.
    ranges = (False,) if int8_kernels() in ("vnni", "amx") else (False, True)
    while True:
        score, reduce_range = max(
            (_real(source, target, ranked[:kept], reduced, calibration, reference), reduced)
            for reduced in ranges
        )
        if score >= floor or kept == len(ranked):
            break
        kept, step = min(kept + step, len(ranked)), step * 2
    if reduce_range != ranges[-1]:  # the file holds the last one built
        quantize(source, target, ranked[:kept], reduce_range)
    if score < floor:
        log.warning(
            "int8 reaches only %.4f (< %.3f) on held-out texts even with every layer in float32", score, floor
        )
    log.info(
        "int8: %d of %d layers quantised, %.5f on held-out texts", len(ranked) - kept, len(ranked), score
    )
    return {
        "float32_layers": ranked[:kept], "int8_layers": len(ranked) - kept, "held_out_agreement": score,
        "reduce_range": reduce_range, "built_on": int8_kernels(),
    }


def _real(
    source: Path, target: Path, kept: list[str], reduce_range: bool, calibration: Calibration,
    reference: np.ndarray,
) -> float:
    """Quantise for real (to `target`) and measure on the held-out texts."""
    quantize(source, target, kept, reduce_range)
    return agreement(_outputs(target, calibration.held_out, calibration.head), reference)


def candidates(model: Any) -> list[Any]:
    """The nodes dynamic quantisation makes int8: those of QUANTIZED_OPS with a stored weight."""
    weights = {init.name: init for init in model.graph.initializer}
    return [
        node for node in model.graph.node
        if node.op_type in QUANTIZED_OPS and len(node.input) > 1 and node.input[1] in weights
        and len(weights[node.input[1]].dims) == 2
    ]


def simulated(model: Any, layers: list[Any], path: Path) -> Path:
    """Save `model` with each of `layers` reading int8-and-back input and weight when its
    switch input is 1: x + s (dq(q(x)) - x) and w + s (dq(q(w)) - w)."""
    import onnx
    from onnx import helper, numpy_helper

    weights = {init.name: init for init in model.graph.initializer}
    for index, node in enumerate(layers):
        switch, x, w = f"{_SWITCH}{index}", node.input[0], node.input[1]
        model.graph.input.append(helper.make_tensor_value_info(switch, onnx.TensorProto.FLOAT, []))
        exact = numpy_helper.to_array(weights[w]).astype(np.float32)
        error = _int8_per_channel(exact) - exact
        model.graph.initializer.append(numpy_helper.from_array(error, f"{w}_int8_error"))
        p = f"int8_sim_{index}_"
        node.input[0], node.input[1] = f"{p}x", f"{p}w"
        model.graph.node.extend([
            helper.make_node("DynamicQuantizeLinear", [x], [f"{p}xq", f"{p}xs", f"{p}xz"]),
            helper.make_node("DequantizeLinear", [f"{p}xq", f"{p}xs", f"{p}xz"], [f"{p}xdq"]),
            helper.make_node("Sub", [f"{p}xdq", x], [f"{p}xe"]),
            helper.make_node("Mul", [f"{p}xe", switch], [f"{p}xes"]),
            helper.make_node("Add", [x, f"{p}xes"], [f"{p}x"]),
            helper.make_node("Mul", [f"{w}_int8_error", switch], [f"{p}we"]),
            helper.make_node("Add", [w, f"{p}we"], [f"{p}w"]),
        ])
    _sort(model.graph)
    onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    return path


def _sort(graph: Any) -> None:
    """Nodes in an order where each one's inputs are made before it (ONNX requires it)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        waiting = []
        for node in pending:
            if all(name in ready for name in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):  # inputs made by nothing: keep them as they were
            ordered.extend(waiting)
            break
        pending = waiting
    del graph.node[:]
    graph.node.extend(ordered)


class Simulation:
    """A session over the simulated graph: outputs with any set of layers int8."""

    def __init__(self, path: Path, layers: list[Any], head: Head) -> None:
        self.session = _session(path)
        self.names = [node.name for node in layers]
        self.head = head

    def outputs(self, batches: list[ModelInputs], quantised: set[str]) -> np.ndarray:
        switches = {
            f"{_SWITCH}{i}": np.array(1.0 if name in quantised else 0.0, dtype=np.float32)
            for i, name in enumerate(self.names)
        }
        return _outputs(self.session, batches, self.head, switches)

    def rank(self, batches: list[ModelInputs]) -> list[str]:
        """The layers, the one whose int8 alone loses most first."""
        reference = self.outputs(batches, set())
        loss = {name: 1 - agreement(self.outputs(batches, {name}), reference) for name in self.names}
        return sorted(loss, key=loss.__getitem__, reverse=True)


def _int8_per_channel(w: np.ndarray) -> np.ndarray:
    """Symmetric int8 per output column (the weight's last axis), then back."""
    scale = np.abs(w).max(axis=0, keepdims=True) / 127
    scale[scale == 0] = 1.0
    return np.clip(np.round(w / scale), -127, 127) * scale


def quantize(source: Path, target: Path, kept: list[str] | None = None, reduce_range: bool = False) -> None:
    """Dynamic int8 of every quantisable layer but those `kept` in float32; `reduce_range`:
    7-bit weights."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel weights keep cosine to float32 far higher than one scale per tensor.
    quantize_dynamic(
        source, target, weight_type=QuantType.QInt8, per_channel=True, reduce_range=reduce_range,
        op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_exclude=list(kept or ()),
        # Fused contrib ops carry no type information for the quantiser's shape inference.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _session(path: Path) -> Any:
    import onnxruntime as ort

    from infinity_cloud.core.hardware import usable_cores

    options = ort.SessionOptions()
    options.intra_op_num_threads = usable_cores()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _outputs(
    model: Path | Any, batches: list[ModelInputs], head: Head, switches: dict[str, np.ndarray] | None = None
) -> np.ndarray:
    """The model's rows on `batches` through the task's head, as one array (per-token outputs
    as one row per real token); `model` is a file or an open session."""
    session = _session(model) if isinstance(model, Path) else model
    names = [i.name for i in session.get_inputs() if not i.name.startswith(_SWITCH)]
    first = session.get_outputs()[0].name
    rows = []
    for batch in batches:
        mask = batch.attention_mask
        out = session.run([first], {**batch.feed(names), **(switches or {})})[0].astype(np.float32)
        out = head(out, mask)
        rows.append(out[mask.astype(bool)] if out.ndim == 3 and mask is not None else out)
    return np.concatenate(rows)
