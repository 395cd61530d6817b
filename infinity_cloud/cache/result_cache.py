"""A request's inputs split into cached rows and misses: only the misses go to the model, and
what it answers is kept for the next request (in process, and in Redis when configured). A
hit is the very row the model answered before, so an answer is the same with the cache as
without it; options applied after the model (dimensions, output dtype, top_n) are not in the
key, so they share rows.

Per request, `CACHE_MODE` (the HTTP app sets it from `Cache-Control`): "use", "refresh" (do
not read, but store what is computed: `no-cache`) or "off" (neither: `no-store`).

A row read from Redis is served only when it has the form of the model's own rows and, with a
shared secret, its tag (`integrity.py`); any other is recomputed and counted as rejected."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from infinity_cloud.cache.codec import decode_row, encode_row
from infinity_cloud.cache.integrity import RowForm, RowSeal
from infinity_cloud.cache.keys import fingerprint
from infinity_cloud.cache.memory_store import MemoryStore
from infinity_cloud.cache.redis_store import RedisStore
from infinity_cloud.core.results import SparseVector

log = logging.getLogger(__name__)

CacheMode = Literal["use", "refresh", "off"]
CACHE_MODE: ContextVar[CacheMode] = ContextVar("infinity_cloud_cache_mode", default="use")
KEY_PREFIX = b"infinity-cloud:"  # every key, so a shared Redis may hold other things too


@contextmanager
def cache_mode(mode: CacheMode) -> Iterator[None]:
    """Calls inside the block use the cache as `mode` says (the Python API's opt-out)."""
    token = CACHE_MODE.set(mode)
    try:
        yield
    finally:
        CACHE_MODE.reset(token)


@dataclass
class CacheStats:
    hits: dict[str, int] = field(default_factory=lambda: {"memory": 0, "redis": 0})
    misses: int = 0
    # Inputs that are never cached (a caller's own task whose inputs are not plain data).
    uncached: int = 0
    # Rows read from Redis and not served: not the model's form, or not tagged by the secret.
    rejected: int = 0


def _fingerprints(items: Sequence[Any]) -> list[bytes | None]:
    return [fingerprint(item) for item in items]


def _frozen(row: Any) -> Any:
    """A row as the store keeps it: its own memory (a row of a batch is a view that would keep
    the whole batch alive), read-only (a hit handed to a caller must not be changed in place)."""
    if isinstance(row, np.ndarray):
        row = row.copy() if row.base is not None or row.flags.writeable else row
        row.setflags(write=False)
    elif isinstance(row, SparseVector):
        row = SparseVector(_frozen(row.indices), _frozen(row.values))
    return row


class ResultCache:
    """`memory_bytes` 0 and no `redis_url`: off, and `rows` is the model's call itself."""

    def __init__(self, memory_bytes: int = 0, redis_url: str | None = None, ttl_s: int | None = None,
                 redis_timeout_s: float = 0.05, secret: bytes | None = None) -> None:
        self.memory = MemoryStore(memory_bytes) if memory_bytes > 0 else None
        self.redis = RedisStore(redis_url, ttl_s, redis_timeout_s) if redis_url else None
        self.seal = RowSeal(secret)
        self.stats = CacheStats()
        # Each namespace's row form: given at load (`expect`), else learned from its first row
        # computed here; until then nothing is read back from Redis for it.
        self._forms: dict[str, RowForm] = {}
        self._warned = False

    def expect(self, namespace: str, form: RowForm | None) -> None:
        """The form of a namespace's rows (its model's, measured at load)."""
        if form is not None:
            self._forms[namespace] = form

    @property
    def enabled(self) -> bool:
        return self.memory is not None or self.redis is not None

    async def rows(
        self, namespace: str, items: Sequence[Any], compute: Callable[[list[Any]], Awaitable[Sequence[Any]]],
        offload: Callable[..., Awaitable[Any]] | None = None,
    ) -> tuple[list[Any], int]:
        """Each item's row, in order, and how many of them the model ran (fewer than the items
        when some were hits, or repeats of another). `namespace`: the model and tower the rows
        are of (`ServedModel.cache_namespace`); `offload(fn, *args)` runs the inputs' hashing
        off the event loop (a request's images are tens of MB)."""
        mode = CACHE_MODE.get()
        if not self.enabled or mode == "off":
            return list(await compute(list(items))), len(items)
        prefix = KEY_PREFIX + namespace.encode() + b":"
        prints = await offload(_fingerprints, items) if offload else _fingerprints(items)
        keys = [None if p is None else prefix + p.hex().encode() for p in prints]
        found: list[Any] = [None] * len(items)
        if mode == "use":
            await self._look_up(namespace, keys, items, found)
        run, first = _misses(keys, found)
        computed = list(await compute([items[i] for i in run])) if run else []
        for i, row in zip(run, computed, strict=True):
            found[i] = row
        if computed and namespace not in self._forms:
            self.expect(namespace, RowForm.of(computed[0], items[run[0]]))
        for i, key in enumerate(keys):
            if found[i] is None and key is not None:
                found[i] = found[first[key]]
        self.stats.misses += len(run)
        self.stats.uncached += sum(key is None for key in keys)
        self._store([(keys[i], found[i]) for i in run if keys[i] is not None])
        return found, len(run)

    async def _look_up(
        self, namespace: str, keys: list[bytes | None], items: Sequence[Any], found: list[Any]
    ) -> int:
        asked = [i for i, key in enumerate(keys) if key is not None]
        hits = 0
        if self.memory is not None and asked:
            for i, row in zip(asked, self.memory.get([keys[i] for i in asked]), strict=True):  # type: ignore[misc]
                if row is not None:
                    found[i] = row
            memory_hits = sum(found[i] is not None for i in asked)
            self.stats.hits["memory"] += memory_hits
            hits += memory_hits
            asked = [i for i in asked if found[i] is None]
        form = self._forms.get(namespace)
        if self.redis is not None and asked and form is not None:
            shared = await self.redis.get([keys[i] for i in asked])  # type: ignore[misc]
            promoted = []
            for i, stored in zip(asked, shared, strict=True):
                if stored is None:
                    continue
                row = self._checked(keys[i], stored, items[i], form)  # type: ignore[arg-type]
                if row is None:
                    continue
                found[i] = row
                promoted.append((keys[i], row))
            self.stats.hits["redis"] += len(promoted)
            hits += len(promoted)
            if self.memory is not None:
                self.memory.put(promoted)  # type: ignore[arg-type]
        return hits

    def _checked(self, key: bytes, stored: bytes, item: Any, form: RowForm) -> Any:
        """The row `stored` holds, frozen, where it is the model's kind of row for `item` (and
        carries the secret's tag); else None, counted and said once."""
        data = self.seal.open(key, stored)
        try:
            row = None if data is None else decode_row(data)
        except Exception:  # not a row (another program's value under our prefix)
            row = None
        if row is not None and form.admits(row, item):
            return _frozen(row)
        self.stats.rejected += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "a row read from the shared result cache is not what the model produces (%s): it is "
                "recomputed, and such rows are counted in infinity_cloud_cache_rejected_total. Another "
                "version or program writes under the same prefix, or the Redis was written to by hand; "
                "give every replica --cache-secret-file so that only they can write rows that are served",
                "no valid tag for this replica's secret" if data is None else "wrong type, shape or numbers",
            )
        return None

    def _store(self, pairs: list[tuple[bytes, Any]]) -> None:
        if not pairs:
            return
        if self.memory is not None:
            self.memory.put([(key, _frozen(row)) for key, row in pairs])
        if self.redis is not None:
            encoded = [(key, self.seal.seal(key, data)) for key, row in pairs
                       if (data := encode_row(row)) is not None]
            self.redis.put_later(encoded)

    def forget(self, namespace: str) -> None:
        """Drop one model tower's rows from memory (a model unloaded); Redis keeps them for
        the same model elsewhere, or here again later."""
        prefix = KEY_PREFIX + namespace.encode() + b":"
        if self.memory is not None:
            self.memory.clear(prefix)

    def start(self) -> None:
        """Connect to Redis now, in the background, rather than at the first request."""
        if self.redis is not None:
            _ = self.redis.available

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()

    def describe(self) -> dict[str, Any]:
        """For /metrics and the models' facts."""
        return {
            "hits": dict(self.stats.hits), "misses": self.stats.misses,
            "memory_bytes": 0 if self.memory is None else self.memory.bytes,
            "memory_capacity_bytes": 0 if self.memory is None else self.memory.capacity_bytes,
            "uncached": self.stats.uncached, "rejected": self.stats.rejected,
            "entries": 0 if self.memory is None else len(self.memory),
            "redis_errors": 0 if self.redis is None else self.redis.errors,
        }


def _misses(keys: list[bytes | None], found: list[Any]) -> tuple[list[int], dict[bytes, int]]:
    """The items to run: the misses, each distinct input once (a request that repeats a text
    runs it once), and where each key first stands, for its repeats to copy."""
    first: dict[bytes, int] = {}
    run: list[int] = []
    for i, key in enumerate(keys):
        if found[i] is not None:
            continue
        if key is None:
            run.append(i)
        elif key not in first:
            first[key] = i
            run.append(i)
    return run, first
