"""Engine results to the response shapes clients expect (OpenAI, Infinity, Jina, Cohere)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from infinity_cloud.results import ClassifyResult, EmbeddingResult, RerankResult
from infinity_cloud.server.encoding import vector_base64


def _envelope(kind: str, model: str, tokens: int) -> dict[str, Any]:
    return {
        "object": kind,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "id": f"infinity-{uuid.uuid4()}",
        "created": int(time.time()),
    }


def embeddings_body(result: EmbeddingResult, encoding_format: Literal["float", "base64"]) -> dict[str, Any]:
    vectors = result.embeddings
    if encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": vector_base64(v)}
                for i, v in enumerate(vectors)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {**_envelope("list", result.model, result.prompt_tokens), "data": data}


def rerank_body(
    result: RerankResult,
    documents: list[str],
    style: Literal["infinity", "jina", "cohere"],
    return_documents: bool,
) -> dict[str, Any]:
    """Infinity: `document` a string or null. Jina (/v1) always and Cohere v2 on request:
    `document: {"text": ...}`; both carry Cohere's `meta` so either SDK parses the answer."""
    results = []
    for ranked in result.results:
        entry: dict[str, Any] = {"index": ranked.index, "relevance_score": ranked.score}
        text = documents[ranked.index]
        if style == "infinity":
            entry["document"] = text if return_documents else None
        elif style == "jina" or return_documents:
            entry["document"] = {"text": text}
        results.append(entry)
    body = {**_envelope("rerank", result.model, result.prompt_tokens), "results": results}
    if style != "infinity":
        body["meta"] = {
            "api_version": {"version": "2" if style == "cohere" else "1"},
            "billed_units": {"search_units": 1, "input_tokens": result.prompt_tokens},
        }
    return body


def classify_body(result: ClassifyResult) -> dict[str, Any]:
    data = [[{"label": label, "score": score} for label, score in row] for row in result.labels]
    return {**_envelope("classify", result.model, result.prompt_tokens), "data": data}
