"""`infinity-cloud smoke TARGET`: for a user with the platform's credentials, one command that
proves a deployment end to end. It deploys the spec (or, with --deployed, takes the one
running), sends embeddings, and rerank and classify requests where a model serves them,
through the platform, compares each answer with the same spec run here (cosine >= 0.999,
the same ranking and labels), times a few calls, and deletes what it created unless --keep.
One line a step; the exit status says whether every check held.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infinity_cloud.core.capability import Capability
from infinity_cloud.core.config import DeploymentSpec
from infinity_cloud.core.errors import ConfigError
from infinity_cloud.engine.asks import ClassifyAsk, EmbedAsk, RerankAsk
from infinity_cloud.targets.base import Target
from infinity_cloud.targets.container import served_name

# Texts a deployment is checked with: a question, answers near and far, a one-letter text.
PROBES = (
    "what is a panda?",
    "The giant panda is a bear species endemic to China.",
    "Paris is the capital and largest city of France.",
    "a",
)
QUERY = PROBES[0]
MIN_COSINE = 0.999
# Scores may differ by a hardware's rounding; rankings and labels may not, save for a tie.
SCORE_TOLERANCE = 5e-3
TIMED_CALLS = 5


@dataclass
class SmokeReport:
    lines: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def run(
    target: Target[Any], spec: DeploymentSpec, out_dir: Path, *, keep: bool = False, deployed: bool = False,
    api_key: str | None = None, say: Callable[[str], None] = print,
) -> SmokeReport:
    """Deploy (unless `deployed`), check every model through the platform against a local
    run, time it, then delete what this run created (unless `keep`). `api_key`: the bearer
    key the endpoint requires, if any."""
    report = SmokeReport()
    calls = _Endpoint(target, spec, api_key)

    def step(line: str, failure: str | None = None) -> None:
        report.lines.append(line)
        say(line)
        if failure:
            report.failed.append(failure)

    created = False
    if not deployed and "deploy" not in target.verbs:  # a server started by hand (local)
        step(f"deployed: taking {target.describe(spec)}")
    elif not deployed:
        if target.exists(spec):
            raise ConfigError(
                f"{target.describe(spec)} exists already, and smoke deletes what it deploys: check it with "
                "--deployed, or give another name"
            )
        started = time.perf_counter()
        target.deploy(spec, out_dir)
        created = True
        step(f"deploy: {target.describe(spec)} in {time.perf_counter() - started:.0f} s")
    try:
        _check(calls, spec, step)
    finally:
        if created and not keep:
            target.delete(spec)
            step(f"delete: {target.describe(spec)} and what its deploy made")
        elif created:
            step(f"kept: {target.describe(spec)} (infinity-cloud delete {target.name.replace('_', '-')} ...)")
    step("smoke: every check held" if report.ok else f"smoke: FAILED ({'; '.join(report.failed)})")
    return report


@dataclass(frozen=True)
class _Endpoint:
    """The deployment's invoke, with the key it needs."""

    target: Target[Any]
    spec: DeploymentSpec
    api_key: str | None

    def invoke(self, body: dict[str, Any], route: str) -> Any:
        return self.target.invoke(self.spec, body, api_key=self.api_key, route=route)


def _check(target: _Endpoint, spec: DeploymentSpec, step: Callable[..., None]) -> None:
    from infinity_cloud.engine import Engine

    started = time.perf_counter()
    local = Engine.loaded(spec)
    try:
        expected = asyncio.run(_local_answers(local, spec))
    finally:
        local.close()
    step(f"local: {', '.join(m.name for m in spec.models)} run here for reference "
         f"in {time.perf_counter() - started:.0f} s")
    timed = None
    # An image serves a local folder under its folder's name; `serve` under the name given.
    images = "deploy" in target.target.verbs
    for model in spec.models:
        remote = served_name(model) if images else model.name
        capability, want = expected[model.name]
        if capability is Capability.EMBED:
            _embeddings(target, want, remote, step)
            timed = timed or ("embeddings", {"model": remote, "input": [PROBES[1]]})
        elif capability is Capability.RERANK:
            _rerank(target, want, remote, step)
            timed = timed or ("rerank", {"model": remote, "query": QUERY, "documents": list(PROBES[1:3])})
        elif capability is Capability.CLASSIFY:
            _classify(target, want, remote, step)
            timed = timed or ("classify", {"model": remote, "input": [PROBES[1]]})
        else:
            step(f"{capability.value}: {remote} not checked by smoke (embeddings, rerank and classify are)")
    if timed is not None:
        route, body = timed
        seconds = []
        for _ in range(TIMED_CALLS):
            began = time.perf_counter()
            target.invoke(body, route)
            seconds.append(time.perf_counter() - began)
        step(f"latency: {route} of one text, {TIMED_CALLS} calls through the platform: p50 "
             f"{statistics.median(seconds) * 1000:.0f} ms, max {max(seconds) * 1000:.0f} ms")


