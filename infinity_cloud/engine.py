"""The engine: several served models, addressed by name, behind one async Python API of
typed asks (`asks.py`): each call looks its model up once (`models.fleet.Fleet`), applies the
capability's policy (`tasks/`), and runs the model's work through the pipeline (`pipeline.py`).

    async with Engine(spec) as engine:
        result = await engine.embeddings(EmbedAsk(["a text"]))

Knows nothing of HTTP; the HTTP app, the bulk job and every target drive it through these calls.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from infinity_cloud.admission.memory import MB, MemoryBudget
from infinity_cloud.admission.validation import (
    check_max_tokens_per_doc,
    check_texts,
    check_top_n,
)
from infinity_cloud.asks import (
    Ask,
    ChunkedEmbedAsk,
    ClassifyAsk,
    EmbedAsk,
    Embeddings,
    RerankAsk,
    SimilarityAsk,
    TokenizeAsk,
    capabilities_of,
)
from infinity_cloud.batching.worker import Observer
from infinity_cloud.cache.result_cache import ResultCache
from infinity_cloud.capability import Capability
from infinity_cloud.config import DeploymentSpec, LimitsSpec, ModelSpec
from infinity_cloud.errors import UnsupportedError
from infinity_cloud.models.fleet import Fleet
from infinity_cloud.models.served_model import ServedModel
from infinity_cloud.numerics.pooling import l2_normalize
from infinity_cloud.pipeline import Pipeline
from infinity_cloud.results import (
    ChunkedEmbeddingResult,
    ClassifyResult,
    EmbeddingResult,
    EmbeddingsByType,
    ModelFacts,
    MultiVectorResult,
    RerankResult,
    SimilarityResult,
    Token,
)
from infinity_cloud.tasks import late_interaction, quantization
from infinity_cloud.tasks.base import Call, Result, Task, decoded_ids_cost, listed_tokens_cost
from infinity_cloud.tasks.chunked import CHUNKED, ChunkedCall
from infinity_cloud.tasks.classify import ClassifyCall
from infinity_cloud.tasks.embed import EmbedCall, prompt_for_use, prompted
from infinity_cloud.tasks.multi_vector import MultiVectorCall, Role, require_multi_vector
from infinity_cloud.tasks.registry import TASKS
from infinity_cloud.tasks.rerank import RerankCall
from infinity_cloud.tasks.sparse import SparseCall

log = logging.getLogger(__name__)


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
        limits = limits or spec.server.limits
        # One list shared down to every batch worker, so observers added later see all batches.
        self.observers: list[Observer] = list(observers)
        memory = MemoryBudget.declared(limits.memory_budget_mb)
        server = spec.server
        self.cache = ResultCache(self._cache_bytes(server.cache_mb * MB, memory), server.cache_url,
                                 server.cache_ttl_s, server.cache_timeout_ms / 1000, server.cache_secret)
        self.pipeline = Pipeline(limits, memory, self.cache)
        self.fleet = Fleet(spec, self.observers, memory, self.cache, self._embed_in_background)

    @staticmethod
    def _cache_bytes(asked: int, memory: MemoryBudget) -> int:
        """The in-process cache's bound, inside the memory budget: its rows are resident memory,
        which the budget counts as it fills, so it may take at most a quarter of it."""
        limit = memory.limit_bytes
        if not asked or limit is None or asked <= limit // 4:
            return asked
        log.warning("the result cache is held to %d MB, a quarter of the memory budget (%d MB), not the "
                    "%d MB asked: raise --memory-budget-mb or lower --cache-mb",
                    limit // 4 // MB, limit // MB, asked // MB)
        return limit // 4

    @property
    def memory(self) -> MemoryBudget:
        """The memory budget every call and every model's load is admitted by."""
        return self.pipeline.memory

    @memory.setter
    def memory(self, memory: MemoryBudget) -> None:  # one budget, which the fleet and pipeline share
        self.pipeline.memory = self.fleet.memory = memory

    @property
    def limits(self) -> LimitsSpec:
        """A call's limits (a target may set them per request: AWS Lambda's response bound)."""
        return self.pipeline.limits

    @limits.setter
    def limits(self, limits: LimitsSpec) -> None:
        self.pipeline.limits = limits

    @property
    def models(self) -> dict[str, ServedModel]:
        """The served models by name, in the spec's order (`Fleet.models`)."""
        return self.fleet.models

    # -- lifecycle -------------------------------------------------------------------

    def load(self) -> None:
        """Blocking: load every model, one after the other; the first failure raises."""
        self.fleet.load()

    @classmethod
    def loaded(cls, spec: DeploymentSpec) -> Engine:
        """An engine with every model loaded now, for a process that serves only once all
        are ready; on a failure the models already loaded are stopped and the error raised."""
        engine = cls(spec)
        try:
            engine.load()
            # Its own loop, run before the server's: what it leaves (done futures) is not reused.
            asyncio.run(engine.fleet.calibrate_loaded(list(engine.models.values())))
        except BaseException:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        self.fleet.stop()
        self.pipeline.close()

    async def start(self) -> Engine:
        self.cache.start()
        await asyncio.to_thread(self.load)
        await self.fleet.calibrate_loaded(list(self.models.values()))
        return self

    async def stop(self) -> None:
        await self.fleet.settle()  # a model still loading finishes, then stops with the rest
        await self.cache.close()
        await self.pipeline.stop()
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Engine:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def add_model(self, spec: ModelSpec) -> ServedModel:
        """Serve one more model without a restart (`Fleet.add`)."""
        return await self.fleet.add(spec)

    async def remove_model(self, name: str, drain_timeout_s: float = 120.0) -> dict[str, Any]:
        """Stop serving `name`, its admitted calls drained first (`Fleet.remove`)."""
        return await self.fleet.remove(name, drain_timeout_s)

    @property
    def healthy(self) -> bool:
        """Every model loaded, working and calibrated where it must be (`Fleet.healthy`), and
        the memory budget admitting a minimal request (`admits_minimal`)."""
        return self.fleet.healthy and self.admits_minimal

    @property
    def admits_minimal(self) -> bool:
        """Whether the memory budget admits a minimal request, or stopped doing so less than the
        models' longest deadline ago (a wait for other requests' memory is part of a deadline;
        past it, the process holds what it should not: an orchestrator should act)."""
        return self.memory.admits_minimal(self.fleet.longest_deadline_s)

    def facts(self) -> list[ModelFacts]:
        """What each loaded model is (`ServedModel.facts`), in the spec's order."""
        return self.fleet.facts()

    def describe(self) -> list[dict[str, Any]]:
        """Each model's facts, with its int8/uint8 ranges' state (`Fleet.describe`)."""
        return self.fleet.describe()

    # -- addressing ------------------------------------------------------------------

    def model(self, name: str | None = None, *capabilities: Capability, any_name: bool = False
              ) -> ServedModel:
        """The served model a request means (`Fleet.lookup`)."""
        return self.fleet.lookup(name, *capabilities, any_name=any_name)

    def facts_of(self, name: str | None = None, *capabilities: Capability, any_name: bool = False
                 ) -> ModelFacts:
        """What the served model a request means is (`model`'s choice; a 503 until it has
        loaded): for a route that answers each kind of model in its own shape."""
        served = self.model(name, *capabilities, any_name=any_name)
        served.loaded  # noqa: B018  # raises while it loads, fails or has a dead worker
        return served.facts  # type: ignore[return-value]  # loaded, so known

    def _served_for(self, ask: Ask) -> ServedModel:
        """The model `ask` means: the one lookup of its call."""
        return self.fleet.lookup(ask.model, *capabilities_of(ask), any_name=ask.any_name)

    # -- the front door: one call per ask --------------------------------------------

    async def embeddings(self, ask: EmbedAsk) -> Embeddings:
        """An embeddings request of any dialect, answered in one call: the model's own kind of
        embedding among those `ask.accepts` (else the first, whose task says why this model
        cannot), the prompt or role the texts' use means to it, and the output types asked.
        The model's policy holds here, for every route and the Python API alike: `ask.dtype`
        None is the model's `--embedding-dtype`; int8/uint8 use its calibrated ranges."""
        return await self._embeddings(ask, self._served_for(ask))

    async def rerank(self, ask: RerankAsk) -> RerankResult:
        """The documents ranked for the query (`RerankAsk`): by a cross-encoder, or by a
        multi-vector model's late interaction."""
        return await self._rerank(ask, self._served_for(ask))

    async def classify(self, ask: ClassifyAsk) -> ClassifyResult:
        return await self._classify(ask, self._served_for(ask))

    async def tokenize(self, ask: TokenizeAsk) -> list[list[Token]]:
        """Each text as the model's tokenizer splits it; any model tokenizes (the default, else
        the first)."""
        return await self._tokenize(ask, self._served_for(ask))

    async def similarity(self, ask: SimilarityAsk) -> SimilarityResult:
        return await self._similarity(ask, self._served_for(ask))

    async def chunked_embeddings(self, ask: ChunkedEmbedAsk) -> ChunkedEmbeddingResult:
        """Documents cut into chunks of the model's own tokens, a vector each, never truncated
        (`ChunkedEmbedAsk`); a dense text embedder's."""
        if ask.late:  # until late chunking is served: refused by name, never ignored
            raise UnsupportedError("late chunking is not served yet: chunk without it", param="late_chunking")
        served = self._served_for(ask)
        prompt = ask.prompt_name or prompt_for_use(ask.use, served.loaded.info.prompts)
        call = ChunkedCall(ask.documents, ask.chunk_tokens, ask.overlap_tokens, ask.dimensions, prompt,
                           ask.packed)
        return await self.pipeline.run(CHUNKED, call, served)

    async def by_model_type(self, asks: Sequence[Ask]) -> Any:
        """The ask of `asks` that the model they name does (the first where it does none, whose
        refusal says why): a route that answers each kind of model (TEI's `/`), in one call
        and one lookup. The asks name the same model."""
        first = asks[0]
        wanted = [c for ask in asks for c in capabilities_of(ask)]
        served = self.fleet.lookup(first.model, *dict.fromkeys(wanted), any_name=first.any_name)
        served.loaded  # noqa: B018  # raises while it loads, fails or has a dead worker
        chosen = next((a for a in asks if served.capability in capabilities_of(a)), first)
        return await self._answer(chosen, served)

    async def _answer(self, ask: Ask, served: ServedModel) -> Any:
        if isinstance(ask, EmbedAsk):
            return await self._embeddings(ask, served)
        if isinstance(ask, RerankAsk):
            return await self._rerank(ask, served)
        if isinstance(ask, ClassifyAsk):
            return await self._classify(ask, served)
        if isinstance(ask, TokenizeAsk):
            return await self._tokenize(ask, served)
        return await self._similarity(ask, served)

    def decode(
        self, ids: Sequence[Sequence[int]], model: str | None = None, *, skip_special_tokens: bool = True
    ) -> list[str]:
        """Token ids of the model's own vocabulary back to text (admitted by the memory budget)."""
        tokenizer = self.model(model, *Capability).loaded.tokenizer
        with self.memory.reserved(decoded_ids_cost(ids).memory):
            return tokenizer.decode(ids, skip_special_tokens)

    async def run_task(
        self, task: Task[Call, Result], call: Call, model: str | None = None, *, background: bool = False
    ) -> Result:
        """Any task the same way (`Pipeline.run`): the capabilities here are tasks; so can a
        caller's own be (tasks/base.py)."""
        return await self.pipeline.run(task, call, self.model(model, task.capability), background=background)

    async def calibration(
        self, model: str | None = None, dimensions: int | None = None, *, wait: bool = True
    ) -> np.ndarray:
        """(2, d) per-dimension ranges of the model's embeddings (Matryoshka-truncated to
        `dimensions`) over the calibration texts, for int8/uint8: embedded once, in the
        background (the engine's own work, ahead of the requests in the model's queue and never
        refused for load). `wait` False: a 503 with Retry-After until they are ready:
        calibration is never inside a request (the HTTP app's). Only a dense embedder has them:
        another model is a 400 saying what it is, before any calibration starts (a ColBERT
        model asked for int8 started one, which failed, and answered 503s)."""
        return await self.fleet.ranges(self.model(model), dimensions, wait=wait)

    async def quantize(
        self, result: EmbeddingResult, kind: str, dimensions: int | None = None, *, wait: bool = True
    ) -> np.ndarray:
        """`result`'s vectors as `kind` (float, int8, uint8, binary, ubinary); int8/uint8 with
        the model's calibrated ranges (`dimensions`: the truncation the result was made with;
        `wait`: for them, as `calibration`)."""
        return await self._quantize(self.model(result.model), result, kind, dimensions, wait)

    # -- each ask on its model -------------------------------------------------------

    async def _embeddings(self, ask: EmbedAsk, served: ServedModel) -> Embeddings:
        kind = served.capability if served.capability in ask.accepts else ask.accepts[0]
        if kind is Capability.SPARSE:
            if ask.modality != "text":
                raise UnsupportedError("sparse embeddings are of text; send modality 'text'",
                                       param="modality")
            call = SparseCall(ask.inputs, ask.truncate, ask.prompt_name)  # type: ignore[arg-type]
            return await self.pipeline.run(TASKS[Capability.SPARSE], call, served)
        if kind is Capability.MULTI_VECTOR:
            require_multi_vector(served)  # what the model is, before what the request asks of it
            role = late_interaction.role_asked(ask.dimensions, ask.dtype, ask.prompt_name, ask.use)
            return await self._multi_vector(served, ask.inputs, ask.modality, ask.truncate, role)  # type: ignore[arg-type]
        prompt = ask.prompt_name
        if prompt is None and ask.modality == "text":
            prompt = prompt_for_use(ask.use, served.loaded.info.prompts)
        if isinstance(ask.dtype, tuple):
            return await self._embed_by_type(served, ask, prompt)
        return await self._embed(served, replace(ask, prompt_name=prompt))

    async def _embed(self, served: ServedModel, ask: EmbedAsk) -> EmbeddingResult:
        """Dense embeddings of a dense embedder, in one type (`ask.dtype`, a str or None).
        `ask.normalize`: True, unit length whatever the model does; False, the vectors before
        the model's Normalize module (TEI's normalize=false); None, as the model does."""
        kind = quantization.named(ask.dtype or served.spec.embedding_dtype)  # type: ignore[arg-type]
        if kind != "float32":
            await quantization.ready_before_work([kind], ask.dimensions, ask.wait,
                                                 functools.partial(self.fleet.ranges, served))
        call = EmbedCall(ask.inputs, ask.dimensions, ask.truncate, ask.modality, ask.openai_sender,
                         ask.prompt_name, ask.packed or kind != "float32", ask.normalize is not False)
        result = await self.pipeline.run(TASKS[Capability.EMBED], call, served)
        if ask.normalize:
            result = replace(result, embeddings=l2_normalize(result.embeddings))
        if kind == "float32":
            return result
        quantized = await self._quantize(served, result, kind, ask.dimensions, ask.wait)
        return replace(result, embeddings=quantized, dtype=kind)

    async def _embed_by_type(
        self, served: ServedModel, ask: EmbedAsk, prompt: str | None
    ) -> EmbeddingsByType:
        """One embedding of the inputs in each type `ask.dtype` names: the floats made once,
        each type made from them."""
        types = ask.dtype or ()
        await quantization.ready_before_work(types, ask.dimensions, ask.wait,
                                             functools.partial(self.fleet.ranges, served))
        floats = await self._embed(served, replace(ask, prompt_name=prompt, dtype="float32", normalize=None,
                                                   openai_sender=False, packed=False, wait=True))
        by_type = {kind: await self._quantize(served, floats, kind, ask.dimensions, True) for kind in types}
        return EmbeddingsByType(floats.model, by_type, floats.prompt_tokens)

    async def _quantize(
        self, served: ServedModel, result: EmbeddingResult, kind: str, dimensions: int | None, wait: bool
    ) -> np.ndarray:
        ranges = functools.partial(self.fleet.ranges, served)
        return await quantization.quantized(result.embeddings, kind, dimensions, wait, ranges)

    async def _embed_in_background(self, served: ServedModel, texts: list[str]) -> np.ndarray:
        """`texts` embedded as the engine's own work (a model's int8/uint8 ranges)."""
        floats = await self.pipeline.run(TASKS[Capability.EMBED], EmbedCall(texts), served, background=True)
        return floats.embeddings

    async def _multi_vector(
        self, served: ServedModel, inputs: Sequence[str], modality: Any, truncate: bool, role: Role | None
    ) -> MultiVectorResult:
        """ColBERT: each text, read as a query or a document (`role`), as one vector per token;
        ColPali: each query (text) or page (image URL or data URI)."""
        call = MultiVectorCall(inputs, modality, truncate, role)
        return await self.pipeline.run(TASKS[Capability.MULTI_VECTOR], call, served)

    async def _similarity(self, ask: SimilarityAsk, served: ServedModel) -> SimilarityResult:
        check_texts(ask.sentences, self.limits, param="sentences")
        result = await self._embed(served, EmbedAsk(
            [ask.source, *ask.sentences], served.name, truncate=ask.truncate, prompt_name=ask.prompt_name,
            dtype="float32", normalize=True,
        ))
        vectors = result.embeddings  # unit length: their dot products are their cosines
        return SimilarityResult(result.model, vectors[1:] @ vectors[0], result.prompt_tokens)

    async def _rerank(self, ask: RerankAsk, served: ServedModel) -> RerankResult:
        if ask.max_tokens_per_doc is not None and ask.modality != "text":
            raise UnsupportedError("'max_tokens_per_doc' cuts text documents; omit it for images",
                                   param="max_tokens_per_doc")
        if served.capability is Capability.MULTI_VECTOR:
            return await self._late_interaction(ask, served)
        if ask.modality != "text":
            raise UnsupportedError(
                f"model {served.name!r} ranks text documents; modality {ask.modality!r} needs a multi-vector "
                "model such as ColPali",
                param="modality",
            )
        call = RerankCall(ask.query, ask.documents, ask.top_n, ask.raw_scores, ask.truncate,
                          ask.max_tokens_per_doc)
        return await self.pipeline.run(TASKS[Capability.RERANK], call, served)

    async def _late_interaction(self, ask: RerankAsk, served: ServedModel) -> RerankResult:
        """A multi-vector model's ranking: the query and the documents embedded at once (the two
        towers, or roles), scored by MaxSim."""
        check_max_tokens_per_doc(ask.max_tokens_per_doc)
        documents = ask.documents
        if ask.max_tokens_per_doc is not None:
            check_texts(documents, self.limits, param="documents")
            cut = served.loaded.tokenizer.cut
            documents = await asyncio.to_thread(cut, documents, ask.max_tokens_per_doc)
        check_top_n(ask.top_n)
        asked, read = await asyncio.gather(
            self._multi_vector(served, [ask.query], "text", ask.truncate, "query"),
            self._multi_vector(served, documents, ask.modality, ask.truncate, "document"),
        )
        return late_interaction.ranked(served.name, asked, read, ask.top_n)

    async def _classify(self, ask: ClassifyAsk, served: ServedModel) -> ClassifyResult:
        call = ClassifyCall(ask.inputs, ask.raw_scores, ask.truncate)
        return await self.pipeline.run(TASKS[Capability.CLASSIFY], call, served)

    async def _tokenize(self, ask: TokenizeAsk, served: ServedModel) -> list[list[Token]]:
        check_texts(ask.texts, self.limits)
        texts = prompted(served, ask.texts, ask.prompt_name)
        # Its answer is the largest per character of any route's (a dict a token): admitted by
        # the memory budget as every route's work is.
        with self.memory.reserved(listed_tokens_cost(texts).memory):
            return await self.pipeline.in_tokenizer_pool(served.loaded.tokenizer.tokens, texts,
                                                         ask.add_special_tokens)


__all__ = ["Engine"]
