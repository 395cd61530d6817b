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

from infinity_cloud import openai_tokens
from infinity_cloud.batching.worker import Observer
from infinity_cloud.capability import Capability
from infinity_cloud.config import DeploymentSpec, LimitsSpec, ModelSpec
from infinity_cloud.errors import InvalidInputError, ModelNotFoundError, UnsupportedError
from infinity_cloud.hardware import usable_cores
from infinity_cloud.results import ClassifyResult, EmbeddingResult, RankedDocument, RerankResult, Token
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

    def prompts(self, model: str | None = None) -> dict[str, str]:
        """The model's named prompts (sentence-transformers' `prompts`), e.g. {"query": ...}."""
        return dict(self.model(model).loaded.info.prompts)

    @staticmethod
    def _prompted(served: ServedModel, texts: Sequence[str], name: str | None) -> list[str]:
        """The texts behind the model's prompt `name` (none: as they are)."""
        if name is None:
            return list(texts)
        prompts = served.loaded.info.prompts
        if name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise InvalidInputError(
                f"model {served.name!r} has no prompt named {name!r} (its prompts: {known})",
                param="prompt_name",
            )
        return [prompts[name] + text for text in texts]

    async def _encode_token_ids(
        self, served: ServedModel, ids: Sequence[Sequence[int]], truncate: bool, openai_sender: bool
    ) -> list[Encoded]:
        """Token ids read as the model's spec says (`ModelSpec.token_ids`)."""
        tokenizer, meaning = served.loaded.tokenizer, served.spec.token_ids
        if meaning == "refuse":
            raise InvalidInputError(
                f"model {served.name!r} takes text, not token ids (it is served with --token-ids refuse)",
                param="input",
            )
        if meaning == "model":
            if openai_sender:  # its ids are cl100k_base's: read as ours they would be other text
                raise InvalidInputError(
                    f"token ids from an OpenAI SDK client are OpenAI's cl100k_base ids, but model "
                    f"{served.name!r} reads ids as its own vocabulary (--token-ids model); send text "
                    "(langchain-openai: check_embedding_ctx_length=False) or serve it with "
                    "--token-ids openai",
                    param="input",
                )
            return tokenizer.from_token_ids(ids, truncate)

        def decoded_and_encoded() -> list[Encoded]:  # one trip to the tokenizer pool
            texts = openai_tokens.decode(ids)
            check_texts(texts, self.limits)
            return tokenizer.encode(texts, truncate)

        return await self._tokenize(decoded_and_encoded)

    # -- capabilities ----------------------------------------------------------------

    async def embed(
        self,
        inputs: Sequence[str] | Sequence[Sequence[int]],
        model: str | None = None,
        *,
        dimensions: int | None = None,
        truncate: bool = True,
        modality: Modality = "text",
        openai_sender: bool = False,
        prompt_name: str | None = None,
    ) -> EmbeddingResult:
        """`openai_sender`: the inputs come from an OpenAI SDK client, whose token ids are
        OpenAI's cl100k_base ids whatever the model reads ids as. `prompt_name`: one of the
        model's named prompts (`prompts(model)`), prepended to each text."""
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
            ids: Sequence[Sequence[int]] = inputs  # type: ignore[assignment]
            encodings = await self._encode_token_ids(served, ids, truncate, openai_sender)
        else:
            check_texts(inputs, self.limits)  # type: ignore[arg-type]
            texts = self._prompted(served, inputs, prompt_name)  # type: ignore[arg-type]
            encodings = await self._tokenize(loaded.tokenizer.encode, texts, truncate)
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

    async def tokenize(
        self, texts: Sequence[str], model: str | None = None, *, add_special_tokens: bool = True,
        prompt_name: str | None = None,
    ) -> list[list[Token]]:
        """Each text (behind the model's prompt `prompt_name`) as the model's tokenizer splits
        it, with character spans."""
        served = self.model(model)
        check_texts(texts, self.limits)
        prompted = self._prompted(served, texts, prompt_name)
        return await self._tokenize(served.loaded.tokenizer.tokens, prompted, add_special_tokens)

    def decode(
        self, ids: Sequence[Sequence[int]], model: str | None = None, *, skip_special_tokens: bool = True
    ) -> list[str]:
        """Token ids of the model's own vocabulary back to text."""
        return self.model(model).loaded.tokenizer.decode(ids, skip_special_tokens)

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
