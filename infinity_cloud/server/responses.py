"""Engine results to the response shapes clients expect (OpenAI, Infinity, Jina, Cohere)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import numpy as np

from infinity_cloud.results import (
    ClassifyResult,
    EmbeddingResult,
    MultiVectorResult,
    RerankResult,
    SparseEmbeddingResult,
)
from infinity_cloud.server.encoding import vector_base64


def _envelope(kind: str, model: str, tokens: int) -> dict[str, Any]:
    return {
        "object": kind,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "id": f"infinity-{uuid.uuid4()}",
        "created": int(time.time()),
    }


def embeddings_body(
    result: EmbeddingResult, vectors: np.ndarray, encoding_format: Literal["float", "base64"]
) -> dict[str, Any]:
    """OpenAI's shape; `vectors` are the result's, maybe quantised (then `base64` holds their
    own bytes: int8, uint8, or packed bits)."""
    if encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": vector_base64(v)}
                for i, v in enumerate(vectors)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {**_envelope("list", result.model, result.prompt_tokens), "data": data}


def multi_vector_body(
    result: MultiVectorResult, encoding_format: Literal["float", "base64"]
) -> dict[str, Any]:
    """Per input a list of vectors; with base64 the row-major float32 matrix, and its `shape`."""
    data: list[dict[str, Any]] = []
    for i, matrix in enumerate(result.embeddings):
        item: dict[str, Any] = {"object": "embedding", "index": i}
        if encoding_format == "base64":
            item.update(embedding=vector_base64(matrix), shape=list(matrix.shape))
        else:
            item["embedding"] = matrix
        data.append(item)
    return {**_envelope("list", result.model, result.prompt_tokens), "data": data}


def sparse_embeddings_body(result: SparseEmbeddingResult) -> dict[str, Any]:
    """OpenAI's envelope, each embedding `{"indices": [...], "values": [...]}` (ids ascending)."""
    data = [
        {"object": "embedding", "index": i, "embedding": {"indices": v.indices, "values": v.values}}
        for i, v in enumerate(result.embeddings)
    ]
    return {**_envelope("list", result.model, result.prompt_tokens), "data": data}


def rerank_body(
    result: RerankResult,
    documents: list[str],
    style: Literal["infinity", "jina", "cohere", "voyage"],
    return_documents: bool,
) -> dict[str, Any]:
    """Infinity: `document` a string or null. Jina (/v1) always and Cohere v2 on request:
    `document: {"text": ...}`; both carry Cohere's `meta` so either SDK parses the answer.
    Voyage: a `data` list, `document` a string on request, `usage.total_tokens`."""
    if style == "voyage":
        data = [{"index": r.index, "relevance_score": r.score,
                 **({"document": documents[r.index]} if return_documents else {})} for r in result.results]
        return {"object": "list", "data": data, "model": result.model,
                "usage": {"total_tokens": result.prompt_tokens}}
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


def cohere_embed_body(
    result: EmbeddingResult, texts: list[str], by_type: dict[str, np.ndarray] | None, version: int
) -> dict[str, Any]:
    """Cohere's shapes: v1 without `embedding_types` gives a bare float list
    (`embeddings_floats`); otherwise `embeddings` maps each asked type to its vectors."""
    body: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "texts": texts,
        "meta": {"api_version": {"version": str(version)},
                 "billed_units": {"input_tokens": result.prompt_tokens}},
    }
    if version == 1 and by_type is None:
        return {**body, "response_type": "embeddings_floats", "embeddings": result.embeddings}
    by_type = by_type or {"float": result.embeddings}
    return {**body, "response_type": "embeddings_by_type", "embeddings": by_type}


def label_rows(result: ClassifyResult) -> list[list[dict[str, Any]]]:
    """Per input, its labels best first as {label, score}: Infinity's and TEI's row shape."""
    return [[{"label": label, "score": score} for label, score in row] for row in result.labels]


def classify_body(result: ClassifyResult) -> dict[str, Any]:
    return {**_envelope("classify", result.model, result.prompt_tokens), "data": label_rows(result)}
