"""The memory budget's parts: where the limit comes from, what resident memory reads, that
trimming the heap really gives memory back, and how admission counts memory (each byte once) and
says why it refuses (the budget's HTTP behaviour: test_http_errors, test_memory_admission)."""

from __future__ import annotations

import gc
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from infinity_cloud.admission import memory
from infinity_cloud.admission.memory import MB, MemoryBudget, give_back_freed_memory, resident_bytes
from infinity_cloud.core.errors import MemoryExhaustedError, PayloadTooLargeError, QueueFullError
from infinity_cloud.engine.asks import EmbedAsk


def _refusal(budget: MemoryBudget, need: int) -> Exception:
    """What `budget` answers a request of `need` bytes (it must refuse)."""
    with pytest.raises(Exception) as refused, budget.reserved(need):
        pass
    return refused.value


def _vm_rss() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def test_resident_memory_is_the_kernels_figure() -> None:
    assert abs(resident_bytes() - _vm_rss()) < 16 * MB


@pytest.mark.parametrize(
    ("v2", "v1", "expected"),
    [
        ("1073741824\n", None, 1 << 30),  # a container limit (cgroup v2)
        ("max\n", None, "machine"),  # v2 without a limit: the machine's memory
        (None, "536870912\n", 1 << 29),  # cgroup v1
        (None, "9223372036854771712\n", "machine"),  # v1's "no limit"
        (None, None, "machine"),
    ],
)
def test_the_limit_is_the_containers_else_the_machines(tmp_path, monkeypatch, v2, v1, expected) -> None:
    files = []
    for name, text in (("v2", v2), ("v1", v1)):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        files.append(path)
    monkeypatch.setattr(memory, "_CGROUP_LIMITS", tuple(files))
    machine = memory.os.sysconf("SC_PHYS_PAGES") * memory.os.sysconf("SC_PAGE_SIZE")
    assert memory.detected_limit_bytes() == (machine if expected == "machine" else expected)
    assert MemoryBudget.declared(None).limit_bytes == int(memory.detected_limit_bytes() * 0.9)
    assert MemoryBudget.declared(512).limit_bytes == 512 * MB


def test_reservations_refuse_413_alone_and_429_beside_others() -> None:
    budget = MemoryBudget(100 * MB, resident=lambda: 50 * MB, trim=lambda: None)
    assert re.search(r"about 60 MB.*50 MB of its 100 MB", str(_refusal(budget, 60 * MB)))
    assert isinstance(_refusal(budget, 60 * MB), PayloadTooLargeError)
    with budget.reserved(30 * MB):
        assert budget.held_bytes == 30 * MB
        refused = _refusal(budget, 30 * MB)
        assert isinstance(refused, QueueFullError) and refused.retry_after_s >= 1
        with budget.reserved(20 * MB):  # exactly full still fits
            pass
    assert budget.held_bytes == 0
    unbounded = MemoryBudget(None, resident=lambda: 1 << 40)
    with unbounded.reserved(1 << 40):
        assert unbounded.held_bytes == 1 << 40


def test_trimming_gives_the_tokenizers_freed_memory_back(minilm_dir: Path) -> None:
    """Freed memory of the tokenizer's threads stays resident (glibc keeps it in their arenas)
    until trimmed. The normal install is on glibc: the trim must really run here."""
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    texts = [("memory that a tokenizer allocates and frees " * 200)[i:] for i in range(300)]
    before = resident_bytes()
    with ThreadPoolExecutor(2) as pool:
        encodings = list(pool.map(tokenizer.encode_batch, [texts, texts]))
    grown = resident_bytes() - before
    del encodings
    gc.collect()
    assert grown > 50 * MB, "the test did not allocate enough to see"
    assert give_back_freed_memory() is True
    assert resident_bytes() - before < grown / 3


def test_a_models_full_batches_are_set_aside(caplog) -> None:
    budget = MemoryBudget(100 * MB, resident=lambda: 50 * MB, trim=lambda: None)
    budget.set_aside(30 * MB)
    refused = _refusal(budget, 25 * MB)
    assert isinstance(refused, PayloadTooLargeError) and "20 MB of its 100 MB" in str(refused)
    with budget.reserved(20 * MB):
        pass
    budget.set_aside(30 * MB)  # a second model: more than the budget holds, said loudly
    assert "less than the models take (50 MB) plus their full batches' working sets (60 MB)" in caplog.text


def test_memory_left_behind_is_given_back_before_a_request_is_refused() -> None:
    """Resident memory above the idle level with nothing admitted is what finished requests
    left: trimmed then, and the request admitted (it used to be a 429, for as long as nothing
    was admitted: nothing ever trimmed it). A leak trimming cannot return is a 503 (nothing to
    wait for), and a request that would not fit the server as loaded is a 413 all along."""
    resident = {"now": 50 * MB}
    trims = []

    def trim() -> None:
        trims.append(resident["now"])
        resident["now"] -= resident["freed"]

    budget = MemoryBudget(100 * MB, resident=lambda: resident["now"], trim=trim, trim_every_s=0)
    resident.update(now=90 * MB, freed=40 * MB)  # 40 MB of it freed, not yet given back
    with budget.reserved(30 * MB):
        assert trims[0] == 90 * MB
    resident["freed"] = 0  # a leak (set before its size: the trimmer thread may run meanwhile)
    resident["now"] = 90 * MB
    refused = _refusal(budget, 30 * MB)
    assert isinstance(refused, MemoryExhaustedError) and refused.retry_after_s >= 1
    assert "holds 90 MB with no other request in progress (50 MB when its models loaded)" in str(refused)
    too_large = _refusal(budget, 60 * MB)
    assert isinstance(too_large, PayloadTooLargeError), too_large
    assert "50 MB of its 100 MB memory budget free when idle" in str(too_large)


