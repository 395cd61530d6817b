"""A deterministic backend with no ML dependency, for tests, examples and batcher benchmarks.

Token states are rows of a fixed pseudo-random table, so equal inputs give equal outputs in
any batch. `backend_options` can slow it down (`delay_s` per batch, `load_delay_s` at load),
make a batch fail when it holds a given token id (`fail_token_id`), run out of device memory
as the torch backend reports it (`oom_token_id`: `DeviceMemoryError`), or kill the worker thread
with a non-`Exception` error, as a crash would (`exit_token_id`): that is how tests inject
faults over HTTP.
"""

from __future__ import annotations

import time

import numpy as np

from infinity_cloud.backends.base import Backend
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import DeviceMemoryError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.numerics.inputs import ModelInputs


class FakeBackend(Backend):
    name = "fake"
    graphs = frozenset({"token_states", "logits"})

    def __init__(self, info: ModelInfo, spec: ModelSpec, graph: GraphOutput | None = None) -> None:
        super().__init__(info, spec, graph)
        rng = np.random.default_rng(0)
        width = info.hidden_size or 32
        self._table = rng.standard_normal((int(info.vocab_size or 30522), width)).astype(np.float32)
        self._labels = rng.standard_normal((width, max(len(info.labels), 1))).astype(np.float32)
        options = spec.backend_options
        self.delay_s = float(options.get("delay_s", 0.0))
        self.fail_token_id = _token_id(options.get("fail_token_id"))
        self.exit_token_id = _token_id(options.get("exit_token_id"))
        self.oom_token_id = _token_id(options.get("oom_token_id"))
        time.sleep(float(options.get("load_delay_s", 0.0)))

    def forward(self, inputs: ModelInputs) -> np.ndarray:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_token_id is not None and (inputs.input_ids == self.fail_token_id).any():
            raise RuntimeError(f"injected fault: token {self.fail_token_id} in batch")
        if self.oom_token_id is not None and (inputs.input_ids == self.oom_token_id).any():
            raise DeviceMemoryError(f"injected: a batch with {self.oom_token_id} did not fit the memory")
        if self.exit_token_id is not None and (inputs.input_ids == self.exit_token_id).any():
            raise SystemExit(f"injected crash: token {self.exit_token_id} in batch")
        states = self._table[inputs.input_ids]
        if self.graph == "token_states":
            return states
        mask = inputs.attention_mask[:, :, None]
        pooled = (states * mask).sum(1) / mask.sum(1)
        return pooled @ self._labels


def _token_id(value: str | int | float | bool | None) -> int | None:
    return None if value is None else int(value)
