"""int8 for OpenVINO: static post-training quantisation with NNCF, held to float32's answers.

Static int8 (weights and activations, activation ranges collected once on calibration
texts) is what OpenVINO's CPU plugin runs fastest: VNNI and AMX multiply int8 at about
twice their bfloat16 rate (all-MiniLM-L6-v2 here, 2-core EPYC with VNNI, 32 x 160 tokens:
int8 18.8k tokens/s against 13.3k bfloat16 and 4.7k float32). NNCF's transformer scheme
keeps the ops int8 hurts most (softmax, layer norms, GELU) in float.

The ranges come from built-in texts (`Calibration.statistics`), so a build needs no data of
the user's. What a caller gets is then compared with float32 on the held-out texts (and the
load's probes): where the worst cosine misses the bar (with `MARGIN`), matrix products stay
float32, one culprit at a time, found by bisection over the order int8 hurts them most
(`sensitive_matmuls`), until what is kept holds (on all-MiniLM-L6-v2 all int8 gave 0.9883 on
the probes, its first layer's feed-forward output in float 0.9936); where even all of them
cannot, the build fails with the numbers. NNCF's own accuracy control,
which reverts one op at a time, took over 13 minutes on MiniLM on 2 cores, and was dropped.
Needs `nncf` (the `export` extra) to build only: the int8 IR it writes is served by OpenVINO
alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import openvino as ov

from infinity_cloud.backends.base import Calibration
from infinity_cloud.core.errors import BackendUnavailableError, ModelLoadError
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.numerics.fidelity import agreement
from infinity_cloud.numerics.inputs import ModelInputs

log = logging.getLogger(__name__)

# In the export's key: a change to how int8 is built here rebuilds it.
SCHEME = "nncf-static-2"
# The most quantisations the search for what stays float32 makes.
MAX_TRIES = 12
# The held-out texts are a sample of what a corpus holds: aim this far above the bar (as
# `onnx_int8` does).
MARGIN = 0.002


def quantize_holding(
    model: ov.Model,
    names: list[str],
    compile_model: Callable[[ov.Model], ov.CompiledModel],
    calibration: Calibration,
    floor: float,
) -> tuple[ov.Model, dict[str, Any]]:
    """`model` (its inputs by `names`) in int8 whose answers on the held-out texts agree with
    float32's to `floor` (plus `MARGIN`), compiled for the check as it will be served
    (`compile_model`); with the facts kept in the export's manifest."""
    try:
        import nncf
    except ImportError as exc:
        raise BackendUnavailableError(
            "int8 on the openvino backend is built once with NNCF, which is not installed: "
            f"{install_command('export')} (only where the export is built; serving it "
            "needs OpenVINO alone)"
        ) from exc
    nncf.set_log_level(logging.WARNING)  # its progress bars and per-step info, in a server's log
    aim = min(floor + MARGIN, 1.0)

    def feed(batch: ModelInputs) -> dict[str, np.ndarray]:
        return batch.feed(names)

    def answers(compiled: ov.CompiledModel) -> list[np.ndarray]:
        return [calibration.head(compiled(feed(batch))[0], batch.attention_mask)
                for batch in calibration.held_out]

    expected = answers(compile_model(model))
    statistics = nncf.Dataset(calibration.statistics, feed)
    sensitive = sensitive_matmuls(model)
    texts = sum(batch.rows for batch in calibration.statistics)
    log.info("int8: activation ranges from %d texts, checked against float32 on %d held-out ones",
             texts, sum(batch.rows for batch in calibration.held_out))
    tried: dict[frozenset[str], tuple[float, ov.Model]] = {}
    # SmoothQuant moves activation outliers into the weights before quantising; at NNCF's
    # transformer default (0.95) all-int8 held 0.9883 on MiniLM's probes and 0.910 on mpnet's,
    # at 0.8 0.9959 and 0.986.
    smooth = nncf.quantization.advanced_parameters.AdvancedSmoothQuantParameters(matmul=0.8)
    advanced = nncf.quantization.advanced_parameters.AdvancedQuantizationParameters(
        smooth_quant_alphas=smooth)

    def holds(kept: list[str]) -> bool:
        """Whether int8 with the `kept` products in float32 holds the bar (each set tried once)."""
        key = frozenset(kept)
        if key not in tried:
            scope = nncf.IgnoredScope(names=list(kept)) if kept else None
            quantized = nncf.quantize(model, statistics, model_type=nncf.ModelType.TRANSFORMER,
                                      subset_size=len(calibration.statistics), ignored_scope=scope,
                                      advanced_parameters=advanced)
            got = answers(compile_model(quantized))
            tried[key] = (min(agreement(a, b) for a, b in zip(got, expected, strict=True)), quantized)
            log.info("int8: %d of %d matrix products in float32: worst cosine %.5f",
                     len(kept), len(sensitive), tried[key][0])
        return tried[key][0] >= aim

    # The products kept in float32, found a culprit at a time: the shortest prefix of the
    # sensitive order that holds the bar (by bisection) ends with one the bar needs; it is
    # kept, and the search starts again before it, until what is kept holds alone, or the
    # tries run out (each is a quantisation: about a minute for a base-size model on 2
    # cores), when the smallest set that held is taken.
    kept: list[str] = []
    candidates = sensitive
    holding: list[str] | None = None
    while not holds(kept) and len(tried) < MAX_TRIES:
        if not holds(kept + candidates):
            worst = max(score for score, _ in tried.values())
            raise ModelLoadError(
                f"int8 cannot hold this model's answers: worst cosine to float32 {worst:.5f} on the "
                f"held-out texts, below {aim:.4f} even with {len(kept + candidates)} of its matrix "
                "products in float32; serve it with --dtype bfloat16 or float32"
            )
        low, high = 0, len(candidates)  # low misses the bar, high holds it
        while high - low > 1:
            middle = (low + high) // 2
            if holds(kept + candidates[:middle]):
                high = middle
            else:
                low = middle
        if holding is None or high + len(kept) < len(holding):
            holding = kept + candidates[:high]
        kept.append(candidates[high - 1])
        candidates = candidates[: high - 1]
    if not holds(kept):
        assert holding is not None  # a round ran, and it found a set that holds
        log.info("int8: stopped after %d quantisations; %d matrix products stay float32",
                 len(tried), len(holding))
        kept = holding
    score, quantized = tried[frozenset(kept)]
    return quantized, {"held_out_agreement": score, "float32_layers": kept,
                       "statistics_texts": texts, "scheme": SCHEME}


