"""AWS Neuron backend (Inferentia2, Trainium): models compiled ahead of time with
optimum-neuron, one graph per (batch rows, length) bucket of the spec.

A Neuron graph runs one static shape, so the spec must declare its buckets
(`--batch-buckets`, `--length-buckets`), and the batcher pads every batch to one of them.
Compiling takes minutes per bucket, so it happens only at image build
(`INFINITY_CLOUD_NEURON_COMPILE=1 infinity-cloud download`); a server that finds a bucket
not compiled refuses to start rather than compile. The compiled graphs are cached like any
export, keyed by the model's files and the options.

Written against optimum-neuron's documented API (`NeuronModelFor*.from_pretrained(...,
export=True, batch_size=, sequence_length=, auto_cast=, auto_cast_type=)`); the Neuron
compiler does not install outside AWS's own package index, so this module has not run in
this project's CI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from infinity_cloud.backends import exports
from infinity_cloud.backends.base import Backend
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import BackendUnavailableError, ConfigError, ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.core.install_hint import install_command
from infinity_cloud.numerics.inputs import ModelInputs

COMPILE_ENV = "INFINITY_CLOUD_NEURON_COMPILE"
_DTYPES = ("bfloat16", "float32")


def compiling_allowed() -> bool:
    return os.environ.get(COMPILE_ENV, "").lower() in {"1", "true", "yes"}


def buckets_of(spec: ModelSpec) -> list[tuple[int, int]]:
    """Every (rows, length) shape the model is compiled for: the spec's buckets, crossed."""
    if not spec.batch_buckets or not spec.length_buckets:
        raise ConfigError(
            "the neuron backend runs graphs compiled for static shapes: give --batch-buckets and "
            "--length-buckets (e.g. --batch-buckets 1,8 --length-buckets 128,512)"
        )
    return [(rows, length) for rows in spec.batch_buckets for length in spec.length_buckets]


def fit(inputs: ModelInputs, rows: int, length: int) -> dict[str, np.ndarray]:
    """The batch padded to a compiled shape: extra rows repeat the last one (dropped after),
    extra positions are padding the attention mask hides."""
    fitted = {}
    for name, array in inputs.arrays.items():
        array = np.pad(array, ((0, 0), (0, length - array.shape[1])))
        if rows > array.shape[0]:
            array = np.concatenate([array, np.repeat(array[-1:], rows - array.shape[0], axis=0)])
        fitted[name] = array
    return fitted


class NeuronBackend(Backend):
    name = "neuron"
    # optimum-neuron compiles feature extraction and sequence classification.
    graphs = frozenset({"token_states", "logits"})

    def __init__(self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None) -> None:
        super().__init__(info, spec, graph)
        if spec.device not in ("auto", "neuron"):
            raise ConfigError(f"the neuron backend runs on neuron devices, not {spec.device!r}")
        if spec.dtype not in ("auto", *_DTYPES):
            raise ConfigError(f"the neuron backend runs {' or '.join(_DTYPES)}, not {spec.dtype}")
        self.shapes = buckets_of(spec)
        self.device = "neuron"
        # Neuron's matmul units are built for bf16; auto casts matmuls to it.
        self.dtype = "bfloat16" if spec.dtype == "auto" else spec.dtype
        self._graphs = {shape: self._load(info, shape) for shape in self.shapes}
        config = next(iter(self._graphs.values())).config
        self._token_types = bool(getattr(config, "type_vocab_size", 0))

    def _model_class(self) -> Any:
        try:
            from optimum import neuron
        except ImportError as exc:
            raise BackendUnavailableError(
                "the neuron backend needs optimum-neuron and the Neuron SDK (a Neuron deep learning "
                f"container has them; else {install_command('neuron')} --extra-index-url "
                f"https://pip.repos.neuron.amazonaws.com): {exc}"
            ) from exc
        if self.graph == "token_states":
            return neuron.NeuronModelForFeatureExtraction
        return neuron.NeuronModelForSequenceClassification

    def _load(self, info: ModelInfo, shape: tuple[int, int]) -> Any:
        rows, length = shape
        options = {"rows": rows, "length": length, "dtype": self.dtype, "output": self.graph}

        beside = self.spec.export_into_folder
        compiled = exports.verify(exports.export_dir(info.path, "neuron", options, beside))
        if not compiled and not compiling_allowed():
            raise ModelLoadError(
                f"{info.path} is not compiled for Neuron at batch {rows} x length {length}; compile it "
                f"at image build ({COMPILE_ENV}=1 infinity-cloud download), not at start-up"
            )

        def compile_graph(out: Path) -> None:
            # float32: no auto-cast at all (the compiler's default keeps the model's precision).
            cast = {"auto_cast": "matmul", "auto_cast_type": "bf16"} if self.dtype == "bfloat16" else {}
            model = self._model_class().from_pretrained(
                str(info.path), export=True, batch_size=rows, sequence_length=length, **cast
            )
            model.save_pretrained(str(out))

        description = f"compiling {info.path.name} for Neuron at {rows} x {length}"
        folder = exports.cached_export(info.path, "neuron", options, compile_graph, description,
                                       beside=beside)
        return self._model_class().from_pretrained(str(folder))

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        import torch

        rows, length = inputs.input_ids.shape
        shape = min((s for s in self.shapes if s[0] >= rows and s[1] >= length), default=None)
        if shape is None:
            raise ModelLoadError(f"batch {rows} x {length} is larger than every compiled shape {self.shapes}")
        feed = {name: torch.from_numpy(array) for name, array in fit(inputs, *shape).items()}
        if not self._token_types:
            del feed["token_type_ids"]
        out = self._graphs[shape](**feed)
        result = out.last_hidden_state if self.graph == "token_states" else out.logits
        return result[:rows, :length].float().numpy() if result.ndim == 3 else result[:rows].float().numpy()
