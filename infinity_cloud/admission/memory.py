"""The process's memory budget: how much the work admitted may take, and giving freed memory back.

A request is admitted when the process's resident memory now, plus the loaded models' full
batches' working sets (`set_aside`), plus what the requests already admitted are estimated
to hold, plus its own estimate, fits the budget; otherwise it is
answered at once: 429 while others hold memory (it would fit later), 413 when it could not
fit even alone. Counting resident memory as well as the estimates counts a request's memory
twice once it is allocated: the error is on the safe side, and it also catches what no
estimate sees (a leak, fragmentation).

The budget is declared (`--memory-budget-mb`, or a target's memory setting) or read from the
container's cgroup limit, else the machine's memory; of a limit read this way 90 % is used,
for what is held before a request is admitted (bodies being read).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from infinity_cloud.errors import PayloadTooLargeError, QueueFullError

log = logging.getLogger(__name__)

MB = 2**20
DETECTED_SHARE = 0.9
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
_NO_LIMIT = 2**60  # cgroup v1 writes a huge number for "no limit"


def resident_bytes() -> int:
    """The process's resident memory now (Linux: /proc; elsewhere 0: reservations only)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def detected_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 or v1), else the machine's memory."""
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None  # glibc only
    except (OSError, AttributeError):
        return None


def give_back_freed_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's malloc_trim): after a burst, the
    arenas of the tokenizer and the inference threads otherwise keep the peak resident."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


# A model folder's weights in the formats a backend starts from, best first: the first found
# is what loading reads (the others are copies: ONNX or OpenVINO exports shipped beside it).
_WEIGHT_FORMATS = ("*.safetensors", "pytorch_model*.bin", "*.onnx", "onnx/*.onnx")


def weights_bytes(folder: Path) -> int:
    """About what loading the model in `folder` takes: its weights as stored, in the format
    loading reads (an estimate: a float16 file served in float32 takes twice that)."""
    for pattern in _WEIGHT_FORMATS:
        files = [p for p in folder.glob(pattern) if p.is_file()]
        if files:
            return sum(p.stat().st_size for p in files)
    return 0


class MemoryBudget:
    """Admission by memory, and trimming the heap once the admitted work is done.

    `limit_bytes` None: unbounded (reservations are still counted, for the metrics)."""

    def __init__(
        self,
        limit_bytes: int | None,
        resident: Callable[[], int] = resident_bytes,
        trim: Callable[[], object] = give_back_freed_memory,
        trim_every_s: float = 1.0,
    ) -> None:
        self.limit_bytes = limit_bytes
        self._resident = resident
        self._trim = trim
        self._trim_every_s = trim_every_s
        self._lock = threading.Lock()
        self._held = 0
        self._holders = 0
        self._aside = 0  # the models' full-batch working sets (`set_aside`)
        self._largest = 0  # the most one admitted request held: what a model loaded later must leave
        # Resident memory when last idle (loaded, or just trimmed): what a request must fit
        # beside to fit at all. Resident memory now may hold other requests' bodies.
        self._idle_resident = resident()
        self._idle = threading.Event()
        self._trimmer: threading.Thread | None = None

    @classmethod
    def declared(cls, budget_mb: int | None) -> MemoryBudget:
        """`budget_mb` as given, or the detected limit's share."""
        if budget_mb is not None:
            return cls(budget_mb * MB)
        detected = detected_limit_bytes()
        return cls(None if detected is None else int(detected * DETECTED_SHARE))

    @property
    def held_bytes(self) -> int:
        return self._held

    def room_for_batches(self) -> int:
        """What a loaded model's full batches may take: half of what the budget has left, the
        other half for the requests."""
        if self.limit_bytes is None:
            return 1 << 62
        return max(0, self.limit_bytes - self._resident() - self._aside) // 2

    def room_for_model(self) -> int | None:
        """What one more model may take: the budget less what the process holds and the
        loaded models' batches; None without a budget."""
        if self.limit_bytes is None:
            return None
        return max(0, self.limit_bytes - self._resident() - self._aside - self._held)

    def room_for_requests(self) -> int | None:
        """What requests may take on an idle server: the budget less what the process holds
        idle and the models' batches; None without a budget."""
        if self.limit_bytes is None:
            return None
        return max(0, self.limit_bytes - self._idle_resident - self._aside)

    @property
    def largest_request_bytes(self) -> int:
        """The most one admitted request held so far."""
        return self._largest

    def trim(self) -> None:
        """Give freed memory back now (after loading: exports and precision checks leave
        hundreds of MB freed but resident)."""
        self._trim()
        with self._lock:
            if not self._holders:
                self._idle_resident = self._resident()

    def set_aside(self, working_set: int) -> None:
        """Keep `working_set` bytes for a loaded model's batches (not resident between them:
        the heap is trimmed when idle); warns when the budget cannot hold it beside what the
        process already takes."""
        self._aside += working_set
        self._idle_resident = self._resident()
        if self.limit_bytes is not None and self._resident() + self._aside > self.limit_bytes:
            log.warning(
                "the memory budget (%d MB) is less than the models take (%d MB) plus their full "
                "batches' working sets (%d MB): requests will be refused; raise --memory-budget-mb "
                "or lower --batch-tokens",
                self.limit_bytes // MB, self._resident() // MB, self._aside // MB,
            )

    @contextmanager
    def reserved(self, need: int) -> Iterator[None]:
        """Hold `need` bytes of the budget for the block, or refuse (429/413) at once."""
        self._reserve(need)
        try:
            yield
        finally:
            self._release(need)

    @contextmanager
    def growing(self) -> Iterator[Callable[[int], None]]:
        """A reservation that grows as the block learns what it takes (a download's bytes as
        they arrive): each `grow(n)` holds n bytes more or refuses at once, as `reserved`
        does; all of it is released at the end."""
        held = 0

        def grow(more: int) -> None:
            nonlocal held
            self._reserve(more, holder=False, whole=held + more)
            held += more

        with self.reserved(0):  # one holder for the block: the heap is trimmed after it
            try:
                yield grow
            finally:
                with self._lock:
                    self._held -= held

    def _reserve(self, need: int, holder: bool = True, whole: int | None = None) -> None:
        """Hold `need` bytes more; `whole`: what the holder holds with them (for the refusal)."""
        with self._lock:
            limit = self.limit_bytes
            if limit is not None and self._resident() + self._aside + self._held + need > limit:
                raise self._refusal(need if whole is None else whole)
            self._held += need
            self._largest = max(self._largest, need if whole is None else whole)
            if holder:
                self._holders += 1

    def _refusal(self, need: int) -> Exception:
        assert self.limit_bytes is not None
        idle = self._idle_resident + self._aside
        if idle + need > self.limit_bytes:  # it would not fit on an idle server either
            return PayloadTooLargeError(
                f"this request would take about {math.ceil(need / MB)} MB, and the server has "
                f"{max(0, self.limit_bytes - idle) // MB} MB of its {self.limit_bytes // MB} MB "
                "memory budget free when idle; send fewer or shorter inputs"
            )
        error = QueueFullError(
            f"the server's memory budget ({self.limit_bytes // MB} MB) is taken by requests in "
            "progress; retry shortly"
        )
        error.retry_after_s = 1
        return error

    def _release(self, need: int) -> None:
        with self._lock:
            self._held -= need
            self._holders -= 1
            if self._holders == 0:
                self._idle.set()
                self._start_trimmer()

    def _start_trimmer(self) -> None:
        if self._trimmer is None:
            self._trimmer = threading.Thread(target=self._trim_when_idle, name="memory-trim", daemon=True)
            self._trimmer.start()

    def _trim_when_idle(self) -> None:
        """Each time the admitted work has all finished, trim (off the event loop: trimming a
        large heap takes milliseconds), at most once per `trim_every_s`."""
        while True:
            self._idle.wait()
            self._idle.clear()
            started = time.perf_counter()
            self.trim()
            time.sleep(max(0.0, self._trim_every_s - (time.perf_counter() - started)))
