"""The in-process store: an LRU bounded in bytes (the rows' own, and the keys'), used from the
event loop only."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from infinity_cloud.cache.codec import row_bytes

# What an entry takes besides its row and its key's own bytes: the key object, the tuple, its
# size's int and the ordered dict's node, about (measured on CPython 3.11).
_ENTRY_BYTES = 350


class MemoryStore:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.bytes = 0
        self._rows: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, keys: Sequence[bytes]) -> list[Any | None]:
        found = []
        for key in keys:
            entry = self._rows.get(key)
            if entry is not None:
                self._rows.move_to_end(key)
            found.append(None if entry is None else entry[0])
        return found

    def put(self, pairs: Iterable[tuple[bytes, Any]]) -> None:
        for key, row in pairs:
            size = row_bytes(row) + _ENTRY_BYTES + len(key)
            if size > self.capacity_bytes:
                continue
            old = self._rows.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._rows[key] = (row, size)
            self.bytes += size
            while self.bytes > self.capacity_bytes:
                _, (_, dropped) = self._rows.popitem(last=False)
                self.bytes -= dropped

    def clear(self, prefix: bytes | None = None) -> None:
        """Forget every row, or those of one model (`prefix`: its namespace)."""
        for key in [k for k in self._rows if prefix is None or k.startswith(prefix)]:
            self.bytes -= self._rows.pop(key)[1]
