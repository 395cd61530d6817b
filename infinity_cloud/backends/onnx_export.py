"""The model as one ONNX file: the folder's own, or exported from its weights once and cached.

ONNX Runtime and OpenVINO both start from this file, so there is one export path. Only the
export itself needs torch and transformers; a folder that holds `model.onnx` (or a cached
export) is served without them.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

from infinity_cloud.core.errors import BackendUnavailableError, ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.install_hint import install_command

OWN_ONNX_FILES = ("model.onnx", "onnx/model.onnx")
# sentence-transformers' OpenVINO export (`export_static_quantized_openvino_model` and
# friends write variants beside it, which are not this float model).
OWN_OPENVINO_FILES = ("openvino_model.xml", "openvino/openvino_model.xml")
OWN_EXPORT_FILES = {"onnx": OWN_ONNX_FILES, "openvino": OWN_ONNX_FILES + OWN_OPENVINO_FILES}
def export_install() -> str:
    """The conversion's packages, with torch's CPU build first: PyPI's torch for Linux is the
    CUDA one (2.8 GB of NVIDIA libraries a CPU never uses)."""
    torch_cpu = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    return f"{torch_cpu} && {install_command('export')}"


EXPORT_FILE = "model.onnx"
_OPSET = 17
# What torch.onnx needs to write an ONNX file: without `onnx` it fails after the weights load.
EXPORT_MODULES = ("torch", "transformers", "onnx")


def own_export(info: ModelInfo, names: tuple[str, ...], graph: GraphOutput | None = None) -> Path | None:
    """A file of `names` that the model folder ships (made by optimum-cli or
    sentence-transformers), used as is. Only for graphs such a file holds (`Graph.own_onnx`:
    an encoder's states, a classifier's logits)."""
    if not info.family.graph(graph or info.towers["text"]).own_onnx:
        return None
    return next((info.path / name for name in names if (info.path / name).is_file()), None)


def own_onnx(info: ModelInfo, graph: GraphOutput | None = None) -> Path | None:
    """The ONNX file the model folder ships, if any (`own_export`)."""
    return own_export(info, OWN_ONNX_FILES, graph)


class OnnxSource:
    """A graph's ONNX file: the folder's own, else our export, built only when `path()` is
    asked for, which a backend does only to build its own export from it. `label` names it in
    cache keys without its absolute path (a moved folder keeps its exports), so a backend
    whose export is cached never needs it, and an image may leave it out."""

    def __init__(
        self, info: ModelInfo, graph: GraphOutput, trust_remote_code: bool, backend: str,
        beside: bool = False,
    ) -> None:
        from infinity_cloud.backends.exports import export_dir

        self._info, self._graph, self._trust, self._backend = info, graph, trust_remote_code, backend
        self._beside = beside  # --export-into-folder (`exports.cache_root`)
        self.own = own_onnx(info, graph)
        # A trusted export (the repository's own code ran to make it) is kept apart from one made
        # without: a server that does not trust remote code never serves what such code built.
        trusted = {"trust_remote_code": True} if trust_remote_code else {}
        self._options = {"opset": _OPSET, "output": graph, **trusted}
        self.label = (self.own.relative_to(info.path).as_posix() if self.own is not None
                      else export_dir(info.path, "onnx", self._options, beside).name)

    def path(self) -> Path:
        """The ONNX file, exported now if it is not cached (an intermediate: see `exports.prune`)."""
        from infinity_cloud.backends.exports import cached_export

        if self.own is not None:
            return self.own
        info, graph = self._info, self._graph
        folder = cached_export(
            info.path, "onnx", self._options,
            lambda out: export_onnx(info, graph, out / EXPORT_FILE, self._trust, self._backend),
            f"exporting {info.path.name} ({graph}) to ONNX", intermediate=True, beside=self._beside,
        )
        return folder / EXPORT_FILE


def export_onnx(
    info: ModelInfo, graph: GraphOutput, target: Path, trust_remote_code: bool, backend: str
) -> dict[str, Any]:
    """Trace the graph (its family's, `backends/graphs.py`) to ONNX with dynamic batch (and
    sequence) axes, in float32, on the family's example inputs."""
    missing = next((name for name in EXPORT_MODULES if importlib.util.find_spec(name) is None), None)
    if missing is not None:
        # Checked before loading any weights, so a missing package costs nothing at each start.
        raise BackendUnavailableError(
            f"backend {backend!r} needs a one-time ONNX export of {info.path}, which needs torch, "
            f"transformers and onnx ({missing} is not installed): {export_install()}; or give a model "
            f"whose folder holds its own export ({' or '.join(OWN_EXPORT_FILES[backend])})"
        )
    import torch

    from infinity_cloud.backends.graphs import build_graph
    from infinity_cloud.core.config import ModelSpec

    spec = ModelSpec(model_id=str(info.path), trust_remote_code=trust_remote_code)
    # Eager attention: SDPA paths branch in Python on the mask, which a trace would freeze.
    model = build_graph(info, spec, graph, torch.float32, attention="eager")
    names = list(model.input_names)
    example, axes = model.graph.example(info, model.input_names)
    axes[graph] = {0: "batch", 1: "sequence"} if model.graph.per_token else {0: "batch"}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer chatter about Python branches on shapes
            torch.onnx.export(
                model, example, str(target), input_names=names, output_names=[graph],
                dynamic_axes=axes, opset_version=_OPSET, dynamo=False, do_constant_folding=True,
            )
    except Exception as exc:
        raise ModelLoadError(
            f"exporting {info.path} ({info.model_type}) to ONNX failed: {type(exc).__name__}: {exc}; "
            "serve it with --backend torch instead"
        ) from exc
    return {"inputs": names, "output": graph}
