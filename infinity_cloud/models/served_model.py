"""One served model: its lifecycle and state, from its files and tokenizer to its towers
(each assembled by `tower_builder`), and what it answers about itself."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from infinity_cloud.backends import Backend, exports
from infinity_cloud.batching import BatchQueue
from infinity_cloud.batching.worker import Observer
from infinity_cloud.cache.integrity import RowForm
from infinity_cloud.cache.model_identity import ModelIdentity
from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import ModelSpec
from infinity_cloud.core.content_digest import model_fingerprint, one_reading
from infinity_cloud.core.errors import ModelLoadError, ModelNotReadyError, UnsupportedError
from infinity_cloud.core.family import ModelInfo
from infinity_cloud.core.family import Tower as TowerName
from infinity_cloud.core.hardware import cpu_model, kernel_flags, usable_cores
from infinity_cloud.core.results import ModelFacts
from infinity_cloud.families import read_model_info
from infinity_cloud.models.model_source import resolve_model_dir
from infinity_cloud.models.token_states import build_token_states
from infinity_cloud.models.tower_builder import Replica, Tower, TowerBuilder
from infinity_cloud.numerics.inputs import InputEncoder
from infinity_cloud.numerics.pooling import supported_activation
from infinity_cloud.tasks.late_chunking import TOKEN_STATES_TOWER
from infinity_cloud.text.input_encoder import TextInputEncoder
from infinity_cloud.text.tokenization import TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Loaded:
    info: ModelInfo
    tokenizer: TextTokenizer
    towers: dict[TowerName, Tower]
    normalize: bool
    # Each tower's input encoder, as its family says (`ModelFamily.encoders`).
    encoders: dict[TowerName, TextInputEncoder | InputEncoder]
    # The model's files by their content, read once, at load (/health and /models report it,
    # and a health probe must not stat the folder each time).
    fingerprint: str
    # What each tower's rows are cached under (`ServedModel.cache_namespace`), once known.
    namespaces: dict[TowerName, str] = field(default_factory=dict)
    # What builds a tower, kept for those built on first use (`ServedModel.build_token_states`).
    builder: TowerBuilder | None = None
    # Towers built on first use (the token-states tower): not the model's modalities.
    lazy: dict[TowerName, Tower] = field(default_factory=dict)

    def tower(self, name: TowerName) -> Tower:
        return self.towers[name] if name in self.towers else self.lazy[name]

    def every_tower(self) -> list[Tower]:
        return [*self.towers.values(), *self.lazy.values()]

    @property
    def backend(self) -> Backend:
        return next(iter(self.towers.values())).backend

    def replicas(self, every: bool = False) -> list[Replica]:
        """Each tower's replicas (`every`: the lazily built towers' too)."""
        towers = self.every_tower() if every else self.towers.values()
        return [replica for tower in towers for replica in tower.replicas]


class ServedModel:
    """States: loading -> ready -> (draining ->) stopped, or failed with a reason. `hot`: loaded
    while serving (the admin API), so its loading, failing or draining is not the server's
    health."""

    def __init__(
        self, spec: ModelSpec, observers: Sequence[Observer] = (), hot: bool = False,
        info: ModelInfo | None = None,
    ) -> None:
        """`info`: what its folder holds, read already (a hot load reads it to check it), so that
        its load reads the folder once."""
        self.spec = spec
        self.name = spec.name
        self.hot = hot
        self.in_flight = 0  # calls admitted and not yet answered (`admitted`)
        self._observers = observers
        self._info = info
        self._loaded: _Loaded | None = None
        self._building = threading.Lock()  # a tower built on first use, once
        self._stopped = False
        self.state = "loading"
        self.error: str | None = None
        self.load_seconds: float | None = None

    # -- lifecycle -------------------------------------------------------------------

    def load(self, before_ready: Callable[[], None] | None = None) -> None:
        """Blocking: find the files, load tokenizer and weights, start the worker; then
        `before_ready` (what the engine sets up around a loaded model), and only then is it
        ready: a request never finds it ready and its surroundings not."""
        started = time.perf_counter()
        try:
            with one_reading():  # its fingerprint, which exports and the result cache key it by
                self._loaded = self._load()
                if before_ready is not None:
                    before_ready()
        except Exception as exc:
            if self.state != "failed":  # else `before_ready` failed it, with its own reason
                self.state, self.error = "failed", str(exc)
            raise
        self.state = "ready"
        self.load_seconds = time.perf_counter() - started
        log.info(
            "model %s ready: %s via %s on %s (%s) in %.1fs", self.name,
            self._loaded.info.capability.value, self._loaded.backend.name, self._loaded.backend.device,
            self._loaded.backend.dtype, self.load_seconds,
        )
        for tower in self._loaded.towers.values():
            if (export := tower.backend.export_folder) is not None:  # what it keeps on disk, and where
                log.info("model %s: its export %s", self.name, exports.size_note(export))

    def _load(self) -> _Loaded:
        spec = self.spec
        info = self._info
        if info is None:
            info = read_model_info(resolve_model_dir(spec.model_id, spec.revision), spec.pooling,
                                   spec.instruction)
        path = info.path
        for layer in info.dense:
            if not supported_activation(layer.activation):
                raise ModelLoadError(f"{path}: Dense activation {layer.activation} is not supported")
        max_length = min(info.max_length, spec.max_length or info.max_length)
        if spec.length_buckets:  # an input longer than every static shape cannot run
            max_length = min(max_length, spec.length_buckets[-1])
        tokenizer = TextTokenizer.load(path, max_length, info.vocab_size, info.pad_token)
        encoders = info.family.encoders(info, tokenizer)
        missing = [name for name in info.towers if name not in encoders]
        if missing:  # a family's mistake, named at load rather than a KeyError
            raise ModelLoadError(f"{path}: family {info.family.name!r} gives no input encoder for its "
                                 f"tower(s) {', '.join(missing)}")
        normalize = info.normalize if spec.normalize is None else spec.normalize
        builder = TowerBuilder(spec, info, tokenizer, normalize, self._observers)
        towers: dict[TowerName, Tower] = {}
        try:
            for name, graph in info.towers.items():
                towers[name] = builder.build(name, graph, encoders[name])
        except BaseException:
            for tower in towers.values():
                tower.stop()
            raise
        return _Loaded(info, tokenizer, towers, normalize, encoders, model_fingerprint(path), builder=builder)

    @property
    def working_set_bytes(self) -> int:
        """Memory a full batch's intermediates take, estimated per tower from its token budget
        at the model's length: attention scores (heads x length per token) and a few hidden
        states per token, in float32. On MiniLM (16,384 tokens at 256) that is 400 MB, where a
        16 MB request of 256-token texts was measured to take 250 MB with the request itself."""
        if self._loaded is None:
            return 0
        per_token = self._bytes_per_batch_token()
        return sum(per_token * replica.queue.batch_tokens for replica in self._loaded.replicas(every=True))

    def _bytes_per_batch_token(self) -> int:
        assert self._loaded is not None
        info, length = self._loaded.info, self._loaded.tokenizer.max_length
        heads = int(info.raw.get("num_attention_heads") or max(1, info.hidden_size // 64))
        return 4 * (heads * length + 8 * info.hidden_size)

    def fit_batches(self, room: int) -> None:
        """Shrink the towers' token budgets until their full batches fit `room` bytes: a long
        model (8,192 tokens, 16 heads) would take 9 GB at the default budget, more than a
        Lambda function has."""
        if self._loaded is None or self.working_set_bytes <= room:
            return
        queues = [replica.queue for replica in self._loaded.replicas()]  # each runs its batches at once
        tokens = max(64, room // len(queues) // self._bytes_per_batch_token())
        before = queues[0].batch_tokens
        for queue in queues:
            queue.batch_tokens = min(queue.batch_tokens, tokens)
        log.warning(
            "model %s: batches cut to %d tokens (from %d) so their working set fits the memory budget; "
            "a longer input still runs alone, and may not fit: lower --max-length or raise "
            "--memory-budget-mb", self.name, tokens, before,
        )

    def settle(self) -> None:
        """Wait for what the backends still build in the background (`Backend.settle`)."""
        if self._loaded is not None:
            for replica in self._loaded.replicas():
                replica.backend.settle()

    def stop(self) -> None:
        """Stop its workers and close its backends, once (an unload and the engine's close may
        both ask)."""
        if self._loaded is not None and not self._stopped:
            self._stopped = True
            for tower in self._loaded.every_tower():
                tower.stop()
        if self.state != "failed":  # a failure's reason stays what it says
            self.state = "stopped"

    # -- serving ---------------------------------------------------------------------

    def _not_ready(self) -> ModelNotReadyError:
        reason = {
            "loading": "is still loading", "stopped": "is shutting down",
            "draining": "is being unloaded: it finishes what it was given and takes nothing new",
        }.get(self.state, f"failed to load: {self.error}")
        return ModelNotReadyError(f"model {self.name!r} {reason}")

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """A call on this model: refused (503) unless it is ready; counted while it runs, so
        unloading waits for it."""
        if self.state != "ready":
            raise self._not_ready()
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @property
    def loaded(self) -> _Loaded:
        # Draining: the calls admitted before it began still finish.
        if self._loaded is None or self.state not in ("ready", "draining"):
            raise self._not_ready()
        # A tower serves while one of its replicas lives: a dead one took only its own requests.
        dead = next((t for t in self._loaded.every_tower() if not t.serving), None)
        if dead is not None:
            if self.state == "draining":  # its workers stop as it is unloaded
                raise self._not_ready()
            reason = "; ".join(r.worker.death or "its worker stopped" for r in dead.replicas)
            raise ModelNotReadyError(f"model {self.name!r} is not serving: {reason}")
        return self._loaded

    @property
    def capability(self) -> Capability | None:
        return self._loaded.info.capability if self._loaded else None

    def require(self, capability: Capability) -> _Loaded:
        loaded = self.loaded
        if loaded.info.capability is not capability:
            raise UnsupportedError(
                f"model {self.name!r} is for {loaded.info.capability.noun}, not {capability.noun}",
                param="model",
            )
        return loaded

    def cache_namespace(self, tower: TowerName = "text") -> str:
        """What the rows of `tower` are cached under (`cache.model_identity`). Known from its
        load on (the engine registers it before the model is ready)."""
        loaded = self._built()
        if tower not in loaded.namespaces:
            backend, spec = loaded.towers[tower].backend, self.spec
            loaded.namespaces[tower] = ModelIdentity(
                fingerprint=loaded.fingerprint, family=loaded.info.family.name, graph=backend.graph,
                backend=backend.name, dtype=backend.dtype, device=backend.device,
                device_model=type(backend).device_name(spec), pooling=spec.pooling or loaded.info.pooling,
                normalize=loaded.normalize, trust_remote_code=spec.trust_remote_code,
                backend_options=spec.backend_options,
            ).namespace
        return loaded.namespaces[tower]

    def row_form(self, tower: TowerName = "text") -> RowForm | None:
        """The form of the tower's rows, from its warm-up (None without one): what a row read
        back from a shared cache must have."""
        loaded = self._built()
        sample = loaded.towers[tower].sample
        return None if sample is None else RowForm.of(*sample, bound=loaded.info.vocab_size)

    def _built(self) -> _Loaded:
        """What its load built, ready or not yet."""
        if self._loaded is None:
            raise self._not_ready()
        return self._loaded

    @property
    def towers(self) -> tuple[TowerName, ...]:
        """The towers it loaded (text; and image or audio)."""
        return () if self._loaded is None else tuple(self._loaded.towers)

    def cache_namespaces(self) -> list[str]:
        """The namespaces its rows were cached under so far (to forget them when unloaded)."""
        return [] if self._loaded is None else list(self._loaded.namespaces.values())

    def replica(self, tower: TowerName = "text") -> Replica:
        """Where a call on `tower` goes now: its live replica with the least work queued, coming
        and running (`models.replicas`)."""
        replica = self.loaded.tower(tower).least_loaded()
        if replica is None:  # its last replica died since `loaded` looked
            raise ModelNotReadyError(f"model {self.name!r} is not serving: every replica of it stopped")
        return replica

    def queue(self, tower: TowerName = "text") -> BatchQueue:
        """The queue a call on `tower` would join now (`replica`)."""
        return self.replica(tower).queue

    def build_token_states(self) -> int:
        """Blocking: build the token-states tower (`models.token_states`), once, on the first
        call that needs it (late chunking). Returns its full batch's working set in bytes, for
        the memory budget to set aside (0 if it was built already)."""
        loaded = self.loaded
        with self._building:
            if TOKEN_STATES_TOWER in loaded.lazy:
                return 0
            assert loaded.builder is not None
            started = time.perf_counter()
            tower = build_token_states(loaded.builder, loaded.info, loaded.encoders["text"], self.name)
            if self._stopped:  # unloaded while it was built
                tower.stop()
                raise self._not_ready()
            # Batches no larger than the text tower's, which the memory room may have cut at load.
            text_tokens = loaded.towers["text"].replicas[0].queue.batch_tokens
            for replica in tower.replicas:
                replica.queue.batch_tokens = min(replica.queue.batch_tokens, text_tokens)
            loaded.lazy[TOKEN_STATES_TOWER] = tower
        log.info("model %s: its token-states tower built on first use (late chunking) in %.1fs", self.name,
                 time.perf_counter() - started)
        return self._bytes_per_batch_token() * sum(r.queue.batch_tokens for r in tower.replicas)

    async def run(
        self, items: list[Any], tower: TowerName = "text", urgent: bool = False,
        replica: Replica | None = None,
    ) -> list[Any]:
        """Each item through a batch worker of the tower (`replica`'s, the one the call was
        admitted on; else the least loaded now); its batch cost is its length (tokens).
        `urgent`: before every other request queued (the engine's own background work)."""
        worker = (replica or self.replica(tower)).worker
        return await worker.submit(items, [len(item) for item in items], urgent)

    @property
    def healthy(self) -> bool:
        return (
            self.state == "ready" and self._loaded is not None
            and all(t.serving for t in self._loaded.every_tower())
        )

    @property
    def facts(self) -> ModelFacts | None:
        """What the model is, typed; None until it has loaded."""
        loaded = self._loaded
        if loaded is None:
            return None
        info = loaded.info
        return ModelFacts(
            name=self.name, capability=info.capability.value, modalities=tuple(loaded.towers),
            backend=loaded.backend.name, device=loaded.backend.device, dtype=loaded.backend.dtype,
            agreement_with_float32=loaded.backend.agreement, precision_note=loaded.backend.precision_note,
            max_input_tokens=loaded.tokenizer.max_length,
            dimensions=info.dimensions,
            labels=tuple(info.labels) if info.capability is Capability.CLASSIFY else (),
            pooling=self.spec.pooling or info.pooling, normalize=loaded.normalize,
        )

    def describe(self) -> dict[str, Any]:
        """Facts for /models and /health."""
        out: dict[str, Any] = {"id": self.name, "aliases": list(self.spec.aliases), "state": self.state,
                               "backend": self.spec.backend}
        if self.error:
            out["error"] = self.error
        facts = self.facts
        if self._loaded is None or facts is None:
            return out
        replicas = self._loaded.replicas()
        workers = [r.worker for r in replicas]
        backend = self._loaded.backend
        out.update(
            backend=facts.backend,  # `auto` resolved
            capabilities=[facts.capability],
            dtype=facts.dtype,
            # Worst cosine to float32 on the fidelity probes; None for float32 itself.
            agreement_with_float32=facts.agreement_with_float32,
            # Why a reduced precision was not served (or, asked for, falls short); None if none.
            precision_note=facts.precision_note,
            device=facts.device,
            max_input_tokens=facts.max_input_tokens,
            dimensions=facts.dimensions,
            labels=list(facts.labels) if facts.capability == Capability.CLASSIFY.value else None,
            modalities=list(facts.modalities),
            # What a measurement of it depends on (`infinity-cloud bench` tags its profile so).
            fingerprint=self._loaded.fingerprint,
            host={
                "device": "cpu" if facts.device == "cpu" else type(backend).device_name(self.spec),
                "cpu": cpu_model(), "cores": usable_cores(),
                "kernel_flags": kernel_flags(),
            },
            stats={
                "queue_depth": sum(w.queue.depth for w in workers),
                "queued_tokens": sum(w.queue.queued_tokens for w in workers),
                "batches_done": sum(w.batches_done for w in workers),
                "batches_failed": sum(w.batches_failed for w in workers),
                "inputs_done": sum(w.inputs_done for w in workers),
                "worker_alive": all(w.alive for w in workers),
                "load_seconds": round(self.load_seconds or 0.0, 3),
                # Each replica's own (`models.replicas`): /metrics labels them by device.
                "devices": _by_device(replicas),
            },
        )
        deaths = [w.death for w in workers if w.death]
        if deaths:  # a model serving on its other replicas is degraded, not failed: said, per device
            key = "error" if any(not t.serving for t in self._loaded.towers.values()) else "degraded"
            out[key] = "; ".join(deaths)
        return out


def _by_device(replicas: list[Replica]) -> dict[str, dict[str, Any]]:
    """Each device's replicas' queue and worker, summed over the towers on it."""
    devices: dict[str, dict[str, Any]] = {}
    for replica in replicas:
        worker, queue = replica.worker, replica.queue
        entry = devices.setdefault(replica.device, {
            "queue_depth": 0, "queued_tokens": 0, "batches_done": 0, "batches_failed": 0, "alive": True,
        })
        entry["queue_depth"] += queue.depth
        entry["queued_tokens"] += queue.queued_tokens
        entry["batches_done"] += worker.batches_done
        entry["batches_failed"] += worker.batches_failed
        entry["alive"] = entry["alive"] and worker.alive
        if worker.death:
            entry["error"] = worker.death
    return devices


def prepare_model(spec: ModelSpec, *, build_exports: bool = True) -> str:
    """Fetch a model's files and, unless told not to, build its backend's exports once (by
    loading it), so a server or image started later does neither. Returns a summary line."""
    path = resolve_model_dir(spec.model_id, spec.revision)
    if not build_exports:
        return f"{spec.name}: {path}"
    from infinity_cloud.core.progress import slow_step

    served = ServedModel(spec)
    try:
        with slow_step(f"loading {spec.name} to build what its backend needs", spinner=False):
            served.load()
        facts = served.describe()
    finally:
        served.stop()
    return f"{spec.name}: {path}, ready for {facts['backend']} ({facts['dtype']}, {facts['device']})"