async def _local_answers(local: Any, spec: DeploymentSpec) -> dict[str, tuple[Capability, Any]]:
    """Each model's capability and its answer to the probes, here."""
    answers: dict[str, tuple[Capability, Any]] = {}
    for model in spec.models:
        capability = local.model(model.name).loaded.info.capability
        if capability is Capability.EMBED:
            answer: Any = (await local.embeddings(EmbedAsk(list(PROBES), model.name))).embeddings
        elif capability is Capability.RERANK:
            ranked = await local.rerank(RerankAsk(QUERY, list(PROBES[1:]), model.name))
            answer = [(r.index, r.score) for r in ranked.results]
        elif capability is Capability.CLASSIFY:
            labels = (await local.classify(ClassifyAsk(list(PROBES), model.name))).labels
            answer = [row[0][0] for row in labels]
        else:
            answer = None
        answers[model.name] = (capability, answer)
    return answers


def _embeddings(target: _Endpoint, want: np.ndarray, remote: str,
                step: Callable[..., None]) -> None:
    started = time.perf_counter()
    answer = target.invoke({"model": remote, "input": list(PROBES)}, "embeddings")
    elapsed = time.perf_counter() - started
    rows = sorted(answer["data"], key=lambda r: r["index"])
    got = np.array([row["embedding"] for row in rows], dtype=np.float64)
    want = want.astype(np.float64)
    if got.shape != want.shape:
        step(f"embeddings: {remote} answered {got.shape}, here {want.shape}", f"{remote}: embedding shape")
        return
    cosines = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    worst = float(cosines.min())
    failure = None if worst >= MIN_COSINE else f"{remote}: embeddings' cosine {worst:.5f} < {MIN_COSINE}"
    step(f"embeddings: {remote}, {len(PROBES)} texts, worst cosine to the local run {worst:.5f} "
         f"({'ok' if failure is None else 'FAILED'}), {elapsed * 1000:.0f} ms", failure)


def _rerank(target: _Endpoint, want: list[tuple[int, float]], remote: str,
            step: Callable[..., None]) -> None:
    documents = list(PROBES[1:])
    started = time.perf_counter()
    answer = target.invoke({"model": remote, "query": QUERY, "documents": documents}, "rerank")
    elapsed = time.perf_counter() - started
    got = [(r["index"], r["relevance_score"]) for r in answer["results"]]
    scores = dict(want)
    same_order = [i for i, _ in got] == [i for i, _ in want]
    close = len(got) == len(want) and all(abs(s - scores.get(i, np.inf)) <= SCORE_TOLERANCE for i, s in got)
    failure = None if same_order and close else f"{remote}: ranking differs from the local run"
    order = "the same ranking" if same_order else "ANOTHER ranking"
    step(f"rerank: {remote}, {len(documents)} documents, {order} {[i for i, _ in got]}, scores within "
         f"{SCORE_TOLERANCE} {'yes' if close else 'NO'}, {elapsed * 1000:.0f} ms", failure)


def _classify(target: _Endpoint, want: list[str], remote: str,
              step: Callable[..., None]) -> None:
    started = time.perf_counter()
    answer = target.invoke({"model": remote, "input": list(PROBES)}, "classify")
    elapsed = time.perf_counter() - started
    got = [row[0]["label"] for row in answer["data"]]
    failure = None if got == want else f"{remote}: labels differ from the local run"
    step(f"classify: {remote}, {len(PROBES)} texts, top labels {'the same' if failure is None else 'DIFFER'} "
         f"({', '.join(got)}), {elapsed * 1000:.0f} ms", failure)
