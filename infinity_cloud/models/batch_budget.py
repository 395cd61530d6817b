"""How big a tower's batches are: tokens and inputs per batch from the spec, the static
shapes a batch is padded to, and a token budget cut to what fits the device's memory."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from infinity_cloud.backends import Backend
from infinity_cloud.backends.registry import default_batch_size
from infinity_cloud.batching import BatchQueue
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.errors import DeviceMemoryError, ModelLoadError
from infinity_cloud.core.family import GraphOutput, ModelInfo
from infinity_cloud.numerics.inputs import Encoded, ModelInputs

log = logging.getLogger(__name__)

# What a batch's large per-token intermediates may take (`Graph.token_bytes`): SPLADE's
# vocabulary logits are 4 bytes x vocabulary per token, so its batches hold fewer tokens.
_LARGE_INTERMEDIATES_BYTES = 256 * 1024 * 1024


def batch_tokens(spec: ModelSpec, info: ModelInfo, graph: GraphOutput) -> int:
    """Padded tokens per batch: the spec's, capped for graphs whose per-token intermediates
    are large (SPLADE: 30,522 floats a token, 2 GB for the default budget)."""
    token_bytes = info.family.graph(graph).token_bytes
    if token_bytes is not None:
        cap = max(64, _LARGE_INTERMEDIATES_BYTES // token_bytes(info))
        if spec.batch_tokens > cap:
            log.info("model %s: batches of its %s graph capped at %d tokens (large intermediates per token)",
                     spec.name, graph, cap)
            return cap
    return spec.batch_tokens


def attention_crossover(info: ModelInfo) -> float:
    """The input length at which a token's attention (Q x K^T and x V: 4 x length x width
    operations a layer) costs what its linear layers do (the projections and the feed-forward:
    about 24 x width^2): 6 x width. A 256-token input on MiniLM (384 wide) is 1.11 times its
    tokens' linear work, an 8,192-token one on a 768-wide model 2.8 times (`BatchQueue.work`)."""
    return 6.0 * info.hidden_size


def max_batch_size(spec: ModelSpec, backend: str) -> int:
    """Inputs per batch: the spec's, else the backend's default, never past the largest static
    batch shape."""
    return min((spec.max_batch_size or default_batch_size(backend), *spec.batch_buckets[-1:]))


def bucket(size: int, buckets: Sequence[int]) -> int:
    """The smallest static size that holds `size`; `size` itself without buckets."""
    return next((b for b in buckets if b >= size), size)


# Of a device's free memory, what batches may take (the rest: the allocator's fragmentation,
# other processes' growth).
DEVICE_SHARE = 0.85


def fit_device_memory(
    backend: Backend, queue: BatchQueue, probes: Sequence[Encoded], pad_id: int, length: int
) -> None:
    """Measure a full batch (the queue's token budget of `probes` padded to the model's
    `length`) on the device and cut the budget until the batches the backend keeps in flight
    fit its free memory, so that a busy server does not meet a CUDA out-of-memory (which would
    still answer only that batch, 503)."""
    rows = max(1, min(queue.max_batch_size, queue.batch_tokens // length))
    while True:
        try:
            peak = backend.peak_device_bytes(
                ModelInputs.collate(probes[:rows], pad_id, length=length, rows=rows))
            break
        except DeviceMemoryError:
            if rows == 1:
                raise ModelLoadError(f"one input of {length} tokens does not fit the device's memory: "
                                     "lower --max-length") from None
            rows //= 2
    room = backend.free_device_bytes()
    if peak is None or room is None:
        return
    per_token = peak / (rows * length)
    at_once = backend.batches_in_flight
    fits = int(room * DEVICE_SHARE / (at_once * per_token))
    log.info("device memory: %.0f bytes per batch token at length %d, %d MB free: room for %d tokens a batch",
             per_token, length, room // 2**20, fits)
    if fits < queue.batch_tokens:
        log.warning("batches cut to %d tokens (from %d) so that %d of them fit the device's free memory",
                    max(64, fits), queue.batch_tokens, at_once)
        queue.batch_tokens = max(64, fits)
