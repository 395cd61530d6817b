"""The served models, by name: each looked up once per request (`lookup`), their lifecycle
(loaded at start, added and removed while serving, refused where they conflict or would not
fit) and their room in the memory budget; each dense embedder with its int8/uint8 ranges,
made with it and dropped with it."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from infinity_cloud.admission.memory import MB, MemoryBudget, resident_bytes, weights_bytes
from infinity_cloud.batching.worker import Observer
from infinity_cloud.cache.result_cache import ResultCache
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import DeploymentSpec, ModelSpec
from infinity_cloud.core.errors import (
    InvalidInputError,
    ModelConflictError,
    ModelLoadError,
    ModelNotFoundError,
    ModelTooLargeError,
)
from infinity_cloud.core.results import ModelFacts
from infinity_cloud.families import read_model_info
from infinity_cloud.models.int8_ranges import Int8Ranges
from infinity_cloud.models.model_source import folder_model_name, model_dir_within
from infinity_cloud.models.served_model import ServedModel
from infinity_cloud.tasks import quantization

log = logging.getLogger(__name__)

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
# model is served under them, so they are taken as TEI takes any name (`lookup`'s any_name).
TEI_PLACEHOLDER_NAMES = frozenset({"tei"})

# A model's texts embedded as the engine's own work (its int8/uint8 ranges' calibration texts).
EmbedInBackground = Callable[[ServedModel, list[str]], Awaitable[np.ndarray]]


class Fleet:
    """The models a server serves, by name and alias, in the spec's order."""

    def __init__(
        self, spec: DeploymentSpec, observers: list[Observer], memory: MemoryBudget, cache: ResultCache,
        embed_in_background: EmbedInBackground,
    ) -> None:
        self.spec = spec
        self.observers = observers  # shared down to every batch worker
        self.memory = memory
        self.cache = cache
        self._embed_in_background = embed_in_background
        self.models: dict[str, ServedModel] = {}
        # Each model's int8/uint8 ranges (`Int8Ranges`): made with it, dropped when it is unloaded.
        self._int8_ranges: dict[str, Int8Ranges] = {}
        self._loading: set[asyncio.Future[None]] = set()  # models added while serving
        self._unloaded: set[str] = set()  # names of models unloaded while serving: a 404, not another model
        self._names_taken: set[tuple[str, str]] = set()  # (unserved name, model) said in the log (`lookup`)
        for model_spec in spec.models:
            self._serve(ServedModel(model_spec, observers))

    def _serve(self, model: ServedModel) -> None:
        """Serve `model` (loaded, or loading), with its int8/uint8 ranges."""
        self.models[model.name] = model
        self._int8_ranges[model.name] = Int8Ranges(model, functools.partial(self._embed_in_background, model))

    # -- addressing ------------------------------------------------------------------

    def lookup(self, name: str | None = None, *capabilities: Capability, any_name: bool = False
               ) -> ServedModel:
        """The served model a request means. With one model, any name resolves to it. With
        several: its name or an alias; no name: the one served model that does one of
        `capabilities` (the request's task), or where several do, the one marked `default`,
        else the first listed of them. An unknown name is a 404 naming what is served; with
        `any_name` (TEI's routes: TEI ignores the name, and its clients send their own), or
        a name TEI's clients send on any route (`TEI_PLACEHOLDER_NAMES`), it goes to the one
        served model that does the task where exactly one does, said in the log once per name."""
        if name in self._unloaded:
            raise ModelNotFoundError(f"model {name!r} was unloaded; served models: {self.known_names()}",
                                     param="model")
        if len(self.models) == 1:
            return next(iter(self.models.values()))
        able = [m for m in self.models.values() if m.capability in capabilities]
        if name:
            return self._named(name, able, capabilities, any_name or name in TEI_PLACEHOLDER_NAMES)
        if able:
            return next((m for m in able if m.spec.default), able[0])
        known = self.known_names()
        wanted = " or ".join(c.noun for c in capabilities) if capabilities else None
        raise ModelNotFoundError(
            f"no served model does {wanted}; name one in 'model': {known}" if wanted
            else f"several models are served; name one in 'model': {known}", param="model",
        )

    def _named(self, name: str, able: list[ServedModel], capabilities: Sequence[Capability], any_name: bool
               ) -> ServedModel:
        found = next((m for m in self.models.values() if name in m.spec.names), None)
        if found is None and any_name and len(able) == 1:
            found = able[0]
            if (name, found.name) not in self._names_taken:
                self._names_taken.add((name, found.name))
                log.warning("a request for model %r, which is not served, is answered by %r, the one "
                            "served model that does %s (its route ignores the name, as TEI does); "
                            "said once", name, found.name, " or ".join(c.noun for c in capabilities))
        if found is None:
            raise ModelNotFoundError(f"model {name!r} is not served here; served models: "
                                     f"{self.known_names()}", param="model")
        return found

    def known_names(self) -> str:
        return ", ".join(n for m in self.models.values() for n in m.spec.names)

    # -- loading ---------------------------------------------------------------------

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

    # -- int8/uint8 ranges -----------------------------------------------------------

    async def ranges(self, served: ServedModel, dimensions: int | None = None, *, wait: bool = True
                     ) -> np.ndarray:
        """`served`'s int8/uint8 ranges (`Int8Ranges.ranges`); a model that is no dense
        embedder is a 400 saying what it is, before any calibration starts."""
        served.require(Capability.EMBED)
        return await self._int8_ranges[served.name].ranges(dimensions, wait=wait)

    async def calibrate_loaded(self, models: list[ServedModel]) -> None:
        """The int8/uint8 ranges of each of `models` served as int8/uint8 (its every answer
        needs them), made as part of its load, not in a caller's first request: the server is
        not healthy till they are (`healthy`). Every way a model loads ends here: `start`,
        `loaded` (serve, the containers) and a hot load."""
        for model in models:
            if model.state == "ready" and self._needs_ranges(model):
                await self.ranges(model)

    def _needs_ranges(self, model: ServedModel) -> bool:
        """Served as int8/uint8, without its ranges yet."""
        ranges = self._int8_ranges.get(model.name)
        return model.spec.embedding_dtype in quantization.CALIBRATED_TYPES and not (ranges and ranges.ready)

    # -- models loaded and unloaded while serving ------------------------------------

    async def add(self, spec: ModelSpec) -> ServedModel:
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
            info = await asyncio.to_thread(read_model_info, path, spec.pooling, spec.instruction)
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
                await self.calibrate_loaded([model])  # part of its load, as at start
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

    async def remove(self, name: str, drain_timeout_s: float = 120.0) -> dict[str, Any]:
        """Stop serving `name`: new calls get 503 at once, the calls already admitted finish
        (up to `drain_timeout_s`), then its workers stop and its memory is given back.
        Returns what was drained and freed."""
        model = self._to_remove(name)
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

    def _to_remove(self, name: str) -> ServedModel:
        """The model `name` names, if it may be unloaded now (a 404, else a 409 saying why not)."""
        model = self.models.get(name) or next((m for m in self.models.values() if name in m.spec.names), None)
        if model is None:
            raise ModelNotFoundError(
                f"model {name!r} is not served here; served models: {self.known_names()}", param="name"
            )
        if model.state == "loading":
            raise ModelConflictError(f"model {model.name!r} is still loading: unload it once it is ready",
                                     param="name")
        if model.state in ("draining", "stopped"):  # a second DELETE while the first drains
            raise ModelConflictError(f"model {model.name!r} is already being unloaded", param="name")
        return model

    async def settle(self) -> None:
        """Wait for the models still loading (they then stop with the rest)."""
        if self._loading:
            await asyncio.gather(*self._loading, return_exceptions=True)

    def stop(self) -> None:
        for model in self.models.values():
            model.stop()

    # -- state -----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Every model loaded and working, and those served as int8/uint8 calibrated (part of
        their load: their every answer needs the ranges). A model loaded while serving counts
        once it is ready and calibrated: its loading, failing or draining is the admin API's to
        report. No model ready (the only one unloaded, or its replacement still loading) is not
        healthy: it would answer every call 404."""
        models = list(self.models.values())
        return any(m.state == "ready" for m in models) and all(
            m.healthy and not self._needs_ranges(m)
            for m in models if not (m.hot and (m.state != "ready" or self._needs_ranges(m)))
        )

    @property
    def longest_deadline_s(self) -> float:
        """The models' longest deadline (`DEFAULT_MEMORY_DEADLINE_S` where none sets one)."""
        deadlines = [m.spec.deadline_s for m in self.models.values() if m.spec.deadline_s is not None]
        return max(deadlines, default=DEFAULT_MEMORY_DEADLINE_S)

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


__all__ = ["LOAD_COST_PER_WEIGHT_BYTE", "TEI_PLACEHOLDER_NAMES", "Fleet"]
