"""A dialect only translates: each of its functions enters the engine at most once (its
request, as the engine's ask, to one call; the answer shaped after), and none reaches past
the engine's calls into a served model. Read from the source, so a route that starts to
decide for itself (re-checking what the engine checks, computing, calling the engine per
type or per capability) fails here, not in review. Counted through the app per request, with
its model lookups, for every route: tests/test_engine_calls_per_request.py (it serves models)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from parsed_source import parsed

DIALECTS = Path(__file__).resolve().parents[2] / "infinity_cloud" / "server" / "dialects"
# The engine's calls a route may make; `model` (a served model itself) is not one of them.
ENGINE_CALLS = {"embeddings", "chunked_embeddings", "similarity", "rerank", "classify", "by_model_type",
                "tokenize", "decode", "facts", "facts_of", "limits"}


def engine_uses(function: ast.AST) -> list[str]:
    """The engine attributes a function uses: `engine.x` or `<...>.engine.x`."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "engine") or (
                isinstance(owner, ast.Attribute) and owner.attr == "engine"
            ):
                found.append(node.attr)
    return found


def functions() -> list[tuple[str, ast.AST]]:
    out = []
    for path in sorted(DIALECTS.glob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((f"{path.stem}.{node.name}", node))
    return out


@pytest.mark.parametrize(("name", "function"), functions(), ids=lambda x: x if isinstance(x, str) else "")
def test_a_dialect_function_enters_the_engine_at_most_once(name: str, function: ast.AST) -> None:
    uses = engine_uses(function)
    assert len(uses) <= 1, f"{name} enters the engine {len(uses)} times: {uses}"
    assert set(uses) <= ENGINE_CALLS, f"{name} uses engine.{uses[0]}, which is not a call a dialect makes"


def test_the_walk_finds_routes() -> None:  # the check above is not vacuous
    uses = dict((name, engine_uses(function)) for name, function in functions())
    assert uses["openai.embeddings"] == ["embeddings"]
    assert uses["cohere.cohere_embed"] == ["embeddings"]
    assert uses["tei.similarity"] == ["similarity"]