# Activations whose output feeds a feed-forward block's second matrix product.
_ACTIVATIONS = {"Gelu", "Swish", "Relu"}


def sensitive_matmuls(model: ov.Model) -> list[str]:
    """The matrix products int8 hurts most, in the order they are kept in float32: those after
    the last layer (a cross-encoder's pooler and classifier, whose one score per input has no
    other layer to average its error over: on a tiny reranker they alone took the worst
    cosine from 0.985 to 0.990), then each layer's feed-forward output, first layer first (on
    all-mpnet-base-v2 all twelve took it from 0.910 to 0.991 on the probes), then each one's
    feed-forward input (mpnet's layer 9's, with them, to 0.995), then the rest in the graph's
    order."""
    names = [op.get_friendly_name() for op in model.get_ordered_ops() if op.get_type_name() == "MatMul"]
    feed_forward = feed_forward_outputs(model)
    tail = names[names.index(feed_forward[-1]) + 1 :] if feed_forward else []
    # Each feed-forward block's first product: the one before its activation.
    inputs = [names[names.index(name) - 1] for name in feed_forward if names.index(name) > 0]
    first = tail + feed_forward + [name for name in inputs if name not in tail + feed_forward]
    return first + [name for name in names if name not in first]


def feed_forward_outputs(model: ov.Model) -> list[str]:
    """The matrix products after each feed-forward block's activation (BERT's
    `output.dense`), first layer first."""
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        frontier, seen = [op], set()
        for _ in range(2):  # the activation, or one op between (a Multiply of a gated unit)
            frontier = [value.get_node() for node in frontier for value in node.input_values()]
            seen |= {node.get_type_name() for node in frontier}
        if seen & _ACTIVATIONS:
            found.append(op.get_friendly_name())
    return found
