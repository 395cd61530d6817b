"""The engine: several served models, addressed by name, behind one async Python API.

    async with Engine(spec) as engine:
        result = await engine.embed(["a text"])

Knows nothing of HTTP; the HTTP app and every target drive it through these methods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from infinity_cloud.batching.worker import Observer
from infinity_cloud.config import DeploymentSpec, LimitsSpec, ModelSpec
from infinity_cloud.errors import ModelNotFoundError, UnsupportedError
from infinity_cloud.hardware import usable_cores
from infinity_cloud.model_files import Capability
from infinity_cloud.results import ClassifyResult, EmbeddingResult, RankedDocument, RerankResult
from infinity_cloud.served_model import ServedModel
from infinity_cloud.tasks.pooling import truncate_dimensions
from infinity_cloud.tasks.scores import label_scores, rank, sigmoid, softmax
from infinity_cloud.tokenization import Encoded
from infinity_cloud.validation import (
    check_dimensions,
    check_texts,
    check_token_ids,
    check_top_n,
    is_token_ids,
)

log = logging.getLogger(__name__)

Modality = Literal["text", "image", "audio"]


class Engine:
    def __init__(
        self,
        spec: DeploymentSpec | ModelSpec | Sequence[ModelSpec] | None = None,
        *,
        limits: LimitsSpec | None = None,
        observers: Sequence[Observer] = (),
    ) -> None:
        if spec is None:
            spec = DeploymentSpec()
        elif isinstance(spec, ModelSpec):
            spec = DeploymentSpec(models=(spec,))
        elif not isinstance(spec, DeploymentSpec):
            spec = DeploymentSpec(models=tuple(spec))
        self.spec = spec
        self.limits = limits or spec.server.limits
        # One list shared down to every batch worker, so observers added later see all batches.
        self.observers: list[Observer] = list(observers)
        self.models: dict[str, ServedModel] = {m.name: ServedModel(m, self.observers) for m in spec.models}
        self._tokenize_pool = ThreadPoolExecutor(
            max_workers=min(4, usable_cores()), thread_name_prefix="tokenize"
        )

    # -- lifecycle -------------------------------------------------------------------

    def load(self) -> None:
        """Blocking: load every model, one after the other; the first failure raises."""
        for model in self.models.values():
            if model.state == "loading":
                model.load()

    @classmethod
    def loaded(cls, spec: DeploymentSpec) -> Engine:
        """An engine with every model loaded now, for a process that serves only once all
        are ready; on a failure the models already loaded are stopped and the error raised."""
        engine = cls(spec)
        try:
            engine.load()
        except BaseException:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        for model in self.models.values():
            model.stop()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)

    async def start(self) -> Engine:
        await asyncio.to_thread(self.load)
        return self

    async def stop(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Engine:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def healthy(self) -> bool:
        return all(m.healthy for m in self.models.values())

    def describe(self) -> list[dict[str, Any]]:
        return [m.describe() for m in self.models.values()]

    # -- addressing ------------------------------------------------------------------

    def model(self, name: str | None = None) -> ServedModel:
        """With one model, any name resolves to it; with several, the name must match."""
        if len(self.models) == 1:
            return next(iter(self.models.values()))
        if name in self.models:
            return self.models[name]
        known = ", ".join(sorted(self.models))
        if not name:
            raise ModelNotFoundError(
                f"several models are served; name one in 'model': {known}", param="model"
            )
        raise ModelNotFoundError(f"model {name!r} is not served here; served models: {known}", param="model")

    async def _tokenize(self, fn: Any, *args: Any) -> list[Encoded]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenize_pool, fn, *args)

    # -- capabilities ----------------------------------------------------------------

    async def embed(
        self,
        inputs: Sequence[str] | Sequence[Sequence[int]],
        model: str | None = None,
        *,
        dimensions: int | None = None,
        truncate: bool = True,
        modality: Modality = "text",
    ) -> EmbeddingResult:
        served = self.model(model)
        if modality != "text":
            raise UnsupportedError(
                f"model {served.name!r} embeds text only; modality {modality!r} is not supported by it",
                param="modality",
            )
        loaded = served.require(Capability.EMBED)
        check_dimensions(dimensions, loaded.info.dimensions)
        if is_token_ids(inputs):
            check_token_ids(inputs, self.limits)  # type: ignore[arg-type]
            encodings = loaded.tokenizer.from_token_ids(inputs, truncate)  # type: ignore[arg-type]
        else:
            check_texts(inputs, self.limits)  # type: ignore[arg-type]
            encodings = await self._tokenize(loaded.tokenizer.encode, list(inputs), truncate)
        rows = await served.run(encodings)
        vectors = truncate_dimensions(np.stack(rows), dimensions, renormalize=loaded.normalize)
        return EmbeddingResult(served.name, vectors, sum(len(e) for e in encodings))

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        model: str | None = None,
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: bool = True,
    ) -> RerankResult:
        served = self.model(model)
        loaded = served.require(Capability.RERANK)
        check_texts([query], self.limits, param="query")
        check_texts(documents, self.limits, param="documents")
        check_top_n(top_n)
        encodings = await self._tokenize(loaded.tokenizer.encode_pairs, query, list(documents), truncate)
        logits = np.stack(await served.run(encodings))[:, 0]
        scores = logits if raw_scores else sigmoid(logits)
        ranked = [RankedDocument(i, float(scores[i])) for i in rank(scores, top_n)]
        return RerankResult(served.name, ranked, sum(len(e) for e in encodings))

    async def classify(
        self,
        inputs: Sequence[str],
        model: str | None = None,
        *,
        raw_scores: bool = False,
        truncate: bool = True,
    ) -> ClassifyResult:
        served = self.model(model)
        loaded = served.require(Capability.CLASSIFY)
        check_texts(inputs, self.limits)
        encodings = await self._tokenize(loaded.tokenizer.encode, list(inputs), truncate)
        logits = np.stack(await served.run(encodings))
        scores = logits if raw_scores else softmax(logits)
        labels = [label_scores(row, loaded.info.labels) for row in scores]
        return ClassifyResult(served.name, labels, sum(len(e) for e in encodings))


__all__ = ["Engine"]