def test_bytes_held_are_counted_once() -> None:
    """A download's bytes are resident as they are held: counted once (the larger of the
    estimate and resident memory), a request that fits an idle server is served whole. Adding
    the two refused it half-way, 429 after 429 (issue 50, N2)."""
    resident = {"now": 50 * MB}
    budget = MemoryBudget(100 * MB, resident=lambda: resident["now"], trim=lambda: None)
    with budget.growing() as grow:
        grow(5 * MB)  # the request's own estimate
        for _ in range(8):  # 40 MB arriving, 5 MB at a time, resident as they arrive
            grow(5 * MB)
            resident["now"] += 5 * MB
        assert budget.held_bytes == 45 * MB
    assert budget.held_bytes == 0


def test_retry_after_is_when_the_held_memory_is_expected_back() -> None:
    """A 429's Retry-After is when enough of the held memory is expected back, by how long
    requests have held memory lately, and the message names the same wait."""
    now = {"t": 0.0}
    budget = MemoryBudget(100 * MB, resident=lambda: 50 * MB, trim=lambda: None, clock=lambda: now["t"])
    for _ in range(10):  # requests that each hold memory for 10 s
        with budget.reserved(10 * MB):
            now["t"] += 10
    with budget.reserved(40 * MB):
        now["t"] += 2
        refused = _refusal(budget, 30 * MB)
    assert isinstance(refused, QueueFullError), refused
    assert 5 <= refused.retry_after_s <= 8  # learned: about 9 s of holding, 2 of them done
    assert f"retry after {refused.retry_after_s} s" in str(refused)


def test_readiness_fails_once_a_minimal_request_has_not_fitted_past_the_deadline() -> None:
    now = {"t": 0.0}
    resident = {"now": 50 * MB}
    budget = MemoryBudget(100 * MB, resident=lambda: resident["now"], trim=lambda: None,
                          clock=lambda: now["t"])
    assert budget.admits_minimal(10)
    resident["now"] = 100 * MB  # a leak: not even a minimal request fits
    assert budget.admits_minimal(10)
    now["t"] += 11
    assert not budget.admits_minimal(10)
    resident["now"] = 60 * MB
    assert budget.admits_minimal(10)


def test_a_refusal_wakes_the_trimmer_though_nothing_is_admitted() -> None:
    """Memory a finished request left behind is given back whether or not anything is
    admitted later: a refusal (here of a request too large to fit) wakes the trimmer too."""
    trimmed = threading.Event()
    budget = MemoryBudget(100 * MB, resident=lambda: 50 * MB, trim=trimmed.set, trim_every_s=0.01)
    assert isinstance(_refusal(budget, 60 * MB), PayloadTooLargeError)
    assert trimmed.wait(30), "the refusal did not wake the trimmer"


async def test_batches_are_cut_smaller_to_fit_a_small_budget(tiny_embedder, caplog) -> None:
    """A model whose full batches would not fit beside what the process holds gets smaller
    batches (said loudly), and still answers. Resident memory is pinned so the room is exact:
    (100 - 60) / 2 = 20 MB for batches."""
    from conftest import fake, spec_of

    from infinity_cloud.engine import Engine

    roomy = Engine(spec_of(fake(tiny_embedder, "emb")))
    tight = Engine(spec_of(fake(tiny_embedder, "emb")))
    tight.memory = MemoryBudget(100 * MB, resident=lambda: 60 * MB, trim=lambda: None)
    async with roomy, tight:
        full = roomy.models["emb"].working_set_bytes
        assert full > 20 * MB  # 16,384 tokens at 128, two heads: 33 MB
        assert 15 * MB < tight.models["emb"].working_set_bytes <= 20 * MB
        assert "batches cut to" in caplog.text and "--memory-budget-mb" in caplog.text
        result = await tight.embeddings(EmbedAsk(["still answers"] * 3))
        assert result.embeddings.shape[0] == 3


def test_a_tower_that_fails_after_its_backend_opened_gives_the_backend_back(
    tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warm-up (or the device's memory fit) failing leaves no backend open: its memory, a
    GPU's included, goes back with the failed load, not with the process."""
    from conftest import fake

    from infinity_cloud.backends.fake import FakeBackend
    from infinity_cloud.models import tower_builder
    from infinity_cloud.models.served_model import ServedModel

    closed: list[FakeBackend] = []
    monkeypatch.setattr(FakeBackend, "close", lambda self: closed.append(self))

    def failing(*args: object) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(tower_builder, "warm_up", failing)
    model = ServedModel(fake(tiny_embedder, "emb"))
    with pytest.raises(Exception, match="warm-up failed"):
        model.load()
    assert len(closed) == 1 and model.state == "failed"
