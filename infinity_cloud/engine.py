"""The engine: several served models, addressed by name, behind one async Python API.

    async with Engine(spec) as engine:
        result = await engine.embed(["a text"])

Knows nothing of HTTP; the HTTP app and every target drive it through these methods.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pydantic import ValidationError

from infinity_cloud.admission.memory import (
    MB,
    MemoryBudget,
    resident_bytes,
    weights_bytes,
)
from infinity_cloud.admission.validation import (
    check_answer_size,
    check_embedding_types,
    check_max_tokens_per_doc,
    check_texts,
    check_top_n,
)
from infinity_cloud.asks import EmbedAsk, Embeddings
from infinity_cloud.batching.worker import Observer
from infinity_cloud.cache.result_cache import ResultCache
from infinity_cloud.capability import Capability
from infinity_cloud.config import DeploymentSpec, LimitsSpec, ModelSpec
from infinity_cloud.errors import (
    InvalidInputError,
    ModelConflictError,
    ModelLoadError,
    ModelNotFoundError,
    ModelTooLargeError,
    UnsupportedError,
)
from infinity_cloud.families import read_model_info
from infinity_cloud.hardware import usable_cores
from infinity_cloud.models.int8_ranges import Int8Ranges
from infinity_cloud.models.model_source import folder_model_name, model_dir_within
from infinity_cloud.models.served_model import ServedModel
from infinity_cloud.numerics.pooling import l2_normalize
from infinity_cloud.results import (
    ClassifyResult,
    EmbeddingResult,
    EmbeddingsByType,
    ModelFacts,
    MultiVectorResult,
    RankedDocument,
    RerankResult,
    SimilarityResult,
    SparseEmbeddingResult,
    Token,
)
from infinity_cloud.tasks import quantization
from infinity_cloud.tasks.base import Call, Result, Task, decoded_ids_cost, listed_tokens_cost
from infinity_cloud.tasks.classify import ClassifyCall
from infinity_cloud.tasks.embed import EmbedCall, Modality, prompt_for_use, prompted
from infinity_cloud.tasks.multi_vector import ROLE_FOR_USE, MultiVectorCall, Role, require_multi_vector
from infinity_cloud.tasks.registry import TASKS
from infinity_cloud.tasks.rerank import RerankCall
from infinity_cloud.tasks.scores import maxsim, rank
from infinity_cloud.tasks.sparse import SparseCall
from infinity_cloud.text import pool_cancellation

if TYPE_CHECKING:  # imported on first use: they bring httpx, Pillow
    from infinity_cloud.media.decoding import MediaDecoder
    from infinity_cloud.media.fetch import MediaFetcher

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a hot load is refused at first sight for: its weights times this (86 MB of MiniLM took
# 250 MB to load with its exports and compilations, measured); its real cost is measured after.
LOAD_COST_PER_WEIGHT_BYTE = 3
# How long a server whose models set no deadline may fail to admit a minimal request by memory
# before /health says it is not ready: the models' default deadline.
DEFAULT_MEMORY_DEADLINE_S = 10.0
# The least room for requests a hot load must leave in the memory budget.
MIN_REQUEST_ROOM = 64 * 2**20
# Names that clients written for TEI send on every route, meaning "whatever the server serves"
# (mem0's HuggingFaceEmbedding always sends "tei", through the OpenAI SDK to /v1/embeddings): no
# model is served under them, so they are taken as TEI takes any name (`model`'s any_name).
TEI_PLACEHOLDER_NAMES = frozenset({"tei"})


def request_key(task: Task[Any, Any], call: Any, model: str) -> str | None:
    """What a request asks, as a digest: a retry of it (same task, model and inputs) has the
    same key, and keeps the place in line its first try was given (batching/places.py)."""
    try:
        body = pickle.dumps((task.capability.value, type(call).__name__, model, call), protocol=5)
    except Exception:  # a caller's own call that does not pickle: no place kept, nothing else lost
        return None
    return hashlib.blake2b(body, digest_size=16).hexdigest()


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
        self.models: dict[str, ServedModel] = {}
        # Each model's int8/uint8 ranges (`Int8Ranges`): made with it, dropped when it is unloaded.
        self._int8_ranges: dict[str, Int8Ranges] = {}
        for model_spec in spec.models:
            self._serve(ServedModel(model_spec, self.observers))
        self._tokenize_pool = ThreadPoolExecutor(
            max_workers=min(4, usable_cores()), thread_name_prefix="tokenize"
        )
        self._media: MediaFetcher | None = None
        self._decoder: MediaDecoder | None = None
        self.memory = MemoryBudget.declared(self.limits.memory_budget_mb)
        server = spec.server
        self.cache = ResultCache(self._cache_bytes(server.cache_mb * MB), server.cache_url,
                                 server.cache_ttl_s, server.cache_timeout_ms / 1000, server.cache_secret)
        self._loading: set[asyncio.Future[None]] = set()  # models added while serving
        self._unloaded: set[str] = set()  # names of models unloaded while serving: a 404, not another model
        self._names_taken: set[tuple[str, str]] = set()  # (unserved name, model) said in the log (`model`)

    # -- lifecycle -------------------------------------------------------------------

    def _serve(self, model: ServedModel) -> None:
        """Serve `model` (loaded, or loading), with its int8/uint8 ranges."""
        self.models[model.name] = model
        embed = functools.partial(self._embed_in_background, model.name)
        self._int8_ranges[model.name] = Int8Ranges(model, embed)

    def _cache_bytes(self, asked: int) -> int:
        """The in-process cache's bound, inside the memory budget: its rows are resident memory,
        which the budget counts as it fills, so it may take at most a quarter of it."""
        limit = self.memory.limit_bytes
        if not asked or limit is None or asked <= limit // 4:
            return asked
        log.warning("the result cache is held to %d MB, a quarter of the memory budget (%d MB), not the "
                    "%d MB asked: raise --memory-budget-mb or lower --cache-mb",
                    limit // 4 // MB, limit // MB, asked // MB)
        return limit // 4

    def load(self) -> None:
        """Blocking: load every model, one after the other; the first failure raises."""
        for model in list(self.models.values()):
            if model.state == "loading" and not model.hot:
                self._load_one(model)

    def _load_one(self, model: ServedModel) -> None:
        before = resident_bytes()

        def before_ready() -> None:
            if self.memory.limit_bytes is not None:  # a budget counts what is built after load
                model.settle()
            self.memory.trim()
            model.fit_batches(self.memory.room_for_batches())
            self.memory.set_aside(model.working_set_bytes)
            if model.hot:
                self._keep_room_for_requests(model, resident_bytes() - before)
            # Its files are read for their identity here, not in a request; and its rows' form
            # is known before its first request, whose lookups would otherwise skip Redis.
            if self.cache.enabled:
                for tower in model.towers:
                    self.cache.expect(model.cache_namespace(tower), model.row_form(tower))

        model.load(before_ready)

    def _keep_room_for_requests(self, model: ServedModel, cost: int) -> None:
        """A model loaded while serving stays only if, measured after its load, the budget
        still holds what requests took before (the largest one so far, at least
        `MIN_REQUEST_ROOM`): else it is stopped again and fails with the numbers, and the
        models loaded before serve as they did."""
        room = self.memory.room_for_requests()
        needed = max(MIN_REQUEST_ROOM, self.memory.largest_request_bytes)
        if room is None or room >= needed:
            return
        working_set, limit = model.working_set_bytes, self.memory.limit_bytes or 0
        model.error = (
            f"loading it took {cost // MB} MB (measured) and left {room // MB} MB of the {limit // MB} MB "
            f"memory budget for requests, less than the {needed // MB} MB they need here: it was unloaded, "
            "so the models loaded before serve as they did; unload a model, or raise --memory-budget-mb"
        )
        model.state = "failed"  # from now on: its requests get the reason
        model.stop()
        self.memory.set_aside(-working_set)
        gc.collect()
        self.memory.trim()
        raise ModelLoadError(f"model {model.name!r}: {model.error}")

    # -- models loaded and unloaded while serving ------------------------------------

    async def add_model(self, spec: ModelSpec) -> ServedModel:
        """Serve one more model without a restart: refused at once when a name it takes is
        served (409) or its weights would not fit the memory budget beside what is loaded
        (413); else it loads off the event loop, answering 503 with Retry-After until ready
        (its state in `describe`). Returns it while it loads."""
        server = self.spec.server
        if spec.trust_remote_code and not server.admin_trust_remote_code:
            raise InvalidInputError(
                "trust_remote_code runs the model repository's own Python inside this server, and this "
                "server was started without --admin-trust-remote-code: the admin API does not load such "
                "models", param="trust_remote_code",
            )
        try:  # a folder that is not there, or not a model served here: the caller's to fix, now
            path = await asyncio.to_thread(model_dir_within, spec.model_id, spec.revision,
                                           server.admin_model_roots)
            info = await asyncio.to_thread(read_model_info, path, spec.pooling)
            # What was checked is what loads: the folder itself, under the name the caller gave,
            # else one that says what the folder holds (a path is no name a URL can carry).
            spec = ModelSpec.model_validate({**spec.model_dump(exclude_unset=True), "model_id": str(path),
                                             "revision": None, "served_model_name": spec.served_model_name
                                             or folder_model_name(path), "aliases": spec.aliases})
        except ModelLoadError as exc:
            raise InvalidInputError(exc.message, param="model_id") from None
        except ValidationError as exc:
            raise InvalidInputError(exc.errors()[0]["msg"].removeprefix("Value error, "),
                                    param="served_model_name") from None
        # Checked with no await before the insert below: two loads sent at once both pass otherwise.
        self._refuse_conflicts(spec, info.capability)
        need = weights_bytes(path) * LOAD_COST_PER_WEIGHT_BYTE
        room = self.memory.room_for_model()
        if room is not None and need > room:
            raise ModelTooLargeError(
                f"model {spec.name!r} needs about {need // MB} MB to load ({LOAD_COST_PER_WEIGHT_BYTE} times "
                f"its weights, as measured), and the memory budget has {room // MB} MB beside what is "
                "loaded: unload a model, or raise --memory-budget-mb"
            )
        model = ServedModel(spec, self.observers, hot=True, info=info)
        self._serve(model)
        self._unloaded.difference_update(spec.names)

        async def load() -> None:
            try:
                await asyncio.to_thread(self._load_one, model)
                await self._calibrate_loaded([model])  # part of its load, as at start
            except Exception as exc:  # its state says why; the server serves on
                log.error("loading model %s failed: %s", model.name, exc)

        task = asyncio.get_running_loop().create_task(load())
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)
        return model

    def _refuse_conflicts(self, spec: ModelSpec, capability: Capability) -> None:
        """409 for a load that would take a served name, or, marked default, take the requests
        that name no model from the model that answers them now: the default among those doing
        the same task, else the first listed (one still loading may be either)."""
        taken = [n for n in spec.names if any(n in m.spec.names for m in self.models.values())]
        if taken:
            raise ModelConflictError(f"model name {', '.join(taken)} is already served; unload it first",
                                     param="served_model_name")
        if not spec.default:
            return
        answering = [m for m in self.models.values()
                     if m.capability in (capability, None)]
        if answering:
            current = next((m for m in answering if m.spec.default), answering[0])
            raise ModelConflictError(
                f"model {current.name!r} is the default for requests that name no model; load this one "
                "without 'default', or unload that one first", param="default",
            )

    async def remove_model(self, name: str, drain_timeout_s: float = 120.0) -> dict[str, Any]:
        """Stop serving `name`: new calls get 503 at once, the calls already admitted finish
        (up to `drain_timeout_s`), then its workers stop and its memory is given back.
        Returns what was drained and freed."""
        model = self.models.get(name) or next((m for m in self.models.values() if name in m.spec.names), None)
        if model is None:
            raise ModelNotFoundError(
                f"model {name!r} is not served here; served models: {self._known_names()}", param="name"
            )
        if model.state == "loading":
            raise ModelConflictError(f"model {model.name!r} is still loading: unload it once it is ready",
                                     param="name")
        if model.state in ("draining", "stopped"):  # a second DELETE while the first drains
            raise ModelConflictError(f"model {model.name!r} is already being unloaded", param="name")
        if model.state == "failed":  # nothing of it serves or holds memory: only its entry goes
            del self.models[model.name], self._int8_ranges[model.name]
            return {"id": model.name, "drained": 0, "unfinished": 0, "freed_bytes": 0}
        model.state = "draining"
        drained, waited = model.in_flight, time.monotonic() + drain_timeout_s
        while model.in_flight and time.monotonic() < waited:
            await asyncio.sleep(0.01)
        before = resident_bytes()
        working_set = model.working_set_bytes
        namespaces = model.cache_namespaces()
        await asyncio.to_thread(model.stop)
        del self.models[model.name], self._int8_ranges[model.name]
        self._unloaded.update(model.spec.names)
        for namespace in namespaces:
            self.cache.forget(namespace)
        self.memory.set_aside(-working_set)
        # Its weights are in cycles (modules and their parents) that only the collector frees;
        # trimming then gives the heap's freed pages back.
        await asyncio.to_thread(lambda: (gc.collect(), self.memory.trim()))
        return {"id": model.name, "drained": drained, "unfinished": model.in_flight,
                "freed_bytes": max(0, before - resident_bytes())}

    @classmethod
    def loaded(cls, spec: DeploymentSpec) -> Engine:
        """An engine with every model loaded now, for a process that serves only once all
        are ready; on a failure the models already loaded are stopped and the error raised."""
        engine = cls(spec)
        try:
            engine.load()
            # Its own loop, run before the server's: what it leaves (done futures) is not reused.
            asyncio.run(engine._calibrate_loaded(list(engine.models.values())))
        except BaseException:
            engine.close()
            raise
        return engine

    def close(self) -> None:
        for model in self.models.values():
            model.stop()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self._decoder is not None:
            self._decoder.close()

    async def start(self) -> Engine:
        self.cache.start()
        await asyncio.to_thread(self.load)
        await self._calibrate_loaded(list(self.models.values()))
        return self

    async def _calibrate_loaded(self, models: list[ServedModel]) -> None:
        """The int8/uint8 ranges of each of `models` served as int8/uint8 (its every answer
        needs them), made as part of its load, not in a caller's first request: the server is
        not healthy till they are (`healthy`). Every way a model loads ends here: `start`,
        `loaded` (serve, the containers) and a hot load."""
        for model in models:
            if model.state == "ready" and self._needs_ranges(model):
                await self.calibration(model.name)

    def _needs_ranges(self, model: ServedModel) -> bool:
        """Served as int8/uint8, without its ranges yet."""
        ranges = self._int8_ranges.get(model.name)
        return model.spec.embedding_dtype in quantization.CALIBRATED_TYPES and not (ranges and ranges.ready)

    async def stop(self) -> None:
        if self._loading:  # a model still loading finishes, then stops with the rest
            await asyncio.gather(*self._loading, return_exceptions=True)
        await self.cache.close()
        if self._media is not None:
            await self._media.close()
            self._media = None
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
        """Every model loaded and working, and those served as int8/uint8 calibrated (part of
        their load: their every answer needs the ranges). A model loaded while serving counts
        once it is ready and calibrated: its loading, failing or draining is the admin API's to
        report. A server with no model ready (the only one unloaded, or its replacement still
        loading) is not healthy: it would answer every call 404. Nor is one whose memory budget
        has not admitted a minimal request for longer than its deadline (`admits_minimal`)."""
        models = list(self.models.values())
        return any(m.state == "ready" for m in models) and all(
            m.healthy and not self._needs_ranges(m)
            for m in models if not (m.hot and (m.state != "ready" or self._needs_ranges(m)))
        ) and self.admits_minimal

    @property
    def admits_minimal(self) -> bool:
        """Whether the memory budget admits a minimal request, or stopped doing so less than the
        models' longest deadline ago (a wait for other requests' memory is part of a deadline;
        past it, the process holds what it should not: an orchestrator should act)."""
        deadlines = [m.spec.deadline_s for m in self.models.values() if m.spec.deadline_s is not None]
        return self.memory.admits_minimal(max(deadlines, default=DEFAULT_MEMORY_DEADLINE_S))

    def facts(self) -> list[ModelFacts]:
        """What each loaded model is (`ServedModel.facts`), in the spec's order."""
        return [facts for model in self.models.values() if (facts := model.facts) is not None]

    def describe(self) -> list[dict[str, Any]]:
        """Each model's facts (`ServedModel.describe`), with its int8/uint8 ranges' state for a
        dense embedder: "ready", "calibrating", or "on first request"; a model served as
        int8/uint8 is "calibrating" until they are ready."""
        out = []
        for model in self.models.values():
            facts = model.describe()
            if model.capability is Capability.EMBED and model.state == "ready":
                ranges = self._int8_ranges[model.name].state
                facts["int8_ranges"] = ranges
                if model.spec.embedding_dtype in quantization.CALIBRATED_TYPES and ranges != "ready":
                    facts["state"] = "calibrating"
            out.append(facts)
        return out

    # -- addressing ------------------------------------------------------------------

    def model(self, name: str | None = None, *capabilities: Capability, any_name: bool = False
              ) -> ServedModel:
        """The served model a request means. With one model, any name resolves to it. With
        several: its name or an alias; no name: the one served model that does one of
        `capabilities` (the request's task), or where several do, the one marked `default`,
        else the first listed of them. An unknown name is a 404 naming what is served; with
        `any_name` (TEI's routes: TEI ignores the name, and its clients send their own), or
        a name TEI's clients send on any route (`TEI_PLACEHOLDER_NAMES`), it goes to the one
        served model that does the task where exactly one does, said in the log once per name."""
        any_name = any_name or name in TEI_PLACEHOLDER_NAMES
        if name in self._unloaded:
            raise ModelNotFoundError(f"model {name!r} was unloaded; served models: {self._known_names()}",
                                     param="model")
        if len(self.models) == 1:
            return next(iter(self.models.values()))
        if name:
            found = next((m for m in self.models.values() if name in m.spec.names), None)
            able = [m for m in self.models.values() if m.capability in capabilities]
            if found is None and any_name and len(able) == 1:
                found = able[0]
                if (name, found.name) not in self._names_taken:
                    self._names_taken.add((name, found.name))
                    log.warning("a request for model %r, which is not served, is answered by %r, the one "
                                "served model that does %s (its route ignores the name, as TEI does); "
                                "said once", name, found.name, " or ".join(c.noun for c in capabilities))
            if found is None:
                raise ModelNotFoundError(f"model {name!r} is not served here; served models: "
                                         f"{self._known_names()}", param="model")
            return found
        able = [m for m in self.models.values() if m.capability in capabilities]
        if able:
            return next((m for m in able if m.spec.default), able[0])
        known = self._known_names()
        wanted = " or ".join(c.noun for c in capabilities) if capabilities else None
        raise ModelNotFoundError(
            f"no served model does {wanted}; name one in 'model': {known}" if wanted
            else f"several models are served; name one in 'model': {known}", param="model",
        )

    def facts_of(self, name: str | None = None, *capabilities: Capability, any_name: bool = False
                 ) -> ModelFacts:
        """What the served model a request means is (`model`'s choice; a 503 until it has
        loaded): for a route that answers each kind of model in its own shape (TEI's `/`,
        SageMaker's /invocations), or that takes any name (TEI's)."""
        served = self.model(name, *capabilities, any_name=any_name)
        served.loaded  # noqa: B018  # raises while it loads, fails or has a dead worker
        return served.facts  # type: ignore[return-value]  # loaded, so known

    def _known_names(self) -> str:
        return ", ".join(n for m in self.models.values() for n in m.spec.names)

    async def _tokenize(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the tokenizer pool, stopped at its next check (`pool_cancellation`) when
        the caller goes."""
        return await pool_cancellation.in_pool(self._tokenize_pool, fn, *args)

    @property
    def decoder(self) -> MediaDecoder:
        """The pool that decodes images and audio, made on first use (text never needs it)."""
        if self._decoder is None:
            from infinity_cloud.media.decoding import MediaDecoder

            self._decoder = MediaDecoder(self.limits, self.memory)
        return self._decoder

    @property
    def media(self) -> MediaFetcher:
        """The shared client that fetches media URLs, made on first use (text never needs it)."""
        if self._media is None:
            from infinity_cloud.media.fetch import MediaFetcher

            self._media = MediaFetcher(self.limits)
        return self._media

    async def run_task(
        self, task: Task[Call, Result], call: Call, model: str | None = None, *, background: bool = False
    ) -> Result:
        """Any task the same way: checks on the loop, its media fetched and decoded in the
        decoding pool, or its text encoded in the tokenizer pool, the tower's batch worker,
        then the task's own finish. The capabilities below are tasks; so can a caller's own be
        (tasks/base.py). `background`: the engine's own work that callers wait for (int8
        calibration): never refused for load, and ahead of the requests in the model's queue."""
        served = self.model(model, task.capability)
        with served.admitted():
            return await self._run_admitted(task, call, served, background)

    async def _run_admitted(
        self, task: Task[Call, Result], call: Call, served: ServedModel, background: bool = False
    ) -> Result:
        task.check(call, served, self.limits)
        tower = task.tower(call)
        # Admitted (or shed with a 429, or a 413 past the memory budget) before any work:
        # fetching and tokenizing count as waiting.
        queue, cost = served.queue(tower), task.cost(call, served)
        check_answer_size(cost.answer_bytes, self.limits)
        # Held until the answer is made; one hold for the request, so a refusal judges all of it.
        with self.memory.growing() as hold:
            hold(cost.memory)
            key = request_key(task, call, served.name) if queue.contended and not background else None
            predicted = queue.admit(cost.tokens, key, cost.inputs, background)
            try:
                uris = task.media(call, served)
                if uris:  # the fetched bytes join the hold as they arrive (counted once: not in `cost`)
                    fetched = await self.media.fetch_all(uris, hold)
                    items = await self.decoder.prepare_all(
                        served.loaded.encoders[tower], fetched, served.spec.deadline_s,
                        served.spec.request_limit_s,
                    )
                else:
                    items = await self._tokenize(task.encode, call, served, self.limits)
            finally:
                queue.settle(cost.tokens)  # now queued (right below, before any await) or failed
            queued_at = time.perf_counter()
            if self.cache.enabled:  # only the misses go to the model
                rows, ran = await self.cache.rows(
                    served.cache_namespace(tower), items,
                    lambda misses: served.run(misses, tower, background),
                    offload=self._tokenize,
                )
            else:
                rows, ran = await served.run(items, tower, background), len(items)
            if predicted is not None and ran == len(items):  # a prediction of the whole request's work
                queue.calibrate(predicted, time.perf_counter() - queued_at)
            return task.finish(rows, call, served, items)

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
        packed: bool = False,
        output_dtype: str | None = None,
        normalize: bool | None = None,
        wait: bool = True,
    ) -> EmbeddingResult:
        """`openai_sender`: the inputs come from an OpenAI SDK client, whose token ids are
        OpenAI's cl100k_base ids whatever the model reads ids as. `prompt_name`: one of the
        model's named prompts (sentence-transformers' `prompts`), prepended to each text. `packed`: the
        answer goes out as base64, which a response limit counts smaller.

        The model's policy holds here, for every route and the Python API alike:
        `output_dtype` (float32, int8, uint8, binary, ubinary) is, when None, the model's
        `--embedding-dtype`; int8/uint8 use its calibrated ranges (`wait`: for them, else a 503
        while they are calibrated, see `calibration`). `normalize`: True, unit length whatever
        the model does; False, the vectors before the model's Normalize module (TEI's
        normalize=false); None, as the model does."""
        served = self.model(model, Capability.EMBED)
        kind = output_dtype or served.spec.embedding_dtype
        kind = "float32" if kind == "float" else kind  # Cohere's name for it
        if kind != "float32":
            check_embedding_types([kind], quantization.EMBEDDING_TYPES)  # before any work
            await self._calibrated_before_work(served, [kind], dimensions, wait)
        call = EmbedCall(inputs, dimensions, truncate, modality, openai_sender, prompt_name,
                         packed or kind != "float32", normalize is not False)
        result = await self.run_task(TASKS[Capability.EMBED], call, served.name)
        if normalize:
            result = replace(result, embeddings=l2_normalize(result.embeddings))
        if kind == "float32":
            return result
        quantized = await self.quantize(result, kind, dimensions, wait=wait)
        return replace(result, embeddings=quantized, dtype=kind)

    async def embeddings(self, ask: EmbedAsk) -> Embeddings:
        """An embeddings request of any dialect, answered in one call: the model's own kind of
        embedding among those `ask.accepts` (else the first, whose task says why this model
        cannot), the prompt or role the texts' use means to it, and the output types asked."""
        served = self.model(ask.model, *ask.accepts)
        kind = served.capability if served.capability in ask.accepts else ask.accepts[0]
        if kind is Capability.SPARSE:
            if ask.modality != "text":
                raise UnsupportedError("sparse embeddings are of text; send modality 'text'",
                                       param="modality")
            return await self.embed_sparse(ask.inputs, served.name, truncate=ask.truncate,  # type: ignore[arg-type]
                                           prompt_name=ask.prompt_name)
        if kind is Capability.MULTI_VECTOR:
            return await self._multi_vector(served, ask)
        prompt = ask.prompt_name
        if prompt is None and ask.modality == "text":
            prompt = prompt_for_use(ask.use, served.loaded.info.prompts)
        if isinstance(ask.dtype, tuple):
            return await self._embed_by_type(served, ask, prompt)
        return await self.embed(
            ask.inputs, served.name, dimensions=ask.dimensions, truncate=ask.truncate, modality=ask.modality,
            openai_sender=ask.openai_sender, prompt_name=prompt, packed=ask.packed, output_dtype=ask.dtype,
            normalize=ask.normalize, wait=ask.wait,
        )

    async def _multi_vector(self, served: ServedModel, ask: EmbedAsk) -> MultiVectorResult:
        """A multi-vector model's matrices: never truncated nor quantised, and its texts read
        through its own query/document templates (the role their use means)."""
        require_multi_vector(served)  # what the model is, before what the request asks of it
        if ask.dimensions:
            raise UnsupportedError("multi-vector embeddings are not truncated; omit 'dimensions'",
                                   param="dimensions")
        if ask.dtype not in (None, "float32"):
            raise UnsupportedError("multi-vector embeddings are float32; omit the embedding type",
                                   param="embedding_types")
        if ask.prompt_name:
            raise UnsupportedError("a multi-vector model reads texts through its own query/document "
                                   "templates; omit 'prompt_name'", param="prompt_name")
        role = ROLE_FOR_USE.get(ask.use or "")
        return await self.embed_multi_vector(ask.inputs, served.name, modality=ask.modality,  # type: ignore[arg-type]
                                             truncate=ask.truncate, role=role)  # type: ignore[arg-type]

    async def _embed_by_type(
        self, served: ServedModel, ask: EmbedAsk, prompt: str | None
    ) -> EmbeddingsByType:
        """One embedding of the inputs in each type `ask.dtype` names: the floats made once,
        each type made from them."""
        types = ask.dtype or ()
        check_embedding_types(types, quantization.EMBEDDING_TYPES)
        await self._calibrated_before_work(served, types, ask.dimensions, ask.wait)
        floats = await self.embed(ask.inputs, served.name, dimensions=ask.dimensions, truncate=ask.truncate,
                                  modality=ask.modality, prompt_name=prompt, output_dtype="float32")
        by_type = {kind: await self.quantize(floats, kind, ask.dimensions) for kind in types}
        return EmbeddingsByType(floats.model, by_type, floats.prompt_tokens)

    async def similarity(
        self, source: str, sentences: Sequence[str], model: str | None = None, *, truncate: bool = True,
        prompt_name: str | None = None,
    ) -> SimilarityResult:
        """The cosine of `source`'s embedding to each of `sentences`' (sentence-transformers'
        `cos_sim` row; TEI's /similarity), embedded in one call."""
        check_texts(sentences, self.limits, param="sentences")
        result = await self.embed([source, *sentences], model, truncate=truncate, prompt_name=prompt_name,
                                  output_dtype="float32", normalize=True)
        vectors = result.embeddings  # unit length: their dot products are their cosines
        return SimilarityResult(result.model, vectors[1:] @ vectors[0], result.prompt_tokens)

    async def _calibrated_before_work(
        self, served: ServedModel, types: Sequence[str], dimensions: int | None, wait: bool
    ) -> None:
        """Without `wait`, the 503 while int8/uint8 ranges are calibrated comes before the
        request's own work: under load that work may be refused by the deadline, and done it
        would be thrown away."""
        if not wait and any(kind in quantization.CALIBRATED_TYPES for kind in types):
            await self.calibration(served.name, dimensions, wait=False)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        model: str | None = None,
        *,
        top_n: int | None = None,
        raw_scores: bool = False,
        truncate: bool = True,
        modality: Modality = "text",
        max_tokens_per_doc: int | None = None,
    ) -> RerankResult:
        """A cross-encoder scores each pair; a multi-vector model (ColPali) scores the query
        against each document by late interaction (MaxSim sums, not probabilities), the
        documents read as `modality` (images: URLs or data URIs). `max_tokens_per_doc`: each
        text document cut to that many tokens first (Cohere's field)."""
        served = self.model(model, Capability.RERANK, Capability.MULTI_VECTOR)
        if max_tokens_per_doc is not None and modality != "text":
            raise UnsupportedError("'max_tokens_per_doc' cuts text documents; omit it for images",
                                   param="max_tokens_per_doc")
        if served.capability is Capability.MULTI_VECTOR:
            check_max_tokens_per_doc(max_tokens_per_doc)
            if max_tokens_per_doc is not None:
                check_texts(documents, self.limits, param="documents")
                cut = served.loaded.tokenizer.cut
                documents = await asyncio.to_thread(cut, documents, max_tokens_per_doc)
            return await self._late_interaction(served.name, query, documents, top_n, truncate, modality)
        if modality != "text":
            raise UnsupportedError(
                f"model {served.name!r} ranks text documents; modality {modality!r} needs a multi-vector "
                "model such as ColPali",
                param="modality",
            )
        call = RerankCall(query, documents, top_n, raw_scores, truncate, max_tokens_per_doc)
        return await self.run_task(TASKS[Capability.RERANK], call, served.name)

    async def _late_interaction(
        self, model: str, query: str, documents: Sequence[str], top_n: int | None, truncate: bool,
        modality: Modality,
    ) -> RerankResult:
        check_top_n(top_n)
        asked, read = await asyncio.gather(  # the two towers (or roles) at once
            self.embed_multi_vector([query], model, truncate=truncate, role="query"),
            self.embed_multi_vector(documents, model, modality=modality, truncate=truncate, role="document"),
        )
        scores = maxsim(asked.embeddings[0], read.embeddings)
        ranked = [RankedDocument(i, float(scores[i])) for i in rank(scores, top_n)]
        return RerankResult(model, ranked, asked.prompt_tokens + read.prompt_tokens)

    async def classify(
        self,
        inputs: Sequence[str],
        model: str | None = None,
        *,
        raw_scores: bool = False,
        truncate: bool = True,
    ) -> ClassifyResult:
        call = ClassifyCall(inputs, raw_scores, truncate)
        return await self.run_task(TASKS[Capability.CLASSIFY], call, model)

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
        served = self.model(model)
        served.require(Capability.EMBED)
        return await self._int8_ranges[served.name].ranges(dimensions, wait=wait)

    async def _embed_in_background(self, model: str, texts: list[str]) -> np.ndarray:
        """`texts` embedded as the engine's own work (a model's int8/uint8 ranges)."""
        floats = await self.run_task(TASKS[Capability.EMBED], EmbedCall(texts), model, background=True)
        return floats.embeddings

    async def quantize(
        self, result: EmbeddingResult, kind: str, dimensions: int | None = None, *, wait: bool = True
    ) -> np.ndarray:
        """`result`'s vectors as `kind` (float, int8, uint8, binary, ubinary); int8/uint8 with
        the model's calibrated ranges (`dimensions`: the truncation the result was made with;
        `wait`: for them, as `calibration`)."""
        check_embedding_types([kind], quantization.EMBEDDING_TYPES)
        bounds = None
        if kind in quantization.CALIBRATED_TYPES:
            bounds = await self.calibration(result.model, dimensions, wait=wait)
        return quantization.quantize(result.embeddings, kind, bounds)

    async def embed_multi_vector(
        self, inputs: Sequence[str], model: str | None = None, *, modality: Modality = "text",
        truncate: bool = True, role: Role | None = None,
    ) -> MultiVectorResult:
        """ColBERT: each text, read as a query or a document (`role`), as one vector per token;
        ColPali: each query (text) or page (image URL or data URI). Score them with
        `infinity_cloud.tasks.scores.maxsim`."""
        call = MultiVectorCall(inputs, modality, truncate, role)
        return await self.run_task(TASKS[Capability.MULTI_VECTOR], call, model)

    async def embed_sparse(
        self,
        inputs: Sequence[str],
        model: str | None = None,
        *,
        truncate: bool = True,
        prompt_name: str | None = None,
    ) -> SparseEmbeddingResult:
        """SPLADE: each text as its non-zero vocabulary terms and their weights."""
        call = SparseCall(inputs, truncate, prompt_name)
        return await self.run_task(TASKS[Capability.SPARSE], call, model)

    async def tokenize(
        self, texts: Sequence[str], model: str | None = None, *, add_special_tokens: bool = True,
        prompt_name: str | None = None,
    ) -> list[list[Token]]:
        """Each text (behind the model's prompt `prompt_name`) as the model's tokenizer splits
        it, with character spans."""
        served = self.model(model, *Capability)  # any model tokenizes: the default, else the first
        check_texts(texts, self.limits)
        texts = prompted(served, texts, prompt_name)
        # Its answer is the largest per character of any route's (a dict a token): admitted by
        # the memory budget as every route's work is.
        with self.memory.reserved(listed_tokens_cost(texts).memory):
            return await self._tokenize(served.loaded.tokenizer.tokens, texts, add_special_tokens)

    def decode(
        self, ids: Sequence[Sequence[int]], model: str | None = None, *, skip_special_tokens: bool = True
    ) -> list[str]:
        """Token ids of the model's own vocabulary back to text (admitted by the memory budget)."""
        tokenizer = self.model(model, *Capability).loaded.tokenizer
        with self.memory.reserved(decoded_ids_cost(ids).memory):
            return tokenizer.decode(ids, skip_special_tokens)


__all__ = ["Engine"]
