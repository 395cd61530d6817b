"""The process's memory budget: how much the work admitted may take, and giving freed memory back.

Each byte is counted once. A request is admitted when the larger of what the process is
estimated to hold (its resident memory when last idle, plus what the admitted requests are
estimated to hold) and what it holds now (its resident memory), plus the loaded models' full
batches' working sets (`set_aside`), plus the request's own estimate, fits the budget. The
estimate covers a request's memory before it is allocated, resident memory once it is: adding
the two (as this module once did) counted a download's bytes twice and refused a request that
fits an idle server forever; resident memory alone missed what is about to be allocated.
Resident memory above the estimate with nothing admitted is memory a finished request left
behind: it is given back (glibc's `malloc_trim`) then, not held against every later request.

A refusal says what holds: 413 when the request would not fit even the server as it was when
its models had loaded (it never will: the message names the budget); 429 while admitted
requests hold the memory, with a Retry-After for when, by how long requests have held memory
lately, enough of it is released (at least 1 s); 503 (`MemoryExhaustedError`) when nothing is
admitted and the process still holds more than the request leaves room for even after
trimming (a leak, fragmentation): a wait would not help it, so `/health` reports it not ready
once a minimal request (`MINIMAL_REQUEST_BYTES`) has not fitted for longer than the deadline
(`admits_minimal`), for an orchestrator to act on.

Freed memory is given back by a thread of its own, whether or not anything is admitted later:
each time the admitted work has all finished or a request was refused, and again a second and
two seconds after (an answer's body is freed after its request's memory is released), with
nothing admitted at the time; each trim with nothing admitted measures the idle level anew.

The budget is declared (`--memory-budget-mb`, or a target's memory setting) or read from the
container's cgroup limit, else the machine's memory; of a limit read this way 90 % is used,
for what is held before a request is admitted (bodies being read).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from infinity_cloud.core.errors import MemoryExhaustedError, PayloadTooLargeError, QueueFullError

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


# The least a request takes (one short text): what `admits_minimal` asks the budget to hold.
MINIMAL_REQUEST_BYTES = 1 * MB
# Trims after the work has all finished or a request was refused, `trim_every_s` apart: an
# answer's body (and a refused request's) is freed only after its memory is released.
_TRIMS_AFTER_WAKE = 3


class _Hold:
    """One admitted request's share of the budget: since when, and how many bytes."""

    __slots__ = ("bytes", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.bytes = 0


class MemoryBudget:
    """Admission by memory, and trimming the heap when the admitted work is done.

    `limit_bytes` None: unbounded (reservations are still counted, for the metrics)."""

    def __init__(
        self,
        limit_bytes: int | None,
        resident: Callable[[], int] = resident_bytes,
        trim: Callable[[], object] = give_back_freed_memory,
        trim_every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_bytes = limit_bytes
        self._resident = resident
        self._trim = trim
        self._trim_every_s = trim_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held = 0
        self._holds: set[_Hold] = set()
        self._aside = 0  # the models' full-batch working sets (`set_aside`)
        self._largest = 0  # the most one admitted request held: what a model loaded later must leave
        # Resident memory when idle: as the models loaded (what a 413 is judged by: what an
        # idle server could hold), and as last measured with nothing admitted (what the
        # estimates of the admitted requests are added to).
        self._loaded_resident = self._idle_resident = resident()
        self._hold_s = 1.0  # how long a request holds its memory, learned: for Retry-After
        self._unfit_since: float | None = None  # since when a minimal request has not fitted
        self._last_trim = -math.inf
        self._wake = threading.Event()
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
        return max(0, self.limit_bytes - self._taken() - self._aside)

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
        """Give freed memory back now and measure the idle level anew: the models changed
        (loaded or unloaded; exports and precision checks leave hundreds of MB freed but
        resident)."""
        self._trim_now()
        with self._lock:
            if not self._holds:
                self._loaded_resident = self._idle_resident

    def set_aside(self, working_set: int) -> None:
        """Keep `working_set` bytes for a loaded model's batches (not resident between them:
        the heap is trimmed when idle); warns when the budget cannot hold it beside what the
        process already takes."""
        self._aside += working_set
        if self.limit_bytes is not None and self._resident() + self._aside > self.limit_bytes:
            log.warning(
                "the memory budget (%d MB) is less than the models take (%d MB) plus their full "
                "batches' working sets (%d MB): requests will be refused; raise --memory-budget-mb "
                "or lower --batch-tokens",
                self.limit_bytes // MB, self._resident() // MB, self._aside // MB,
            )

    @contextmanager
    def reserved(self, need: int) -> Iterator[None]:
        """Hold `need` bytes of the budget for the block, or refuse (413/429/503) at once."""
        with self.growing() as grow:
            grow(need)
            yield

    @contextmanager
    def growing(self) -> Iterator[Callable[[int], None]]:
        """A reservation that grows as the block learns what it takes (a download's bytes as
        they arrive): each `grow(n)` holds n bytes more or refuses at once, as `reserved`
        does; all of it is released at the end."""
        hold = _Hold(self._clock())  # among the admitted ones from its first byte held
        try:
            yield functools.partial(self._grow, hold)
        finally:
            self._release(hold)

    def admits_minimal(self, within_s: float) -> bool:
        """Whether a minimal request (`MINIMAL_REQUEST_BYTES`) fits now, or stopped fitting
        less than `within_s` ago (the server's readiness: past that, a wait did not help)."""
        if self.limit_bytes is None:
            return True
        with self._lock:
            self._note_fit(self._taken() + self._aside + MINIMAL_REQUEST_BYTES <= self.limit_bytes)
            unfit = self._unfit_since
        if unfit is not None:
            self._start_trimmer(wake=True)
        return unfit is None or self._clock() - unfit <= within_s

    def _taken(self) -> int:
        """What the process holds or is estimated to hold, each byte once: the larger of its
        idle level plus the admitted requests' estimates, and its resident memory now (below
        the idle level last measured, the process has shrunk since: that is its idle level)."""
        resident = self._resident()
        return max(min(self._idle_resident, resident) + self._held, resident)

    def _note_fit(self, fits: bool) -> None:
        if fits:
            self._unfit_since = None
        elif self._unfit_since is None:
            self._unfit_since = self._clock()

    def _grow(self, hold: _Hold, more: int) -> None:
        """Hold `more` bytes for `hold`, or refuse: once after giving freed memory back, when
        nothing else is admitted and the process holds more than estimated (memory a finished
        request left behind)."""
        limit = self.limit_bytes
        for last_try in (False, True):
            with self._lock:
                taken = self._taken()
                if limit is None or taken + self._aside + more <= limit:
                    self._note_fit(True)
                    self._held += more
                    hold.bytes += more
                    self._holds.add(hold)
                    self._largest = max(self._largest, hold.bytes)
                    return
                others = self._held - hold.bytes
                self._note_fit(taken + self._aside + MINIMAL_REQUEST_BYTES <= limit)
                leftover = others == 0 and self._resident() > self._idle_resident + hold.bytes
                if last_try or not leftover or not self._trim_due():
                    refusal = self._refusal(hold, more, others)
                    break
            self._trim_now()
        self._start_trimmer(wake=True)
        raise refusal

    def _refusal(self, hold: _Hold, more: int, others: int) -> Exception:
        """Why `more` bytes for `hold` do not fit, while others hold `others`: 413, 429 or 503."""
        assert self.limit_bytes is not None
        whole = hold.bytes + more
        limit, need = self.limit_bytes, math.ceil(whole / MB)
        free_when_idle = max(0, limit - self._loaded_resident - self._aside)
        if whole > free_when_idle:  # it would not fit an idle server either
            return PayloadTooLargeError(
                f"this request would take about {need} MB, and the server has {free_when_idle // MB} MB of "
                f"its {limit // MB} MB memory budget free when idle; send fewer or shorter inputs"
            )
        if others:
            wait = self._wait_for(hold, more)
            error: Exception = QueueFullError(
                f"the server's memory budget ({limit // MB} MB) is taken by requests in progress "
                f"({others // MB} MB held); this request needs about {need} MB: retry after {wait} s"
            )
        else:
            wait = max(1, math.ceil(self._trim_every_s))
            error = MemoryExhaustedError(
                f"the server holds {self._resident() // MB} MB with no other request in progress "
                f"({self._loaded_resident // MB} MB when its models loaded), which leaves less than "
                f"this request's {need} MB of its {limit // MB} MB memory budget; retry after {wait} s "
                "(it is not ready while this lasts)"
            )
        error.retry_after_s = wait  # type: ignore[attr-defined]
        return error

    def _wait_for(self, own: _Hold, more: int) -> int:
        """Seconds until enough of the memory others hold is expected back for `more` bytes
        for `own`: the admitted requests end, oldest first, after holding memory as long as
        requests have lately; at least 1 s."""
        assert self.limit_bytes is not None
        now = self._clock()
        short = self._taken() + self._aside + more - self.limit_bytes
        others = (hold for hold in self._holds if hold is not own)
        ends = sorted((max(now, hold.started + self._hold_s), hold.bytes) for hold in others)
        wait = ends[-1][0] - now if ends else 0.0
        for end, released in ends:
            short -= released
            if short <= 0:
                wait = end - now
                break
        return max(1, math.ceil(wait))

    def _release(self, hold: _Hold) -> None:
        with self._lock:
            if hold not in self._holds:  # refused at its first bytes: it held nothing
                return
            self._holds.discard(hold)
            self._held -= hold.bytes
            self._hold_s = 0.8 * self._hold_s + 0.2 * (self._clock() - hold.started)
            idle = not self._holds
        if idle:
            self._start_trimmer(wake=True)

    def _trim_due(self) -> bool:
        return self._clock() - self._last_trim >= self._trim_every_s

    def _trim_now(self) -> None:
        """Trim; with nothing admitted, what is resident after is the idle level."""
        with self._lock:
            self._last_trim = self._clock()
        self._trim()
        with self._lock:
            if not self._holds:
                self._idle_resident = self._resident()
                self._loaded_resident = min(self._loaded_resident, self._idle_resident)

    def _start_trimmer(self, wake: bool = False) -> None:
        if self._trimmer is None:
            self._trimmer = threading.Thread(target=self._trim_when_idle, name="memory-trim", daemon=True)
            self._trimmer.start()
        if wake:
            self._wake.set()

    def _trim_when_idle(self) -> None:
        """Each time the work has all finished or a request was refused: trim (off the event
        loop: trimming a large heap takes milliseconds) while nothing is admitted,
        `_TRIMS_AFTER_WAKE` times `trim_every_s` apart."""
        while True:
            self._wake.wait()
            self._wake.clear()
            for _ in range(_TRIMS_AFTER_WAKE):
                time.sleep(max(0.0, self._trim_every_s - (self._clock() - self._last_trim)))
                if self._holds:
                    break
                self._trim_now()
