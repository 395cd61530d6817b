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

from infinity_cloud.errors import BackendUnavailableError, ModelLoadError
from infinity_cloud.model_files import ModelInfo

OWN_ONNX_FILES = ("model.onnx", "onnx/model.onnx")
EXPORT_FILE = "model.onnx"
_OPSET = 17
# What torch.onnx needs to write an ONNX file: without `onnx` it fails after the weights load.
EXPORT_MODULES = ("torch", "transformers", "onnx")


def own_onnx(info: ModelInfo) -> Path | None:
    """An ONNX file the model folder ships (e.g. made by optimum-cli), used as is."""
    for name in OWN_ONNX_FILES:
        if (info.path / name).is_file():
            return info.path / name
    return None


def source_label(info: ModelInfo, source: Path) -> str:
    """Name an ONNX source in cache keys without its absolute path (a moved folder keeps its
    exports): the folder's own file by its relative path, our export by its digest."""
    return source.relative_to(info.path).as_posix() if source == own_onnx(info) else source.parent.name


def onnx_file(info: ModelInfo, trust_remote_code: bool, backend: str) -> Path:
    """The folder's own ONNX file, else the cached export (built now if missing or corrupt)."""
    from infinity_cloud.backends.exports import cached_export

    own = own_onnx(info)
    if own is not None:
        return own
    folder = cached_export(
        info.path,
        "onnx",
        {"opset": _OPSET, "output": info.output},
        lambda out: export_onnx(info, out / EXPORT_FILE, trust_remote_code, backend),
        f"exporting {info.path.name} to ONNX",
    )
    return folder / EXPORT_FILE


def export_onnx(info: ModelInfo, target: Path, trust_remote_code: bool, backend: str) -> dict[str, Any]:
    """Trace the transformers model to ONNX with dynamic batch and sequence axes, in float32."""
    missing = next((name for name in EXPORT_MODULES if importlib.util.find_spec(name) is None), None)
    if missing is not None:
        # Checked before loading any weights, so a missing package costs nothing at each start.
        raise BackendUnavailableError(
            f"backend {backend!r} needs a one-time ONNX export of {info.path}, which needs torch, "
            f"transformers and onnx ({missing} is not installed): pip install 'infinity-cloud[{backend}]', "
            "or give a model folder that holds model.onnx"
        )
    import torch

    from infinity_cloud.backends.torch_backend import load_model, takes_token_types
    from infinity_cloud.config import ModelSpec

    spec = ModelSpec(model_id=str(info.path), trust_remote_code=trust_remote_code)
    # Eager attention: SDPA paths branch in Python on the mask, which a trace would freeze.
    model = load_model(info, spec, torch.float32, attention="eager")
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_token_types(model) else [])
    output = info.output

    class _Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            out = self.model(**dict(zip(names, tensors, strict=True)))
            return out.last_hidden_state if output == "token_states" else out.logits

    # The example has padding and two lengths so no mask branch is traced as "no padding".
    ids = torch.full((2, 8), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[output] = {0: "batch", 1: "sequence"} if output == "token_states" else {0: "batch"}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer chatter about Python branches on shapes
            torch.onnx.export(
                _Graph(), example, str(target), input_names=names, output_names=[output],
                dynamic_axes=axes, opset_version=_OPSET, dynamo=False, do_constant_folding=True,
            )
    except Exception as exc:
        raise ModelLoadError(
            f"exporting {info.path} ({info.model_type}) to ONNX failed: {type(exc).__name__}: {exc}; "
            "serve it with --backend torch instead"
        ) from exc
    return {"inputs": names, "output": output}
