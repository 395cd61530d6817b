"""A capability written outside the package (a test task) runs on the engine's batching and
backend unchanged; the maths of each capability is tests/unit/test_tasks.py."""

from __future__ import annotations

import numpy as np


async def test_a_new_task_runs_through_the_engine_unchanged(tiny_embedder) -> None:
    """A task written here (texts -> the length and norm of each embedding) runs on the
    same batching and backend as the built-in ones: nothing else needs to know of it."""
    from dataclasses import dataclass

    from conftest import fake

    from infinity_cloud import EmbedAsk, Engine
    from infinity_cloud.core.capability import Capability
    from infinity_cloud.tasks.base import Task
    from infinity_cloud.tasks.embed import EmbedTask

    @dataclass(frozen=True)
    class NormsCall:
        texts: list[str]

    class Norms(Task):
        capability = Capability.EMBED
        head = EmbedTask.head

        def encode(self, call, served, limits):
            return served.loaded.tokenizer.encode(call.texts)

        def finish(self, rows, call, served, encodings):
            return [(len(e), float(np.linalg.norm(row))) for e, row in zip(encodings, rows, strict=True)]

    texts = ["hello world", "a somewhat longer text than that"]
    async with Engine(fake(tiny_embedder, "emb", normalize=False)) as engine:
        got = await engine.run_task(Norms(), NormsCall(texts))
        want = (await engine.embeddings(EmbedAsk(texts))).embeddings
        lengths = [len(e) for e in engine.model().loaded.tokenizer.encode(texts)]
    assert [n for n, _ in got] == lengths
    np.testing.assert_allclose([norm for _, norm in got], np.linalg.norm(want, axis=1), rtol=1e-6)


# -- fidelity: the precision check's measure ---------------------------------------------------
