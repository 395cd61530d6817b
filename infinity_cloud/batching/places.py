"""Places in line kept for requests shed by the deadline, so that retries converge.

A request shed with a 429 comes back after Retry-After (the openai SDK, most clients). If it
then competed afresh, smaller newcomers, whose turns come sooner, would be admitted before it
again and again: under a steady storm a large request could be shed on every try. So a shed
request keeps its place: known by a key (a digest of what it asks), it is weighed against the
queue and the places kept before its own, while every newcomer is weighed against all of them.
The oldest shed request is admitted first, as in a line. A place lapses when its request does
not come back within its Retry-After and half as long again (at least `grace_s` more): a
client that gave up soon holds nobody back, and so does not make the Retry-After of the
requests behind it a promise the server cannot keep.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Place:
    tokens: int
    expires: float


class Places:
    """Kept places in the order they were first kept; not thread-safe (the queue's lock)."""

    def __init__(self, grace_s: float = 2.0, most: int = 100_000) -> None:
        self.grace_s = grace_s
        self.most = most  # a bound on memory, whatever the storm
        self._places: OrderedDict[str, _Place] = OrderedDict()

    def __len__(self) -> int:
        return len(self._places)

    def ahead_of(self, key: str | None, most: int | None = None, now: float | None = None) -> tuple[int, int]:
        """(tokens, requests) of the places kept before `key`'s (all of them for a newcomer),
        lapsed ones dropped first; the tokens counted up to `most`."""
        now = time.monotonic() if now is None else now
        for stale in [k for k, place in self._places.items() if place.expires < now]:
            del self._places[stale]
        tokens = requests = 0
        for held, place in self._places.items():
            if held == key:
                break
            tokens += place.tokens
            requests += 1
        return (tokens if most is None else min(tokens, most)), requests

    def keep(self, key: str, tokens: int, retry_after_s: float, now: float | None = None) -> None:
        """`key`'s request was shed: keep (or extend) its place until it is due back."""
        now = time.monotonic() if now is None else now
        expires = now + retry_after_s + max(self.grace_s, retry_after_s / 2)
        place = self._places.get(key)
        if place is not None:
            place.expires = expires
            return
        if len(self._places) >= self.most:
            self._places.popitem(last=False)
        self._places[key] = _Place(tokens, expires)

    def release(self, key: str | None) -> None:
        """`key`'s request was admitted: its place is taken."""
        if key is not None:
            self._places.pop(key, None)
