"""The memory budget's parts: where the limit comes from, what resident memory reads, and that
trimming the heap really gives memory back (the budget's HTTP behaviour: test_http_errors)."""

from __future__ import annotations

import gc
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from infinity_cloud.admission import memory
from infinity_cloud.admission.memory import MB, MemoryBudget, give_back_freed_memory, resident_bytes
from infinity_cloud.errors import PayloadTooLargeError, QueueFullError


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
    with pytest.raises(PayloadTooLargeError, match=r"about 60 MB.*50 MB of its 100 MB"):
        budget._reserve(60 * MB)
    with budget.reserved(30 * MB):
        assert budget.held_bytes == 30 * MB
        with pytest.raises(QueueFullError) as refused:
            budget._reserve(30 * MB)
        assert refused.value.retry_after_s == 1
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
    with pytest.raises(PayloadTooLargeError, match="20 MB of its 100 MB"):
        budget._reserve(25 * MB)
    with budget.reserved(20 * MB):
        pass
    budget.set_aside(30 * MB)  # a second model: more than the budget holds, said loudly
    assert "less than the models take (50 MB) plus their full batches' working sets (60 MB)" in caplog.text


def test_memory_taken_for_a_while_is_429_not_413() -> None:
    """Resident memory above the idle level (other requests' bodies being read, a heap not yet
    trimmed) passes: a request that fits an idle server is told to retry, not to shrink."""
    resident = {"now": 50 * MB}
    budget = MemoryBudget(100 * MB, resident=lambda: resident["now"], trim=lambda: None)
    resident["now"] = 90 * MB
    with pytest.raises(QueueFullError):
        budget._reserve(30 * MB)
    with pytest.raises(PayloadTooLargeError, match="50 MB of its 100 MB memory budget free when idle"):
        budget._reserve(60 * MB)


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
        result = await tight.embed(["still answers"] * 3)
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
